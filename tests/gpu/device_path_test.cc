// The device data path through the real daemons (docs/gpu.md): a real
// kolo-agent and trainer processes (kolo_gpu_device_rank) on one node.
//  - Without a GPU (or without CUDA in the build): a trainer that asks for a
//    device arena is admitted without one and told why; a device tensor is
//    refused with a clear error by libkolo, a descriptor flagged "device" is
//    refused by the agent, quickly, and the host path keeps working.
//  - With a GPU: 2-4 trainers sharing GPU 0 allreduce device tensors (bit
//    for bit vs a reference), the same across two agents (staged through
//    host memory), copy ordering against a busy trainer stream, a trainer
//    that dies with its device arena mapped. These skip cleanly
//    ("skipped: no CUDA device: ...") without one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/ipc_layout.h"
#include "common/unix_socket.h"
#include "kolo/proto/ipc.pb.h"
#include "tests/integration/harness.h"

#ifdef KOLO_TEST_HAVE_CUDA
#include "agent/gpu/cuda_status.h"
#endif

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;

// The rank binary: $KOLO_GPU_DEVICE_RANK (bench/gpu_check.sh sets it for a
// carried bundle), else the one built next to this test.
const std::string kRank = [] {
  const char* env = std::getenv("KOLO_GPU_DEVICE_RANK");
  return std::string(env != nullptr && env[0] != '\0' ? env : KOLO_GPU_DEVICE_RANK);
}();

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

#define KOLO_REQUIRE_GPU_FOR_DEVICE_PATH() \
  do {                                     \
    std::string _why;                      \
    if (!gpuPresent(&_why)) GTEST_SKIP() << "skipped: " << _why; \
  } while (0)

bool gpuPresent(std::string* why) {
#ifdef KOLO_TEST_HAVE_CUDA
  auto n = gpu::deviceCount();
  if (!n.isOk()) *why = n.status().message();
  return n.isOk();
#else
  *why = "no CUDA device: this build has no CUDA";
  return false;
#endif
}

// Runs `mode` on `world` ranks of one job on `c`; every rank must print `ok`
// (or all must print SKIP, then *skipped is set).
void runMode(Cluster& c, const std::string& job, int world, const std::string& mode, const std::string& ok,
             std::map<std::string, std::string> env, bool* skipped, std::vector<std::string>* outputs = nullptr) {
  auto ranks = c.launchJob(job, world, {kRank, mode}, std::move(env));
  ASSERT_TRUE(c.waitJob(ranks, 180s)) << "ranks did not finish\n" << c.agentLog(0);
  int skips = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string out = ranks[r].output();
    if (outputs) outputs->push_back(out);
    if (has(out, "SKIP:")) {
      ++skips;
      continue;
    }
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << out << "\nagent:\n" << c.agentLog(0);
    EXPECT_TRUE(has(out, ok)) << "rank " << r << ":\n" << out << "\nagent:\n" << c.agentLog(0);
  }
  *skipped = skips == world;
  EXPECT_TRUE(skips == 0 || skips == world) << "some ranks skipped, some did not";
}

TEST(DevicePath, AskedForButNoGpuIsRefusedClearly) {
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  bool skipped = false;
  std::vector<std::string> outs;
  runMode(c, "devrefuse", 2, "refuse", "REFUSE OK", {{"KOLO_DEVICE_ARENA_MB", "64"}}, &skipped, &outs);
  if (skipped) GTEST_SKIP() << "skipped: this machine has a GPU (the device arena was granted)";
  for (const std::string& out : outs) {
#ifdef KOLO_TEST_HAVE_CUDA
    EXPECT_TRUE(has(out, "device-why: this process cannot use the device path: no CUDA device: ")) << out;
#else
    EXPECT_TRUE(has(out, "device-why: this libkolo was built without CUDA (KOLO_WITH_CUDA=OFF)")) << out;
#endif
    EXPECT_TRUE(has(out, "client refusal: allreduce of device tensor 'device.flag': this rank has no device arena"))
        << out;
  }
}

TEST(DevicePath, NotAskedForIsRefusedClearlyEvenWithAGpu) {
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  bool skipped = false;
  std::vector<std::string> outs;
  runMode(c, "devnotasked", 2, "refuse", "REFUSE OK", {}, &skipped, &outs);
  ASSERT_FALSE(skipped);
  for (const std::string& out : outs) {
#ifdef KOLO_TEST_HAVE_CUDA
    EXPECT_TRUE(has(out, "device-why: this process asked for none: set KOLO_DEVICE_ARENA_MB before kolo_init")) << out;
#endif
    EXPECT_TRUE(has(out, "agent refusal: allreduce of device tensor 'device.raw': this rank has no device arena on "
                         "the kolo agent (it did not ask for one: KOLO_DEVICE_ARENA_MB unset, or no usable GPU in the trainer)"))
        << out;
  }
}

// C ABI revision 2: the thread's kolo_set_stream stream. A host tensor
// ignores it (bit-exact, the bogus stream never reaches CUDA); with a GPU
// the device allreduce that names no stream is ordered on it, and a stream
// on another device is refused naming both devices.
TEST(DevicePath, ThreadStreamLeavesHostTensorsAloneAndOrdersDeviceOnes) {
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  bool skipped = false;
  std::vector<std::string> outs;
  runMode(c, "devstream", 2, "stream", "STREAM OK", {{"KOLO_DEVICE_ARENA_MB", "64"}}, &skipped, &outs);
  ASSERT_FALSE(skipped);
  std::string why;
  if (gpuPresent(&why)) {
    for (const std::string& out : outs) EXPECT_TRUE(has(out, "refusal: allreduce of device tensor")) << out;
  } else {
    for (const std::string& out : outs) EXPECT_TRUE(has(out, "no device arena: ")) << out;
  }
}

TEST(DevicePath, InvalidArenaSizeIsNamed) {
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  bool skipped = false;
  std::vector<std::string> outs;
  runMode(c, "devbadenv", 1, "refuse", "REFUSE OK", {{"KOLO_DEVICE_ARENA_MB", "lots"}}, &skipped, &outs);
  ASSERT_FALSE(skipped);
#ifdef KOLO_TEST_HAVE_CUDA
  EXPECT_TRUE(has(outs.at(0), "device-why: KOLO_DEVICE_ARENA_MB is 'lots'; it must be a whole number of MiB"))
      << outs.at(0);
#endif
}

// The agent's grant path: a Hello asking for a device arena (with 2 event
// handles) on a machine where the agent cannot grant one is admitted with
// the three host descriptors only and a device_error saying why.
TEST(DevicePath, AgentWithoutAGpuAdmitsTheTrainerAndSaysWhyNoDeviceArena) {
  std::string why;
  if (gpuPresent(&why)) GTEST_SKIP() << "skipped: this machine has a GPU (the agent would grant the arena)";
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  auto sock = connectUnix(c.socket(0));
  ASSERT_TRUE(sock.isOk()) << sock.status().toString();
  ipc::ClientFrame f;
  ipc::Hello* h = f.mutable_hello();
  h->set_protocol_version(kIpcProtocolVersion);
  h->set_job_id("devhello");
  h->set_token("t0ken");
  h->set_local_rank(0);
  h->set_local_size(1);
  h->set_world_size(1);
  h->set_pid(static_cast<int32_t>(::getpid()));
  h->set_device_arena_bytes(64ull << 20);
  h->set_cuda_device(0);
  h->set_device_events(std::string(128, '\x01'));
  ASSERT_TRUE(sendFrame(sock->get(), f).isOk());
  FrameDecoder dec;
  std::deque<UniqueFd> fds;
  std::string payload;
  Status st = recvFrame(sock->get(), std::chrono::steady_clock::now() + 20s, &dec, &fds, &payload);
  ASSERT_TRUE(st.isOk()) << st.toString() << c.agentLog(0);
  ipc::AgentFrame a;
  ASSERT_TRUE(a.ParseFromString(payload));
  ASSERT_TRUE(a.has_welcome());
  EXPECT_EQ(a.welcome().code(), 0) << a.welcome().message();
  EXPECT_EQ(a.welcome().device_arena_bytes(), 0u);
  EXPECT_TRUE(a.welcome().device_events().empty());
  EXPECT_EQ(fds.size(), 3u) << "arena, doorbell, completion; no device arena fd";
#ifdef KOLO_TEST_HAVE_CUDA
  EXPECT_TRUE(has(a.welcome().device_error(), "the kolo agent could not grant a device arena: no CUDA device: "))
      << a.welcome().device_error();
#else
  EXPECT_EQ(a.welcome().device_error(),
            "the kolo agent could not grant a device arena: this kolo-agent was built without CUDA "
            "(KOLO_WITH_CUDA=OFF)");
#endif
}

class DevicePathRanks : public ::testing::TestWithParam<int> {};

TEST_P(DevicePathRanks, AllreduceAndBroadcastSharingOneGpu) {
  KOLO_REQUIRE_GPU_FOR_DEVICE_PATH();
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  bool skipped = false;
  runMode(c, "devallreduce", GetParam(), "allreduce", "ALLREDUCE OK", {{"KOLO_DEVICE_ARENA_MB", "64"}}, &skipped);
  EXPECT_FALSE(skipped) << "a GPU is present but no device arena was granted\n" << c.agentLog(0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DevicePathRanks, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           std::string n = "n";
                           n += std::to_string(i.param);
                           return n;
                         });

// Two agents (two "nodes" on one machine sharing its GPU): the device
// tensors are reduced on the GPU per agent, staged through host memory over
// the host backend, and copied back (docs/gpu.md).
TEST(DevicePathGpu, AcrossTwoAgentsStagedThroughHost) {
  KOLO_REQUIRE_GPU_FOR_DEVICE_PATH();
  Cluster c(2);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("devcross", {2, 1}, {kRank, "allreduce"}, {{"KOLO_DEVICE_ARENA_MB", "64"}});
  ASSERT_TRUE(c.waitJob(ranks, 180s)) << allLogs(c, 2);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << out << allLogs(c, 2);
    EXPECT_TRUE(has(out, "ALLREDUCE OK")) << "rank " << r << ":\n" << out << allLogs(c, 2);
  }
}

TEST(DevicePathGpu, CopyInWaitsForTheTrainersBusyStream) {
  KOLO_REQUIRE_GPU_FOR_DEVICE_PATH();
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  bool skipped = false;
  runMode(c, "devorder", 2, "ordering", "ORDERING OK", {{"KOLO_DEVICE_ARENA_MB", "64"}}, &skipped);
  EXPECT_FALSE(skipped);
}

TEST(DevicePathGpu, ATrainerThatDiesWithItsArenaMappedFailsTheJobNotTheAgent) {
  KOLO_REQUIRE_GPU_FOR_DEVICE_PATH();
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("devdie", 2, {kRank, "die"}, {{"KOLO_DEVICE_ARENA_MB", "64"}});
  ASSERT_TRUE(c.waitJob(ranks, 120s)) << c.agentLog(0);
  EXPECT_EQ(ranks[1].exit_code, 7) << ranks[1].output();
  EXPECT_EQ(ranks[0].exit_code, 0) << ranks[0].output() << c.agentLog(0);
  EXPECT_TRUE(has(ranks[0].output(), "DIE OK")) << ranks[0].output();
  // The agent survived and its device path still works for a new job.
  bool skipped = false;
  runMode(c, "devafter", 2, "allreduce", "ALLREDUCE OK", {{"KOLO_DEVICE_ARENA_MB", "64"}}, &skipped);
  EXPECT_FALSE(skipped);
}

// Not a test: timings for docs/gpu.md, run by bench/gpu_check.sh
// (--gtest_also_run_disabled_tests). 4 trainers sharing GPU 0, then 1.
TEST(DevicePathGpu, DISABLED_BenchTrainersSharingOneGpu) {
  KOLO_REQUIRE_GPU_FOR_DEVICE_PATH();
  for (int world : {4, 1}) {
    // With $OUT set (the device tool), the agent's timeline goes there too.
    std::map<std::string, std::string> agent_env;
    if (const char* out = std::getenv("OUT"); out != nullptr && *out != '\0') {
      agent_env["KOLO_TIMELINE_FILENAME"] = std::string(out) + "/devbench-w" + std::to_string(world) + "-%a.json";
      agent_env["KOLO_TIMELINE_DIR"] = out;
    }
    Cluster c(1, agent_env);
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchJob("devbench" + std::to_string(world), world, {kRank, "bench"},
                             {{"KOLO_DEVICE_ARENA_MB", "1100"}});
    ASSERT_TRUE(c.waitJob(ranks, 600s)) << c.agentLog(0);
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << c.agentLog(0);
    }
    std::cout << "== device allreduce, " << world << " trainer(s) on one GPU, one agent (rank 0)\n"
              << ranks[0].output();
    // The agent's word on CUDA MPS (it warns when MPS does not run).
    std::istringstream log(c.agentLog(0));
    for (std::string line; std::getline(log, line);) {
      if (line.find("CUDA MPS") != std::string::npos) std::cout << "agent: " << line << "\n";
    }
  }
}

}  // namespace
}  // namespace kolo::testing
