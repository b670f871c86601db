// Device tensors across agents over the generation's NCCL communicator
// (docs/gpu.md, "Device tensors across agents"), through the real daemons:
// a coordinator, 2-4 kolo-agent processes with --device=host-emulated (so
// NCCL is the emulation over loopback TCP), trainers kolo_gpu_seam_rank as
// processes. Label device-emulation (also under ASan).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <thread>
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

std::map<std::string, std::string> agentEnv(std::map<std::string, std::string> env = {}) {
  env["KOLO_DEVICE"] = "host-emulated";
  if (env.count("KOLO_BACKEND_TIMEOUT_MS") == 0) env["KOLO_BACKEND_TIMEOUT_MS"] = "5000";
  return env;
}

std::map<std::string, std::string> rankEnv() {
  return {{"KOLO_DEVICE_ARENA_MB", "16"}, {"KOLO_DEVICE", "host-emulated"}};
}

ClusterOptions options(int agents, std::map<std::string, std::string> env = {}) {
  ClusterOptions o;
  o.agents = agents;
  o.agent_env = agentEnv(std::move(env));
  return o;
}

// Every rank exits 0 printing `ok`.
void expectAll(Cluster& c, std::vector<Proc>& ranks, const std::string& ok, int agents) {
  ASSERT_TRUE(c.waitJob(ranks, 120s)) << "ranks did not finish\n" << allLogs(c, agents);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << out << allLogs(c, agents);
    EXPECT_TRUE(has(out, ok)) << "rank " << r << ":\n" << out << allLogs(c, agents);
  }
}

class NcclCross : public ::testing::TestWithParam<std::vector<int>> {};

// Every dtype x op (in and out of place, Average included) and a broadcast
// per dtype, bit for bit against common/reduce, over NCCL; every agent logs
// the same choice and that the route is in use.
TEST_P(NcclCross, EveryDtypeAndOpAndBroadcastBitExact) {
  const std::vector<int> layout = GetParam();
  const int n = static_cast<int>(layout.size());
  Cluster c(options(n));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclevery", layout, {kRank, "every"}, rankEnv());
  expectAll(c, ranks, "EVERY OK", n);
  for (int a = 0; a < n; ++a) {
    const std::string log = c.agentLog(a);
    EXPECT_TRUE(has(log, "device tensors cross agents over NCCL: every one of the " +
                             std::to_string(n) +
                             " agents has NCCL and a GPU (--device-cross=auto)"))
        << log;
    EXPECT_TRUE(has(log, "device tensors cross agents over NCCL (the first: 'seam.0')")) << log;
  }
}

// Prescale and postscale (Sum, Average) over NCCL, bit for bit: the
// prescale in the local kernel, the postscale after the agents' sum.
TEST_P(NcclCross, PrescaleAndPostscaleBitExact) {
  const std::vector<int> layout = GetParam();
  const int n = static_cast<int>(layout.size());
  Cluster c(options(n));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclscaled", layout, {kRank, "scaled"}, rankEnv());
  expectAll(c, ranks, "SCALED OK", n);
  EXPECT_TRUE(has(c.agentLog(0), "device tensors cross agents over NCCL (the first: 'scaled.0')"))
      << c.agentLog(0);
}

// Allgather (uneven first dimensions, one rank with none), alltoall
// (splits, empty blocks) and reducescatter (uneven blocks, every op,
// prescale/postscale), every dtype, bit for bit against the rank's
// reference, over NCCL.
TEST_P(NcclCross, AllgatherAlltoallReducescatterEveryDtypeBitExact) {
  const std::vector<int> layout = GetParam();
  const int n = static_cast<int>(layout.size());
  Cluster c(options(n));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclxcolls", layout, {kRank, "xcolls"}, rankEnv());
  expectAll(c, ranks, "XCOLLS OK", n);
  for (int a = 0; a < n; ++a) {
    EXPECT_TRUE(has(c.agentLog(a),
                    "device tensors cross agents over NCCL (the first: "
                    "'colls.gather.0')"))
        << c.agentLog(a);
  }
}

INSTANTIATE_TEST_SUITE_P(Agents, NcclCross,
                         ::testing::Values(std::vector<int>{2, 1}, std::vector<int>{1, 1, 1},
                                           std::vector<int>{1, 2, 1, 1}),
                         [](const ::testing::TestParamInfo<std::vector<int>>& i) {
                           return layoutName(i.param);
                         });

// The layout collectives with several ranks on the first and the last of
// three agents (2, 1, 2): every agent's send and receive blocks interleave
// ranks of two agents.
TEST(NcclCrossLayout, AllgatherAlltoallReducescatterOverTwoOneTwo) {
  Cluster c(options(3));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclxcolls212", {2, 1, 2}, {kRank, "xcolls"}, rankEnv());
  expectAll(c, ranks, "XCOLLS OK", 3);
}

// --device-cross=staged: host staging, bit-exact, and the logged reason.
TEST(NcclCrossChoice, ForcedStagedStagesWithItsLoggedReason) {
  Cluster c(options(2, {{"KOLO_DEVICE_CROSS", "staged"}}));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclstaged", {1, 1}, {kRank, "every"}, rankEnv());
  expectAll(c, ranks, "EVERY OK", 2);
  for (int a = 0; a < 2; ++a) {
    const std::string log = c.agentLog(a);
    EXPECT_TRUE(has(log, "device tensors cross agents by host staging: --device-cross=staged"))
        << log;
    EXPECT_FALSE(has(log, "device tensors cross agents over NCCL")) << log;
  }
}

// --device-cross=nccl with an agent whose NCCL is missing: every rank's
// device op fails with the choice's text, within seconds.
TEST(NcclCrossChoice, ForcedNcclWithAnAgentLackingItFailsWithTheText) {
  ClusterOptions o = options(2, {{"KOLO_DEVICE_CROSS", "nccl"}});
  o.per_agent_env = {{}, {{"KOLO_NCCL_EMU_FAULTS", "absent"}}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclforced", {1, 1}, {kRank, "fault"}, rankEnv());
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << allLogs(c, 2);
  const std::string text =
      "--device-cross=nccl but NCCL is not viable for this job: agent 1 has no NCCL (not viable: "
      "NCCL is absent (injected: KOLO_NCCL_EMU_FAULTS=absent))";
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
    EXPECT_TRUE(has(r.output(), "FAULT DONE")) << r.output();
    EXPECT_TRUE(has(r.output(), text)) << r.output() << allLogs(c, 2);
    EXPECT_LT(r.seconds(), 20.0) << r.output();
    std::printf("[forced] %s", r.output().c_str());
  }
  for (int a = 0; a < 2; ++a) EXPECT_TRUE(has(c.agentLog(a), text)) << c.agentLog(a);
}

// An agent SIGKILLed while its job's allreduces run over NCCL: the ranks
// of the other agents fail with the cause within the backend timeout (5 s)
// plus slack, and their agents serve a new job.
TEST(NcclCrossFailure, AnAgentKilledMidOpFailsTheOthersWithTheCause) {
  Cluster c(options(3));
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("nccllost", {1, 1, 1}, {kRank, "loop"}, rankEnv());
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!has(ranks[0].output(), "LOOP STARTED") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(has(ranks[0].output(), "LOOP STARTED")) << ranks[0].output() << allLogs(c, 3);
  killProcess(c.agent(2), SIGKILL);
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << allLogs(c, 2);
  for (int r = 0; r < 2; ++r) {
    const std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << out << allLogs(c, 2);
    EXPECT_TRUE(has(out, "LOOP FAILED")) << out << allLogs(c, 2);
    // The cause: the lost node (the agents' negotiation saw it first) or
    // the NCCL collective in flight failing with the peer's exit.
    EXPECT_TRUE(has(out, "job nccllost")) << out;
    EXPECT_TRUE(has(out, "lost node node2") || has(out, "remote process exited")) << out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex("([0-9.]+) s after the last success"))) << out;
    EXPECT_LT(std::stod(m[1]), 10.0) << out;  // the backend timeout is 5 s
    std::printf("[killed] rank %d: %s\n", r, m[0].str().c_str());
  }
  // The surviving agents serve a new device job (over NCCL, 2 agents).
  // (A fresh cluster is not needed: agents 0 and 1 are still up.)
  EXPECT_FALSE(c.agent(0).exited) << c.agentLog(0);
  EXPECT_FALSE(c.agent(1).exited) << c.agentLog(1);
}

// Elastic: an agent (and its trainer) lost mid-job; the job goes on in the
// next generation over 2 agents with a new NCCL communicator, bit-exact.
TEST(NcclCrossFailure, AGenerationChangeMidJobBuildsANewCommunicator) {
  ClusterOptions o = options(3);
  o.coordinator_args = {"--lease-ms", "1500", "--heartbeat-interval-ms", "250"};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  std::map<std::string, std::string> env = rankEnv();
  env["KOLO_MIN_NP"] = "2";
  env["KOLO_MAX_NP"] = "3";
  env["KOLO_ELASTIC_TIMEOUT"] = "20";
  auto ranks = c.launchMultiJob("ncclelastic", {1, 1, 1}, {kRank, "elastic"}, env);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!has(ranks[0].output(), "LOOP STARTED") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(has(ranks[0].output(), "LOOP STARTED")) << ranks[0].output() << allLogs(c, 3);
  killProcess(c.agent(2), SIGKILL);
  killProcess(ranks[2], SIGKILL);
  ASSERT_TRUE(c.waitJob(ranks, 60s)) << allLogs(c, 2);
  for (int r = 0; r < 2; ++r) {
    const std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << out << allLogs(c, 2);
    EXPECT_TRUE(has(out, "ELASTIC OK size 2")) << out << allLogs(c, 2);
  }
  for (int a = 0; a < 2; ++a) {
    const std::string log = c.agentLog(a);
    EXPECT_TRUE(has(log, "device tensors cross agents over NCCL: every one of the 3 agents"))
        << log;
    EXPECT_TRUE(has(log, "device tensors cross agents over NCCL: every one of the 2 agents"))
        << log;
  }
}

// bench/gpu_issue16.sh's nccl-cross phase (a GPU machine; run with
// --gtest_also_run_disabled_tests): KOLO_NCCL_BENCH_AGENTS agents (2 or 4,
// default 2) on GPU 0, each with its own NCCL_HOSTID (NCCL then takes them
// for separate hosts: its socket transport over loopback), one trainer per
// agent, --device-cross=KOLO_NCCL_BENCH_CROSS (nccl or staged, default
// nccl); prints rank 0's BENCHROW lines (bytes, us, algbw, busbw).
TEST(NcclCrossGpu, DISABLED_BusbwOnOneGpu) {
  const char* na = std::getenv("KOLO_NCCL_BENCH_AGENTS");
  const char* cross = std::getenv("KOLO_NCCL_BENCH_CROSS");
  const int n = na != nullptr ? std::atoi(na) : 2;
  ASSERT_TRUE(n >= 2 && n <= 8) << "KOLO_NCCL_BENCH_AGENTS=" << na;
  ClusterOptions o;
  o.agents = n;
  o.agent_env = {{"KOLO_DEVICE", "cuda"},
                 {"KOLO_DEVICE_CROSS", cross != nullptr ? cross : "nccl"},
                 {"KOLO_BACKEND_TIMEOUT_MS", "60000"}};
  for (int a = 0; a < n; ++a)
    o.per_agent_env.push_back({{"NCCL_HOSTID", "kolo-bench-" + std::to_string(a)}});
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("ncclbench", std::vector<int>(n, 1), {kRank, "bench"},
                                {{"KOLO_DEVICE_ARENA_MB", "1024"}, {"KOLO_DEVICE", "cuda"}});
  ASSERT_TRUE(c.waitJob(ranks, 400s)) << allLogs(c, n);
  if (has(ranks[0].output(), "SKIP:")) GTEST_SKIP() << ranks[0].output();
  for (auto& r : ranks) EXPECT_TRUE(has(r.output(), "BENCH OK")) << r.output() << allLogs(c, n);
  std::printf("%s", ranks[0].output().c_str());
  EXPECT_TRUE(has(c.agentLog(0), cross != nullptr && std::string(cross) == "staged"
                                     ? "device tensors cross agents by host staging"
                                     : "device tensors cross agents over NCCL"))
      << c.agentLog(0);
}

}  // namespace
}  // namespace kolo::testing
