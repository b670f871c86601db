// Several GPUs per node through the real daemons (docs/gpu.md, "Several
// GPUs per node"): a coordinator, one kolo-agent --device=host-emulated
// with KOLO_DEVICE_EMU_GPUS emulated GPUs, and trainers
// (kolo_gpu_seam_rank) that each make their GPU current before kolo_init
// (KOLO_TEST_GPU_OF_RANK). With KOLO_DEVICE_EMU_P2P=all the leader GPU's
// kernel reduces the groups' results; with none the agent's node-local
// NCCL communicator (the NCCL emulation) does. Every dtype and op and a
// broadcast per dtype, bit for bit against common/reduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;

const std::string kRank = [] {
  const char* env = std::getenv("KOLO_GPU_SEAM_RANK");
  return std::string(env != nullptr && env[0] != '\0' ? env : KOLO_GPU_SEAM_RANK);
}();

bool has(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

#define KOLO_REQUIRE_EMULATION()                                                               \
  do {                                                                                         \
    if (!kEmulationBuilt)                                                                      \
      GTEST_SKIP() << "skipped: this build has no host emulation (KOLO_DEVICE_EMULATION=OFF)"; \
  } while (0)

#ifdef KOLO_TEST_EMULATION
constexpr bool kEmulationBuilt = true;
#else
constexpr bool kEmulationBuilt = false;
#endif
#ifdef KOLO_TEST_NCCL
constexpr bool kNcclBuilt = true;
#else
constexpr bool kNcclBuilt = false;
#endif

// The emulated node: the agent and the trainers see the same GPUs.
std::map<std::string, std::string> nodeEnv(int gpus, const std::string& p2p) {
  return {{"KOLO_DEVICE", "host-emulated"},
          {"KOLO_DEVICE_EMU_GPUS", std::to_string(gpus)},
          {"KOLO_DEVICE_EMU_P2P", p2p}};
}

std::map<std::string, std::string> rankEnv(int gpus, const std::string& p2p,
                                           const std::string& gpu_of_rank) {
  auto env = nodeEnv(gpus, p2p);
  env["KOLO_DEVICE_ARENA_MB"] = "16";
  env["KOLO_TEST_GPU_OF_RANK"] = gpu_of_rank;
  return env;
}

void expectAll(Cluster& c, std::vector<Proc>& ranks, const std::string& ok, int agents) {
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << "ranks did not finish\n" << allLogs(c, agents);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << out << allLogs(c, agents);
    EXPECT_TRUE(has(out, ok)) << "rank " << r << ":\n" << out << allLogs(c, agents);
    EXPECT_FALSE(has(out, "SKIP:")) << out;
  }
}

struct Node {
  const char* name;
  int gpus;
  const char* p2p;
  const char* gpu_of_rank;  // one GPU per trainer, by local rank
};
void PrintTo(const Node& n, std::ostream* os) { *os << n.name; }

class SeveralGpus : public ::testing::TestWithParam<Node> {};

TEST_P(SeveralGpus, EveryDtypeAndOpBitExact) {
  KOLO_REQUIRE_EMULATION();
  const Node& n = GetParam();
  if (std::string(n.p2p) == "none" && !kNcclBuilt)
    GTEST_SKIP() << "skipped: no NCCL in this build (the node-local communicator)";
  Cluster c(1, nodeEnv(n.gpus, n.p2p));
  ASSERT_TRUE(c.ok()) << c.error();
  const int world =
      static_cast<int>(std::count(n.gpu_of_rank, n.gpu_of_rank + std::strlen(n.gpu_of_rank), ',')) +
      1;
  auto ranks = c.launchJob(std::string("several") + n.name, world, {kRank, "every"},
                           rankEnv(n.gpus, n.p2p, n.gpu_of_rank));
  expectAll(c, ranks, "EVERY OK", 1);
  const std::string log = c.agentLog(0);
  if (std::string(n.p2p) == "all") {
    EXPECT_TRUE(has(log, "device path: GPU 0 reads GPU 1's memory")) << log;
    EXPECT_FALSE(has(log, "node-local NCCL communicator")) << log;
  } else {
    EXPECT_TRUE(has(log, "device path: GPU 0 cannot read GPU 1's memory")) << log;
    EXPECT_TRUE(has(log, "node-local NCCL communicator over")) << log;
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string gpu = std::string(n.gpu_of_rank).substr(2 * r, 1);
    EXPECT_TRUE(has(ranks[r].output(), "on GPU " + gpu + " of " + std::to_string(n.gpus)))
        << ranks[r].output();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Trainers, SeveralGpus,
    ::testing::Values(Node{"n2g2_p2p", 2, "all", "0,1"}, Node{"n3g2_p2p", 2, "all", "1,0,1"},
                      Node{"n4g4_p2p", 4, "all", "3,2,1,0"}, Node{"n2g2_nccl", 2, "none", "0,1"},
                      Node{"n3g3_nccl", 3, "none", "2,0,1"},
                      Node{"n4g2_nccl", 2, "none", "0,1,1,0"}),
    [](const ::testing::TestParamInfo<Node>& i) { return std::string(i.param.name); });

// A layout collective (allgather) over ranks on two GPUs is refused on every
// rank with the text; a device allreduce after it works.
TEST(SeveralGpusRefusal, AllgatherOverTwoGpusIsRefusedWithTheText) {
  KOLO_REQUIRE_EMULATION();
  Cluster c(1, nodeEnv(2, "all"));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("severalgather", 2, {kRank, "cross"}, rankEnv(2, "all", "0,1"));
  expectAll(c, ranks, "CROSS DONE", 1);
  for (auto& r : ranks) {
    EXPECT_TRUE(has(r.output(),
                    "allgather of device tensor 'cross.gather': device tensors of this collective "
                    "are wired for ranks on one GPU only so far (these are on 2 GPUs)"))
        << r.output();
  }
}

// Ranks on two GPUs of one agent in a job over two agents: refused on every
// rank (on both agents) with the text; the host path still works.
TEST(SeveralGpusRefusal, SeveralGpusAcrossAgentsAreRefusedWithTheText) {
  KOLO_REQUIRE_EMULATION();
  Cluster c(2, nodeEnv(2, "all"));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks =
      c.launchMultiJob("severalcross", {2, 1}, {kRank, "refused"}, rankEnv(2, "all", "0,1"));
  expectAll(c, ranks, "REFUSED DONE", 2);
  for (auto& r : ranks) {
    EXPECT_TRUE(has(r.output(),
                    "tensor 'refused.0': device tensors of ranks on several GPUs of one node are "
                    "wired for jobs on one agent only so far (this job spans 2 agents)"))
        << r.output();
    EXPECT_LT(r.seconds(), 30.0);
  }
}

// A trainer that asks for a GPU the node does not have fails with the
// emulation's text (as cudaSetDevice would).
TEST(SeveralGpusRefusal, AGpuBeyondTheNodeIsNamed) {
  KOLO_REQUIRE_EMULATION();
  Cluster c(1, nodeEnv(2, "all"));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("severalbad", 1, {kRank, "every"}, rankEnv(2, "all", "2"));
  ASSERT_TRUE(c.waitJob(ranks, 30s)) << c.agentLog(0);
  EXPECT_EQ(ranks[0].exit_code, 1) << ranks[0].output();
  EXPECT_TRUE(has(ranks[0].output(),
                  "setDevice(2): INVALID_ARGUMENT: cudaSetDevice: cudaErrorInvalidDevice: device 2 "
                  "is not one of the emulation's 2 (KOLO_DEVICE_EMU_GPUS)"))
      << ranks[0].output();
}

// A trainer on GPU 1 dies with a device op submitted: the others (on GPUs 0
// and 1) get an error within a bound, not a hang; the agent then serves a
// new job over both GPUs. Peer kernel and node-local NCCL.
class SeveralGpusDeath : public ::testing::TestWithParam<const char*> {};

TEST_P(SeveralGpusDeath, ATrainerThatDiesMidOpFailsTheOthersNotTheAgent) {
  KOLO_REQUIRE_EMULATION();
  const std::string p2p = GetParam();
  if (p2p == "none" && !kNcclBuilt) GTEST_SKIP() << "skipped: no NCCL in this build";
  Cluster c(1, nodeEnv(2, p2p));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("severaldie" + p2p, 3, {kRank, "die"}, rankEnv(2, p2p, "0,1,1"));
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << c.agentLog(0);
  EXPECT_EQ(ranks[2].exit_code, 7) << ranks[2].output();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << c.agentLog(0);
    EXPECT_TRUE(has(ranks[r].output(), "DIE OK")) << ranks[r].output();
    EXPECT_LT(ranks[r].seconds(), 30.0);
  }
  auto again = c.launchJob("severalafter" + p2p, 2, {kRank, "every"}, rankEnv(2, p2p, "1,0"));
  expectAll(c, again, "EVERY OK", 1);
}

INSTANTIATE_TEST_SUITE_P(P2p, SeveralGpusDeath, ::testing::Values("all", "none"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
}  // namespace kolo::testing
