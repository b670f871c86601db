// The device protocol through the real daemons on the device seam
// (docs/gpu.md, "The device seam"): a real kolo-agent and trainer processes
// (kolo_gpu_seam_rank) that use the seam only. By default the host emulation
// (builds with KOLO_DEVICE_EMULATION, so every CPU machine and the sanitizer
// builds run it); with KOLO_TEST_DEVICE=cuda the same tests run unchanged on
// the real CUDA implementation (a GPU machine; they skip without a GPU).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;

// The rank binary: $KOLO_GPU_SEAM_RANK (bench/gpu_issue16.sh sets it for a
// carried bundle), else the one built next to this test.
const std::string kRank = [] {
  const char* env = std::getenv("KOLO_GPU_SEAM_RANK");
  return std::string(env != nullptr && env[0] != '\0' ? env : KOLO_GPU_SEAM_RANK);
}();

bool has(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// "host-emulated" unless KOLO_TEST_DEVICE says cuda.
std::string testDevice() {
  const char* env = std::getenv("KOLO_TEST_DEVICE");
  return env != nullptr && *env != '\0' ? env : "host-emulated";
}

#define KOLO_REQUIRE_SEAM()                                                                    \
  do {                                                                                         \
    if (testDevice() == "host-emulated" && !kEmulationBuilt)                                   \
      GTEST_SKIP() << "skipped: this build has no host emulation (KOLO_DEVICE_EMULATION=OFF)"; \
  } while (0)

#ifdef KOLO_TEST_EMULATION
constexpr bool kEmulationBuilt = true;
#else
constexpr bool kEmulationBuilt = false;
#endif

std::map<std::string, std::string> withDevice(std::map<std::string, std::string> env) {
  env["KOLO_DEVICE"] = testDevice();
  return env;
}

std::map<std::string, std::string> rankEnv(const std::string& arena_mb = "16",
                                           std::map<std::string, std::string> extra = {}) {
  extra["KOLO_DEVICE_ARENA_MB"] = arena_mb;
  return withDevice(std::move(extra));
}

// Every rank must print `ok`; all SKIP (no GPU for KOLO_TEST_DEVICE=cuda) skips.
void expectAll(Cluster& c, std::vector<Proc>& ranks, const std::string& ok, int agents,
               bool* skipped) {
  ASSERT_TRUE(c.waitJob(ranks, 120s)) << "ranks did not finish\n" << allLogs(c, agents);
  int skips = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string out = ranks[r].output();
    if (has(out, "SKIP:")) {
      ++skips;
      continue;
    }
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << out << allLogs(c, agents);
    EXPECT_TRUE(has(out, ok)) << "rank " << r << ":\n" << out << allLogs(c, agents);
  }
  *skipped = skips == static_cast<int>(ranks.size());
  EXPECT_TRUE(skips == 0 || *skipped) << "some ranks skipped, some did not";
}

class SeamRanks : public ::testing::TestWithParam<int> {};

// Every dtype and op (in and out of place) and a broadcast per dtype, bit
// for bit against common/reduce, 2-4 trainers on one agent.
TEST_P(SeamRanks, EveryDtypeAndOpOnOneAgent) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seamevery", GetParam(), {kRank, "every"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "EVERY OK", 1, &skipped);
  if (skipped) GTEST_SKIP() << ranks[0].output();
  if (testDevice() == "host-emulated") {
    EXPECT_TRUE(has(c.agentLog(0), "THE DEVICE PATH IS HOST-EMULATED")) << c.agentLog(0);
    EXPECT_TRUE(has(ranks[0].output(), "THE DEVICE PATH IS HOST-EMULATED")) << ranks[0].output();
  }
}

// Issue 40: allgather (different first dimensions), reducescatter (uneven
// blocks, every op, prescale/postscale), alltoall (splits) and grouped
// allreduce of device tensors, every dtype, bit for bit, 2-4 trainers on
// one agent.
TEST_P(SeamRanks, EveryCollectiveOnOneAgent) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seamcolls", GetParam(), {kRank, "colls"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "COLLS OK", 1, &skipped);
  if (skipped) GTEST_SKIP() << ranks[0].output();
  std::printf("[colls] rank 0: %s", ranks[0].output().c_str());
}

#include "tests/gpu/device_seam_fusion_test.inc"

INSTANTIATE_TEST_SUITE_P(Trainers, SeamRanks, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// Zero copy (kolo_device_alloc buffers; docs/gpu.md, "Zero copy on the
// device"): allreduce of 8 dtype/op pairs and broadcast of 3 dtypes, in place
// and out of place, bit for bit, 2-4 trainers on one agent; libkolo enqueued
// no device copy for an in place op, one out of place, two for user memory
// (the rank checks each); then the refusals with their text.
class SeamZeroCopy : public ::testing::TestWithParam<int> {};

void expectZeroCopyRefusals(const std::vector<Proc>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string out = ranks[r].output();
    EXPECT_TRUE(has(out, "REFUSED free-host: INVALID_ARGUMENT: kolo_device_free: ")) << out;
    EXPECT_TRUE(has(out,
                    "was not returned by kolo_device_alloc (or was freed already, or kolo was "
                    "re-initialized since): it is not in the device arena ("))
        << out;
    EXPECT_TRUE(has(out, "REFUSED free-inside: INVALID_ARGUMENT") &&
                has(out, "it lies inside the device arena but is not the start of a live buffer"))
        << out;
    EXPECT_TRUE(has(out, "REFUSED free-twice: INVALID_ARGUMENT")) << out;
    EXPECT_TRUE(has(out,
                    "REFUSED alloc-zero: INVALID_ARGUMENT: kolo_device_alloc: size 0; ask "
                    "for at least one byte"))
        << out;
    EXPECT_TRUE(has(out,
                    "REFUSED alloc-big: UNAVAILABLE: kolo_device_alloc(67108864 bytes): the "
                    "device arena has no free block that large (16777216 bytes, ") &&
                has(out, "free device buffers or raise KOLO_DEVICE_ARENA_MB (now 16)"))
        << out;
    if (r == 0) {
      EXPECT_TRUE(has(out,
                      "REFUSED free-busy: INVALID_ARGUMENT: kolo_device_free: the buffer is "
                      "in use by the allreduce of device tensor 'zc.busy', still in flight"))
          << out;
    }
  }
}

TEST_P(SeamZeroCopy, AllreduceAndBroadcastInPlaceAndNotWithoutCopies) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seamzc", GetParam(), {kRank, "zerocopy"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "ZEROCOPY OK", 1, &skipped);
  if (skipped) GTEST_SKIP() << ranks[0].output();
  expectZeroCopyRefusals(ranks);
  std::printf("[zerocopy] rank 0: %s", ranks[0].output().c_str());
}

INSTANTIATE_TEST_SUITE_P(Trainers, SeamZeroCopy, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// The same across two agents (2 + 1 ranks): reduced in place in the
// resident buffers on each agent, staged through host memory across.
TEST(SeamZeroCopyCross, AcrossTwoAgents) {
  KOLO_REQUIRE_SEAM();
  Cluster c(2, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("seamzcx", {2, 1}, {kRank, "zerocopy"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "ZEROCOPY OK", 2, &skipped);
  if (skipped) GTEST_SKIP() << ranks[0].output();
  expectZeroCopyRefusals(ranks);
}

// Two agents ("nodes"): reduced per agent on the device, across agents over
// NCCL (--device-cross=auto; the emulation has it), copied back
// (device_nccl_cross_test.cc covers NCCL and forced staging).
TEST(Seam, EveryDtypeAndOpAcrossTwoAgents) {
  KOLO_REQUIRE_SEAM();
  Cluster c(2, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("seamcross", {2, 1}, {kRank, "every"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "EVERY OK", 2, &skipped);
}

// A host tensor on one rank and device tensors on the others: every rank
// gets the refusal with its text.
TEST(Seam, MixedHostAndDeviceTensorsAreRefusedWithTheText) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seammixed", 2, {kRank, "mixed"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "MIXED DONE", 1, &skipped);
  if (skipped) GTEST_SKIP() << ranks[0].output();
  for (auto& r : ranks) {
    EXPECT_TRUE(has(r.output(), "INVALID_ARGUMENT")) << r.output();
    EXPECT_TRUE(has(r.output(),
                    "tensor 'mixed.gather': local rank 0 submitted a host tensor and "
                    "another a device tensor"))
        << r.output();
  }
}

// Across two agents staging through host memory (--device-cross=staged) a
// device allgather is refused on every rank with the text (over NCCL it
// runs: device_nccl_cross_test.cc); a device allreduce after it works.
TEST(Seam, DeviceAllgatherAcrossAgentsIsRefusedWithTheText) {
  KOLO_REQUIRE_SEAM();
  Cluster c(2, withDevice({{"KOLO_DEVICE_CROSS", "staged"}}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("seamxgather", {1, 1}, {kRank, "cross"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "CROSS DONE", 2, &skipped);
  if (skipped) GTEST_SKIP() << ranks[0].output();
  for (auto& r : ranks) {
    EXPECT_TRUE(has(r.output(),
                    "allgather of device tensor 'cross.gather': device tensors of this "
                    "collective are wired for the ranks of one agent only so far (this job has 2 "
                    "ranks, 1 of them here); across agents they go over NCCL only"))
        << r.output();
  }
}

TEST(Seam, MoreDeviceOpsInFlightThanEventPairs) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seaminflight", 2, {kRank, "inflight"}, rankEnv());
  bool skipped = false;
  expectAll(c, ranks, "INFLIGHT OK", 1, &skipped);
}

TEST(Seam, ATensorLargerThanTheDeviceArenaIsRefused) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seamfull", 2, {kRank, "full"}, rankEnv("2"));
  bool skipped = false;
  expectAll(c, ranks, "FULL OK", 1, &skipped);
  if (skipped) return;
  for (auto& r : ranks) {
    EXPECT_TRUE(has(r.output(), "INVALID_ARGUMENT")) << r.output();
    EXPECT_TRUE(has(r.output(),
                    "bytes are more than the whole device arena (2097152 bytes); raise "
                    "KOLO_DEVICE_ARENA_MB"))
        << r.output();
  }
}

TEST(Seam, ATrainerThatDiesMidOpFailsTheOthersNotTheAgent) {
  KOLO_REQUIRE_SEAM();
  Cluster c(1, withDevice({}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("seamdie", 3, {kRank, "die"}, rankEnv());
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << c.agentLog(0);
  if (has(ranks[0].output(), "SKIP:")) GTEST_SKIP() << ranks[0].output();
  EXPECT_EQ(ranks[2].exit_code, 7) << ranks[2].output();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << "signal " << ranks[r].term_signal << "\n"
                                     << ranks[r].output() << c.agentLog(0);
    EXPECT_TRUE(has(ranks[r].output(), "DIE OK")) << ranks[r].output();
    EXPECT_LT(ranks[r].seconds(), 30.0);
  }
  // The agent survived and its device path serves a new job.
  auto again = c.launchJob("seamafter", 2, {kRank, "every"}, rankEnv());
  bool skipped = false;
  expectAll(c, again, "EVERY OK", 1, &skipped);
}

// Each injected fault (host emulation only): where it is injected, and the
// text every rank must see.
struct FaultCase {
  const char* name;
  bool in_agent;  // else in the trainers
  const char* faults;
  const char* text;
};

// Across agents a device tensor is staged through pinned host memory: a
// trainer stream that never reaches its copy-in (its events never complete)
// fails the op on every rank at --device-staging-timeout-s, with the text,
// instead of blocking a worker in the copy (into pageable memory it would
// never return: the emulation blocks there as CUDA does).
TEST(Seam, AStuckTrainerStreamAcrossAgentsFailsAtTheStagingDeadline) {
  if (testDevice() != "host-emulated" || !kEmulationBuilt)
    GTEST_SKIP() << "skipped: faults are injected by the emulation";
  Cluster c(2,
            withDevice({{"KOLO_DEVICE_STAGING_TIMEOUT_S", "3"}, {"KOLO_DEVICE_CROSS", "staged"}}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("seamstuck", {1, 1}, {kRank, "fault"},
                                rankEnv("16", {{"KOLO_DEVICE_EMU_FAULTS", "hang-events"}}));
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << allLogs(c, 2);
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
    EXPECT_TRUE(has(r.output(), "FAULT DONE")) << r.output();
    EXPECT_TRUE(has(r.output(), "device tensor 'fault.0' staged to the host")) << r.output();
    EXPECT_TRUE(has(r.output(), "within 3 s (--device-staging-timeout-s)")) << r.output();
    EXPECT_LT(r.seconds(), 25.0) << r.output();
    std::printf("[stuck] rank done in %.1f s: %s\n", r.seconds(), r.output().c_str());
  }
}

// gtest prints the case by its name in test listings, not as raw bytes.
void PrintTo(const FaultCase& f, std::ostream* os) { *os << f.name; }

class SeamFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(SeamFaults, ReachesEveryRankWithItsText) {
  if (testDevice() != "host-emulated" || !kEmulationBuilt)
    GTEST_SKIP() << "skipped: faults are injected by the emulation";
  const FaultCase& f = GetParam();
  std::map<std::string, std::string> agent_env = withDevice({});
  std::map<std::string, std::string> extra;
  (f.in_agent ? agent_env : extra)["KOLO_DEVICE_EMU_FAULTS"] = f.faults;
  Cluster c(1, agent_env);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks =
      c.launchJob(std::string("seamfault") + f.name, 2, {kRank, "fault"}, rankEnv("16", extra));
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << c.agentLog(0);
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << c.agentLog(0);
    EXPECT_TRUE(has(r.output(), "FAULT DONE")) << r.output();
    EXPECT_TRUE(has(r.output(), f.text)) << r.output() << c.agentLog(0);
    EXPECT_LT(r.seconds(), 30.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Injected, SeamFaults,
    ::testing::Values(
        FaultCase{"launch", true, "fail-launch",
                  "cudaLaunchKernel: cudaErrorLaunchFailure: unspecified launch failure"},
        FaultCase{"sticky", true, "sticky",
                  "cudaErrorIllegalAddress: an illegal memory access was encountered (sticky"},
        FaultCase{"record", false, "fail-record",
                  "cudaEventRecord: cudaErrorInvalidResourceHandle: invalid resource handle"},
        FaultCase{"hang", false, "hang-events",
                  "the emulated device stream was not done after 3000 ms"},
        FaultCase{"slow", true, "delay-us=20000", "FAULT: OK"}),
    [](const ::testing::TestParamInfo<FaultCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace kolo::testing
