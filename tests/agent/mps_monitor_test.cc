// MpsMonitor: the agent's cached MPS state and its kolo_mps_up gauge follow
// a real `control` socket as it comes and goes (re-probed on its thread).
#include "agent/core/mps_monitor.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common/fd.h"

namespace kolo {
namespace {

using namespace std::chrono_literals;

// Waits (bounded) until the snapshot's state is `want`.
MpsMonitor::Snapshot waitFor(const MpsMonitor& m, gpu::MpsState want) {
  MpsMonitor::Snapshot s;
  for (auto end = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < end;) {
    s = m.snapshot();
    if (s.probed && s.mps.state == want) break;
    std::this_thread::sleep_for(10ms);
  }
  return s;
}

TEST(MpsMonitor, FollowsTheControlSocketAndSetsTheGauge) {
  char tmpl[] = "/tmp/kolo-mps-monitor-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string path = dir + "/control";
  UniqueFd l(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(l.get(), 128), 0);

  metrics::Registry reg;
  {
    MpsMonitor m(dir, &reg, 20ms);
    auto s = waitFor(m, gpu::MpsState::kUp);
    ASSERT_EQ(s.mps.state, gpu::MpsState::kUp) << s.mps.reason;
    EXPECT_EQ(s.mps.pipe_dir, dir);
    // No GPU here: the node's state under gpu="none"; with GPUs, one per GPU.
    const std::string series =
        s.gpus.count == 0 ? "kolo_mps_up{gpu=\"none\"}" : "kolo_mps_up{gpu=\"0\"}";
    if (s.gpus.count == 0) {
      EXPECT_FALSE(s.gpus.none_reason.empty());
    }
    EXPECT_NE(reg.render().find(series + " 1\n"), std::string::npos) << reg.render();

    l.reset();  // the daemon dies, its socket file stays
    s = waitFor(m, gpu::MpsState::kDown);
    ASSERT_EQ(s.mps.state, gpu::MpsState::kDown);
    EXPECT_NE(s.mps.reason.find("connect refused"), std::string::npos) << s.mps.reason;
    EXPECT_NE(reg.render().find(series + " 0\n"), std::string::npos) << reg.render();
  }  // stops its thread
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace kolo
