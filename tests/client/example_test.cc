// Runs the documented example programs (examples/c/ and examples/cpp/) as separate
// processes linked against the real libkolo.so, with the FakeAgent of this
// process on the other end of the socket.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fake_agent.h"
#include "test_env.h"

extern char** environ;

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;

// A child process that is always reaped, and killed if still running.
class Child {
 public:
  Child() = default;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  bool spawn(const std::string& program, const std::vector<std::string>& env,
             const std::string& output) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> argv = {const_cast<char*>(program.c_str()), nullptr};
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int rc = posix_spawn(&pid_, program.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      return false;
    }
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    return pidfd_ >= 0;
  }
  // The exit status, or -1 if it did not exit within `timeout` (then killed).
  int wait(std::chrono::milliseconds timeout) {
    pollfd p{pidfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
};

void runExample(const std::string& program) {
  FakeAgent agent;  // echo: one rank, so every reduction returns its input
  ASSERT_TRUE(agent.ok());
  TempDir dir;
  ASSERT_TRUE(dir.valid());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("KOLO_", 0) != 0) env.emplace_back(*e);
  }
  for (std::string kv : {"KOLO_JOB_ID=job-example", "KOLO_JOB_TOKEN=t", "KOLO_SIZE=1",
                         "KOLO_LOCAL_RANK=0", "KOLO_LOCAL_SIZE=1", "KOLO_START_TIMEOUT=10",
                         "KOLO_OP_TIMEOUT=20"}) {
    env.push_back(kv);
  }
  env.push_back("KOLO_AGENT_SOCKET=" + agent.socketPath());
  std::string out_path = dir.path() + "/output.txt";
  Child child;
  ASSERT_TRUE(child.spawn(program, env, out_path)) << program;
  int code = child.wait(30s);
  std::ifstream in(out_path);
  std::stringstream out;
  out << in.rdbuf();
  EXPECT_EQ(code, 0) << out.str();
  EXPECT_NE(out.str().find("rank 0 of 1: ok"), std::string::npos) << out.str();
  EXPECT_TRUE(agent.waitForGoodbye(10s));
  EXPECT_GE(agent.submissions().size(), 2u);
}

TEST(Examples, CppExampleRunsAgainstAnAgent) { runExample(KOLO_CLIENT_EXAMPLE_CPP); }
TEST(Examples, CExampleRunsAgainstAnAgent) { runExample(KOLO_CLIENT_EXAMPLE_C); }

}  // namespace
}  // namespace kolo::testing
