// The process supervisor on its own: pipes, line delivery, exit reports.
#include "cli/supervisor.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "test_process.h"

namespace kolo::cli {
namespace {

using namespace std::chrono_literals;

TEST(Supervisor, DeliversLinesThenTheExit) {
  auto sup = Supervisor::create();
  ASSERT_TRUE(sup.isOk()) << sup.status().toString();
  std::vector<std::string> events;
  SpawnSpec spec;
  spec.name = "t";
  spec.argv = {"sh", "-c", "echo one; echo two >&2; printf \"three $KOLO_X\"; exit 4"};
  spec.env = {{"KOLO_X", "x"}};
  spec.on_stdout = [&](std::string_view l) { events.push_back("out:" + std::string(l)); };
  spec.on_stderr = [&](std::string_view l) { events.push_back("err:" + std::string(l)); };
  std::optional<ExitInfo> exit;
  spec.on_exit = [&](const ExitInfo& e) {
    events.push_back("exit");
    exit = e;
  };
  auto id = (*sup)->spawn(std::move(spec));
  ASSERT_TRUE(id.isOk());
  ASSERT_TRUE((*sup)->pumpUntil([&] { return exit.has_value(); }, Clock::now() + 30s));
  (*sup)->drainOutput({*id}, Clock::now() + 5s);
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 4);
  EXPECT_EQ(exit->shellCode(), 4);
  EXPECT_EQ(exit->describe(), "exited with code 4");
  // The partial last line comes before the exit report.
  std::vector<std::string> out_lines;
  for (auto& e : events) {
    if (e.rfind("out:", 0) == 0 || e == "exit") out_lines.push_back(e);
  }
  EXPECT_EQ(out_lines, (std::vector<std::string>{"out:one", "out:three x", "exit"}));
  EXPECT_NE(std::find(events.begin(), events.end(), "err:two"), events.end());
}

TEST(Supervisor, MissingProgramExits127WithTheReason) {
  auto sup = Supervisor::create();
  ASSERT_TRUE(sup.isOk());
  std::optional<ExitInfo> exit;
  SpawnSpec spec;
  spec.name = "missing";
  spec.argv = {"/no/such/program"};
  spec.on_exit = [&](const ExitInfo& e) { exit = e; };
  ASSERT_TRUE((*sup)->spawn(std::move(spec)).isOk());
  ASSERT_TRUE(exit.has_value());  // reported at once
  EXPECT_EQ(exit->code, 127);
  EXPECT_EQ(exit->exec_errno, ENOENT);
  EXPECT_NE(exit->describe().find("No such file"), std::string::npos);
}

TEST(Supervisor, SignalsReachTheWholeGroup) {
  auto sup = Supervisor::create();
  ASSERT_TRUE(sup.isOk());
  std::optional<ExitInfo> exit;
  bool up = false;
  pid_t grandchild = -1;
  SpawnSpec spec;
  spec.name = "group";
  // The shell waits on a child; SIGTERM to the group ends both.
  spec.argv = {"sh", "-c", "sleep 1000 & echo up $!; wait"};
  spec.on_stdout = [&](std::string_view l) {
    if (l.rfind("up ", 0) == 0) {
      grandchild = std::stoi(std::string(l.substr(3)));
      up = true;
    }
  };
  spec.on_exit = [&](const ExitInfo& e) { exit = e; };
  auto id = (*sup)->spawn(std::move(spec));
  ASSERT_TRUE(id.isOk());
  ASSERT_TRUE((*sup)->pumpUntil([&] { return up; }, Clock::now() + 30s));
  (*sup)->signalGroup(*id, SIGTERM);
  ASSERT_TRUE((*sup)->pumpUntil([&] { return exit.has_value(); }, Clock::now() + 10s));
  EXPECT_FALSE(exit->exited);
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_EQ(exit->shellCode(), 128 + SIGTERM);
  EXPECT_EQ(exit->describe(), "was killed by signal SIGTERM");
  // The background sleep (in the same group) is gone too.
  EXPECT_TRUE(clitest::waitProcessGone(grandchild, 10s));
  (*sup)->drainOutput({*id}, Clock::now() + 10s);
  EXPECT_EQ((*sup)->runningCount(), 0);
}

TEST(Supervisor, SignalNames) {
  EXPECT_EQ(signalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(signalName(SIGSEGV), "SIGSEGV");
}

}  // namespace
}  // namespace kolo::cli
