// gpu::probeMps against real unix sockets named `control` (no GPU, no MPS
// daemon needed): what the agent reports as `kolo status`'s MPS state.
#include "agent/gpu/mps_probe.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "common/fd.h"

namespace kolo::gpu {
namespace {

class MpsProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kolo-mps-probe-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::unlink((dir_ + "/control").c_str());
    ::rmdir(dir_.c_str());
  }
  // A unix socket bound at dir_/control; listening unless `listen` is false.
  UniqueFd bindControl(bool listen, int backlog = 16) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_TRUE(fd.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = dir_ + "/control";
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0)
        << std::strerror(errno);
    if (listen) {
      EXPECT_EQ(::listen(fd.get(), backlog), 0);
    }
    return fd;
  }
  std::string dir_;
};

TEST_F(MpsProbeTest, ListeningControlSocketIsUp) {
  UniqueFd l = bindControl(true);
  MpsProbe p = probeMps(dir_);
  EXPECT_EQ(p.state, MpsState::kUp) << p.reason;
  EXPECT_STREQ(mpsStateName(p.state), "up");
  EXPECT_EQ(p.pipe_dir, dir_);
  EXPECT_EQ(p.reason, "");
  // Probed again and again (the agent re-probes every few seconds) without
  // anyone accepting: the backlog holds them until it is full.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(probeMps(dir_).state, MpsState::kUp);
}

// A daemon that stopped accepting (its backlog full): the probe gives up
// after its deadline and says unknown rather than blocking the agent.
TEST_F(MpsProbeTest, FullBacklogIsUnknownAfterTheDeadline) {
  UniqueFd l = bindControl(true, 0);
  MpsProbe p;
  int up = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) {
    p = probeMps(dir_, std::chrono::milliseconds(50));
    if (p.state != MpsState::kUp) break;
    ++up;
  }
  EXPECT_GE(up, 1);
  EXPECT_EQ(p.state, MpsState::kUnknown) << p.reason;
  EXPECT_EQ(p.reason, "the control socket in " + dir_ + " did not accept within 50 ms");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(MpsProbeTest, SocketFileWithNothingListeningIsDownConnectRefused) {
  {
    UniqueFd bound = bindControl(false);  // bound, never listening
    MpsProbe p = probeMps(dir_);
    EXPECT_EQ(p.state, MpsState::kDown);
    EXPECT_NE(p.reason.find("connect refused on " + dir_ + "/control"), std::string::npos)
        << p.reason;
  }
  // The daemon died and left its socket behind.
  MpsProbe p = probeMps(dir_);
  EXPECT_EQ(p.state, MpsState::kDown);
  EXPECT_NE(p.reason.find("connect refused"), std::string::npos) << p.reason;
}

TEST_F(MpsProbeTest, ListenerClosedIsDown) {
  { UniqueFd l = bindControl(true); }
  EXPECT_EQ(probeMps(dir_).state, MpsState::kDown);
}

TEST_F(MpsProbeTest, DirectoryWithoutControlSocketIsDown) {
  MpsProbe p = probeMps(dir_);
  EXPECT_EQ(p.state, MpsState::kDown);
  EXPECT_EQ(p.reason, "no control socket in " + dir_);
}

TEST_F(MpsProbeTest, RegularFileNamedControlIsDown) {
  UniqueFd f(::open((dir_ + "/control").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  ASSERT_TRUE(f.valid());
  MpsProbe p = probeMps(dir_);
  EXPECT_EQ(p.state, MpsState::kDown);
  EXPECT_EQ(p.reason, dir_ + "/control is not a socket");
}

TEST_F(MpsProbeTest, MissingDirectoryIsDown) {
  const std::string missing = dir_ + "/absent";
  MpsProbe p = probeMps(missing);
  EXPECT_EQ(p.state, MpsState::kDown);
  EXPECT_STREQ(mpsStateName(p.state), "down");
  EXPECT_EQ(p.pipe_dir, missing);
  EXPECT_EQ(p.reason, "no pipe directory " + missing);
}

TEST(MpsPipeDirectory, EnvironmentElseTmpNvidiaMps) {
  const char* old = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/kolo-mps", 1);
  EXPECT_EQ(defaultMpsPipeDirectory(), "/run/kolo-mps");
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", "", 1);
  EXPECT_EQ(defaultMpsPipeDirectory(), "/tmp/nvidia-mps");
  ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(defaultMpsPipeDirectory(), "/tmp/nvidia-mps");
  if (old != nullptr) ::setenv("CUDA_MPS_PIPE_DIRECTORY", saved.c_str(), 1);
}

}  // namespace
}  // namespace kolo::gpu
