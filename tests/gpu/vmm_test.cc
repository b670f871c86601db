// Device arenas across processes: the agent side (this process) allocates a
// VMM arena, exports it as a POSIX fd and sends it with SCM_RIGHTS to a
// trainer-like peer process (kolo_gpu_test_peer), which imports and maps it.
// Ordering goes through an interprocess event on the device only: the
// agent's writes sit behind a long kernel on its stream, and the peer's copy
// must still see them (the peer starts waiting long before they are done). A peer that dies with the arena mapped leaves no
// device memory behind once the agent drops the arena.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "agent/gpu/device.h"
#include "agent/gpu/vmm_arena.h"
#include "tests/gpu/fd_pass.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/vmm_protocol.h"

namespace kolo::gpu::testing {
namespace {

using namespace std::chrono_literals;

// The peer binary: $KOLO_GPU_TEST_PEER, else next to this test binary (so a
// build tree copied to a GPU machine works), else the build-time path.
std::string peerPath() {
  if (const char* env = std::getenv("KOLO_GPU_TEST_PEER"); env != nullptr && env[0] != '\0') return env;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string next = dir + "/kolo_gpu_test_peer";
    if (::access(next.c_str(), X_OK) == 0) return next;
  }
  return KOLO_GPU_TEST_PEER;
}

// The peer process; killed and reaped on destruction if still running.
class Peer {
 public:
  static StatusOr<std::unique_ptr<Peer>> spawn() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return errnoStatus("socketpair", errno);
    auto p = std::unique_ptr<Peer>(new Peer());
    p->sock_.reset(sv[0]);
    UniqueFd child_end(sv[1]);
    (void)::fcntl(sv[0], F_SETFD, FD_CLOEXEC);
    const std::string arg = std::to_string(sv[1]);
    const std::string path = peerPath();
    p->pid_ = ::fork();
    if (p->pid_ < 0) return errnoStatus("fork", errno);
    if (p->pid_ == 0) {
      ::execl(path.c_str(), path.c_str(), arg.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return p;
  }
  ~Peer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      (void)::waitpid(pid_, nullptr, 0);
    }
  }
  int sock() const { return sock_.get(); }
  // Exit status (as waitpid's) within `timeout`, or TimedOut.
  StatusOr<int> wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return st;
      }
      if (std::chrono::steady_clock::now() >= deadline) return timedOut("peer still running");
      std::this_thread::sleep_for(5ms);  // polling a child's exit, not synchronising
    }
  }

 private:
  Peer() = default;
  UniqueFd sock_;
  pid_t pid_ = -1;
};

TEST(VmmArena, PeerProcessSeesTheAgentsWritesOrderedByAnInterprocessEvent) {
  KOLO_REQUIRE_GPU();
  KOLO_ASSERT_OK(setDevice(0));
  auto arena = DeviceArena::create(0, 8 << 20);
  if (!arena.isOk() && arena.status().message().rfind("not viable", 0) == 0)
    GTEST_SKIP() << arena.status().message();
  ASSERT_TRUE(arena.isOk()) << arena.status().toString();
  const size_t bytes = (*arena)->size();
  const size_t half = bytes / 2;
  ASSERT_GE(bytes, size_t{8} << 20);
  KOLO_ASSERT_CUDA(cudaMemset((*arena)->data(), 0, bytes));
  KOLO_ASSERT_CUDA(cudaDeviceSynchronize());

  auto stream = Stream::create();
  auto ready = InterprocessEvent::create();
  ASSERT_TRUE(stream.isOk() && ready.isOk());
  // The agent's writes, behind ~1.5 s of other work (longer than the peer
  // takes to start and import), then the event.
  launchBusy(stream->get(), 3'000'000'000ull);
  KOLO_ASSERT_CUDA(cudaMemsetAsync((*arena)->data(), 0x3C, half, stream->get()));
  KOLO_ASSERT_OK(ready->record(stream->get()));

  auto peer = Peer::spawn();
  ASSERT_TRUE(peer.isOk()) << peer.status().toString();
  auto fd = (*arena)->exportFd();
  ASSERT_TRUE(fd.isOk()) << fd.status().toString();
  auto handle = ready->exportHandle();
  ASSERT_TRUE(handle.isOk()) << handle.status().toString();
  ArenaOffer offer = {PeerMode::kCopyAfterEvent, 0, bytes, *handle};
  KOLO_ASSERT_OK(sendWithFd((*peer)->sock(), &offer, sizeof(offer), fd->get()));

  PeerReply reply = {};
  KOLO_ASSERT_OK(recvWithFd((*peer)->sock(), &reply, sizeof(reply), nullptr, 60s));
  ASSERT_EQ(reply.ok, 1) << reply.error;
  auto st = (*peer)->wait(30s);
  ASSERT_TRUE(st.isOk());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);

  std::vector<unsigned char> got(half);
  KOLO_ASSERT_CUDA(cudaMemcpy(got.data(), static_cast<char*>((*arena)->data()) + half, half,
                              cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (unsigned char c : got) wrong += c != 0x3C;
  EXPECT_EQ(wrong, 0u) << "the peer's copy ran before the agent's writes were done";
}

TEST(VmmArena, APeerThatDiesWithTheArenaMappedLeavesNoDeviceMemoryBehind) {
  KOLO_REQUIRE_GPU();
  KOLO_ASSERT_OK(setDevice(0));
  size_t free_before = 0, total = 0;
  KOLO_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  {
    auto arena = DeviceArena::create(0, 256 << 20);
    if (!arena.isOk() && arena.status().message().rfind("not viable", 0) == 0)
      GTEST_SKIP() << arena.status().message();
    ASSERT_TRUE(arena.isOk()) << arena.status().toString();
    auto peer = Peer::spawn();
    ASSERT_TRUE(peer.isOk()) << peer.status().toString();
    auto fd = (*arena)->exportFd();
    ASSERT_TRUE(fd.isOk()) << fd.status().toString();
    ArenaOffer offer = {PeerMode::kDieMapped, 0, (*arena)->size(), {}};
    KOLO_ASSERT_OK(sendWithFd((*peer)->sock(), &offer, sizeof(offer), fd->get()));
    PeerReply reply = {};
    KOLO_ASSERT_OK(recvWithFd((*peer)->sock(), &reply, sizeof(reply), nullptr, 60s));
    ASSERT_EQ(reply.ok, 1) << reply.error;
    auto st = (*peer)->wait(30s);
    ASSERT_TRUE(st.isOk());
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 3);
    size_t free_mapped = 0;
    KOLO_ASSERT_CUDA(cudaMemGetInfo(&free_mapped, &total));
    EXPECT_LE(free_mapped + (200 << 20), free_before) << "the arena should be resident while held";
  }  // the agent drops the arena (and its exported fd)
  size_t free_after = 0;
  KOLO_ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
  EXPECT_GE(free_after + (16 << 20), free_before)
      << "device memory leaked: " << (free_before - free_after) / (1 << 20) << " MiB";
}

TEST(VmmArena, ImportRefusesASizeThatIsNotAGranule) {
  KOLO_REQUIRE_GPU();
  auto imported = ImportedDeviceArena::import(0, 12345, 0);
  ASSERT_FALSE(imported.isOk());
  EXPECT_EQ(imported.status().code(), Code::kInvalidArgument);
  EXPECT_NE(imported.status().message().find("is not a positive multiple of the granularity"),
            std::string::npos)
      << imported.status().toString();
}

}  // namespace
}  // namespace kolo::gpu::testing
