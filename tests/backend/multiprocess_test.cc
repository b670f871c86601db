// Backends in separate processes (kolo_backend_test_peer), meeting through a
// FileKvStore in a temporary directory: allreduce results, and the fault
// cases: a peer SIGKILLed or SIGSTOPped in the middle of a stream of
// allreduces; the others must fail with PeerFailure within timeout + 2 s.
// Children are killed and reaped, and the directory removed, even when a
// check fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/backends/backend.h"
#include "common/fd.h"

extern char** environ;

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class Peers {
 public:
  Peers() {
    char tmpl[] = "/tmp/kolo-backend-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) dir_ = tmpl;
  }
  ~Peers() {
    for (auto& c : children_) {
      if (!c.reaped) {
        ::kill(c.pid, SIGKILL);
        int st;
        ::waitpid(c.pid, &st, 0);
      }
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  const std::string& dir() const { return dir_; }

  // Starts one peer with stdout+stderr on a pipe; returns false on failure.
  bool spawn(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    UniqueFd rd(fds[0]), wr(fds[1]);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);
    posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return false;
    Child c;
    c.pid = pid;
    c.out_fd = std::move(rd);
    children_.push_back(std::move(c));
    return true;
  }

  pid_t pid(int i) const { return children_[i].pid; }
  const std::string& output(int i) const { return children_[i].out; }

  // Reads child i's output until it contains `needle` (true) or the deadline / EOF passes.
  bool waitFor(int i, const std::string& needle, Clock::time_point deadline) {
    Child& c = children_[i];
    while (c.out.find(needle) == std::string::npos) {
      if (c.eof || !readSome(c, deadline)) return c.out.find(needle) != std::string::npos;
    }
    return true;
  }

  // Waits until child i exits (its output reaches EOF) and reaps it; false at the deadline.
  bool waitExit(int i, Clock::time_point deadline, int* exit_code) {
    Child& c = children_[i];
    while (!c.eof) {
      if (!readSome(c, deadline)) return false;
    }
    int st = 0;
    if (::waitpid(c.pid, &st, 0) != c.pid) return false;
    c.reaped = true;
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }

 private:
  struct Child {
    pid_t pid = -1;
    UniqueFd out_fd;
    std::string out;
    bool eof = false;
    bool reaped = false;
  };

  // One poll+read; false once the deadline has passed with nothing to read.
  static bool readSome(Child& c, Clock::time_point deadline) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{c.out_fd.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc <= 0) return rc < 0 && errno == EINTR;
    char buf[4096];
    ssize_t n = ::read(c.out_fd.get(), buf, sizeof buf);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) return true;
      c.eof = true;
      return true;
    }
    c.out.append(buf, static_cast<size_t>(n));
    return true;
  }

  std::string dir_;
  std::vector<Child> children_;
};

class MultiProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  bool start(Peers& peers, int size, const char* scenario, int timeout_ms) {
    for (int r = 0; r < size; ++r) {
      if (!peers.spawn({KOLO_BACKEND_TEST_PEER, GetParam(), peers.dir(), std::to_string(r),
                        std::to_string(size), scenario, std::to_string(timeout_ms)})) {
        return false;
      }
    }
    return true;
  }

  // One peer is stopped by `signal` during a stream of allreduces; the
  // others must report PeerFailure within 2 x timeout + 2 s. Not timeout +
  // 2 s: the deadline counts time without progress, and a rank whose live
  // neighbour still drains the bytes it sent (that neighbour waiting on the
  // stopped peer itself) makes progress until that neighbour gives up, up to
  // one timeout after the stop (seen: 1 run in 6 past timeout + 2 s, idle).
  void faultCase(int signal) {
    constexpr int kSize = 3;
    constexpr int kVictim = 1;
    constexpr int kTimeoutMs = 2000;
    Peers peers;
    ASSERT_FALSE(peers.dir().empty());
    ASSERT_TRUE(start(peers, kSize, "loop", kTimeoutMs));
    ASSERT_TRUE(peers.waitFor(kVictim, "iter 3\n", Clock::now() + 60s)) << peers.output(kVictim);
    ASSERT_EQ(::kill(peers.pid(kVictim), signal), 0);
    const auto t0 = Clock::now();
    const auto bound = t0 + 2 * std::chrono::milliseconds(kTimeoutMs) + 2s;
    for (int r = 0; r < kSize; ++r) {
      if (r == kVictim) continue;
      EXPECT_TRUE(peers.waitFor(r, "RESULT", bound))
          << "rank " << r << " did not fail within 2 x timeout + 2 s:\n"
          << peers.output(r);
      int code = -1;
      ASSERT_TRUE(peers.waitExit(r, Clock::now() + 10s, &code)) << peers.output(r);
      EXPECT_EQ(code, 2) << "rank " << r << ":\n" << peers.output(r);
      EXPECT_NE(peers.output(r).find("RESULT PEER_FAILURE: agent rank"), std::string::npos)
          << peers.output(r);
      EXPECT_NE(peers.output(r).find("unreachable"), std::string::npos) << peers.output(r);
    }
  }
};

TEST_P(MultiProcessTest, AllreduceMatchesTheReference) {
  constexpr int kSize = 3;
  Peers peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(start(peers, kSize, "check", 20000));
  for (int r = 0; r < kSize; ++r) {
    int code = -1;
    ASSERT_TRUE(peers.waitExit(r, Clock::now() + 60s, &code)) << "rank " << r << ":\n"
                                                              << peers.output(r);
    EXPECT_EQ(code, 0) << "rank " << r << ":\n" << peers.output(r);
    EXPECT_NE(peers.output(r).find("OK"), std::string::npos) << peers.output(r);
  }
}

TEST_P(MultiProcessTest, SigkilledPeerFailsTheOthersWithinTheTimeout) { faultCase(SIGKILL); }

TEST_P(MultiProcessTest, SigstoppedPeerFailsTheOthersWithinTheTimeout) { faultCase(SIGSTOP); }

INSTANTIATE_TEST_SUITE_P(Backends, MultiProcessTest, ::testing::ValuesIn(compiledBackends()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiProcessTest);

}  // namespace
}  // namespace kolo
