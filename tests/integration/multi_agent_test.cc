// Jobs spanning several agents on this machine (each agent acts as a node:
// its own socket, its own UCX worker), through the real daemons.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check"; }


class MultiAgent : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(MultiAgent, EveryDtypeOpAndSizeMatchesReference) {
  const std::vector<int>& sizes = GetParam();
  int k = static_cast<int>(sizes.size());
  // The mixed layout pipelines from 2 MiB (default 8 MiB), so that the
  // 1M-element cases of every dtype wider than a byte cross in chunks.
  // backend = ucx: the default (auto) takes tcp on a machine without RDMA,
  // which MultiAgentTcp.* covers.
  std::map<std::string, std::string> agent_env{{"KOLO_BACKEND", "ucx"}};
  if (sizes == std::vector<int>{1, 2, 1}) agent_env["KOLO_CROSS_PIPELINE_KB"] = "2048";
  Cluster c(k, agent_env);
  ASSERT_TRUE(c.ok()) << c.error();
  std::string job = "multi";
  for (int n : sizes) job += std::to_string(n);
  // The 1M-element cases (every dtype and op) on the mixed layout: ranks
  // reduced in place next to an agent that fills and drains a staging
  // buffer.
  std::vector<std::string> argv = {checkBin(), "allreduce"};
  if (sizes == std::vector<int>{1, 2, 1}) argv.push_back("--big");
  auto ranks = c.launchMultiJob(job, sizes, argv);
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << allLogs(c, k);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << allLogs(c, k);
    EXPECT_NE(ranks[r].output().find("allreduce checks passed"), std::string::npos) << ranks[r].output();
  }
}

// The direct user-memory path across agents (two ranks on an agent: the
// local step reads them from their processes into staging, the agents
// reduce it, the result is written back into each rank): exact around the
// threshold next to an agent whose one rank uses the arena; a rank the
// agent cannot read fails the op on every agent with its text, a read-only
// output fails it only on that rank's agent; the job goes on.
TEST(MultiAgentDirect, ExactAcrossAgentsAndErrorsReachEveryAgent) {
  Cluster c(2, {{"KOLO_DIRECT_MIN_KB", "256"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks =
      c.launchMultiJob("xdirect", {2, 1}, {checkBin(), "direct"}, {{"KOLO_DIRECT", "always"}});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << allLogs(c, 2);
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
    EXPECT_NE(r.output().find("direct checks passed"), std::string::npos) << r.output();
  }
  std::string metrics = httpGet(c.agentMetrics(0), "/metrics");
  EXPECT_NE(metrics.find("\nkolo_direct_bytes_total "), std::string::npos);
  EXPECT_EQ(metrics.find("\nkolo_direct_bytes_total 0\n"), std::string::npos) << "agent 0 moved nothing directly";
  auto bad = c.launchMultiJob("xdirectbad", {2, 1}, {checkBin(), "direct-bad", "--across"},
                              {{"KOLO_DIRECT", "always"}});
  ASSERT_TRUE(c.waitJob(bad, std::chrono::seconds(60))) << allLogs(c, 2);
  for (size_t i = 0; i < bad.size(); ++i) {
    std::string out = bad[i].output();
    EXPECT_EQ(bad[i].exit_code, 0) << out << allLogs(c, 2);
    EXPECT_NE(out.find("OK direct errors checked"), std::string::npos) << out;
    EXPECT_NE(out.find("Bad address (not mapped or not readable in that process)"), std::string::npos) << out;
  }
}

// Pipelined direct across agents (--direct-alone-min-kb, off by default):
// one rank per agent, tensors from the agents' pipeline size (512 KiB here)
// read from the ranks and written back
// chunk by chunk while the ring runs; next to the arena path below that
// size, and in the mixed layout. Exact; an unreadable input fails the job
// on every rank (the ring may have used the chunk).
TEST(MultiAgentDirect, PipelinedAcrossAgentsIsExactAndAnUnreadableTensorFailsTheJob) {
  for (const std::vector<int>& layout : {std::vector<int>{1, 1}, std::vector<int>{2, 1}}) {
    Cluster c(2, {{"KOLO_DIRECT_MIN_KB", "256"}, {"KOLO_CROSS_PIPELINE_KB", "512"}, {"KOLO_DIRECT_ALONE_MIN_KB", "512"}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob("xdirectp" + layoutName(layout), layout, {checkBin(), "direct"},
                                  {{"KOLO_DIRECT", "always"}});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << allLogs(c, 2);
    for (auto& r : ranks) {
      EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
      EXPECT_NE(r.output().find("direct checks passed"), std::string::npos) << r.output();
    }
    for (int a = 0; a < 2; ++a) {
      std::string metrics = httpGet(c.agentMetrics(a), "/metrics");
      EXPECT_EQ(metrics.find("\nkolo_direct_bytes_total 0\n"), std::string::npos)
          << "agent " << a << " moved nothing directly (" << layoutName(layout) << ")";
    }
  }
  Cluster c(2, {{"KOLO_DIRECT_MIN_KB", "256"}, {"KOLO_CROSS_PIPELINE_KB", "512"}, {"KOLO_DIRECT_ALONE_MIN_KB", "512"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto bad = c.launchMultiJob("xdirectpbad", {1, 1}, {checkBin(), "direct-bad-pipelined"});
  ASSERT_TRUE(c.waitJob(bad, std::chrono::seconds(60))) << allLogs(c, 2);
  for (auto& r : bad) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
    EXPECT_NE(r.output().find("OK the job failed"), std::string::npos) << r.output();
  }
  EXPECT_NE(bad[1].output().find("Bad address (not mapped or not readable in that process)"), std::string::npos)
      << bad[1].output();
}

// Streamed copy-in (docs/architecture.md): across agents, libkolo publishes
// an allreduce of at least the agents' pipeline size (512 KiB here) before
// it copies the tensor into the arena, and the agents read each chunk only
// once the trainer's count of bytes copied covers it. kolo_check's direct
// checks with the direct path off (every dtype and op around that size,
// odd addresses, in and out of place, scaled, 12 async in flight) are exact
// with one and two ranks on an agent, and the agents count streamed bytes.
// Streamed copy-out: the in-place ones' results are published chunk by
// chunk (1 MiB chunks: the 1.5-2 MiB tensors go in 2-3) and copied out by
// the trainers while the rest still moves; the agents count those bytes.
// With --stream-copy-out false the checks pass and only the copy-in
// streams; with --stream-copy-in false nothing streams.
TEST(MultiAgentStreamed, CopyInAndOutOverlappingTheRingIsExact) {
  auto metric = [](Cluster& c, int a, const std::string& name) {
    const std::string metrics = httpGet(c.agentMetrics(a), "/metrics");
    const std::string key = "\n" + name + " ";
    const size_t at = metrics.find(key);
    return at == std::string::npos ? -1.0 : std::strtod(metrics.c_str() + at + key.size(), nullptr);
  };
  // kolo_check's direct checks on two agents (pipeline 512 KiB, plus
  // `env`), every rank passing them; then each agent's streamed-in and
  // streamed-out bytes (empty if the job could not run).
  struct Streamed {
    double in = 0, out = 0;
  };
  auto runChecks = [&](const std::string& job, const std::vector<int>& layout,
                       std::map<std::string, std::string> env) {
    std::vector<Streamed> counts;
    env["KOLO_CROSS_PIPELINE_KB"] = "512";
    Cluster c(2, env);
    if (!c.ok()) {
      ADD_FAILURE() << c.error();
      return counts;
    }
    auto ranks = c.launchMultiJob(job, layout, {checkBin(), "direct"},
                                  {{"KOLO_DIRECT", "off"}, {"KOLO_CHECK_THRESHOLD_KB", "512"}});
    if (!c.waitJob(ranks, std::chrono::seconds(240))) {
      ADD_FAILURE() << "job " << job << " did not end\n" << allLogs(c, 2);
      return counts;
    }
    for (auto& r : ranks) {
      EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
      EXPECT_NE(r.output().find("direct checks passed"), std::string::npos) << r.output();
    }
    for (int a = 0; a < 2; ++a) {
      counts.push_back({metric(c, a, "kolo_streamed_copy_bytes_total"),
                        metric(c, a, "kolo_streamed_copy_out_bytes_total")});
    }
    return counts;
  };
  for (const std::vector<int>& layout : {std::vector<int>{1, 1}, std::vector<int>{2, 1}}) {
    auto counts = runChecks("xstream" + layoutName(layout), layout, {});
    ASSERT_EQ(counts.size(), 2u) << layoutName(layout);
    for (int a = 0; a < 2; ++a) {
      EXPECT_GT(counts[a].in, 0) << "agent " << a << " streamed nothing (" << layoutName(layout)
                                 << ")";
      EXPECT_GT(counts[a].out, 0) << "agent " << a << " published no result early ("
                                  << layoutName(layout) << ")";
    }
  }
  auto in_only = runChecks("xstreamin", {2, 1}, {{"KOLO_STREAM_COPY_OUT", "false"}});
  ASSERT_EQ(in_only.size(), 2u);
  for (int a = 0; a < 2; ++a) {
    EXPECT_GT(in_only[a].in, 0) << "agent " << a;
    EXPECT_EQ(in_only[a].out, 0) << "agent " << a;
  }
  auto off = runChecks("xstreamoff", {1, 1}, {{"KOLO_STREAM_COPY_IN", "false"}});
  ASSERT_EQ(off.size(), 2u);
  for (int a = 0; a < 2; ++a) {
    EXPECT_EQ(off[a].in, 0) << "agent " << a;
    EXPECT_EQ(off[a].out, 0) << "agent " << a;
  }
}

// Small cached allreduces travel inside the negotiation message
// (--cross-inline-bytes): every dtype and op, many at once next to larger
// ones, round after round, exact on every rank.
TEST_P(MultiAgent, InlineSmallAllreducesMatchReference) {
  const std::vector<int>& sizes = GetParam();
  runCheckJob(checkBin(), sizes, "inl-" + layoutName(sizes), {"inline", "12"}, "inline checks passed",
              std::chrono::seconds(240));
}

// The timeline shows which ones went inline: with the default, the small
// ones after the first round (cached) and not the 400-byte float64 ones;
// with --cross-inline-bytes 0, none.
TEST(MultiAgentInline, TimelineShowsInlineAllreducesAndTheKnobTurnsThemOff) {
  std::string trace;
  auto on = timelineArgs(checkBin(), {"inline", "3"}, "inl-on", {"CROSS_ALLREDUCE"}, "inline", "0", {}, &trace);
  ASSERT_FALSE(on.empty()) << trace.substr(0, 3000);
  EXPECT_EQ(on["CROSS_ALLREDUCE in.float32.sum.1"], "1") << trace.substr(0, 3000);
  EXPECT_EQ(on["CROSS_ALLREDUCE in.float16.product.7"], "1");
  EXPECT_EQ(on["CROSS_ALLREDUCE in.float64.sum.50"], "0");  // 400 bytes > 256
  auto off = timelineArgs(checkBin(), {"inline", "3"}, "inl-off", {"CROSS_ALLREDUCE"}, "inline", "0",
                          {{"KOLO_CROSS_INLINE_BYTES", "0"}}, &trace);
  ASSERT_FALSE(off.empty()) << trace.substr(0, 3000);
  for (const auto& [key, value] : off) EXPECT_EQ(value, "0") << key;
}

// With one local rank, the agents reduce the rank's slot in place: node0's
// timeline shows no LOCAL_REDUCE (the copy into a staging buffer) for an
// unscaled allreduce, and no copy back for a sum; an average is scaled in
// the slot afterwards; a prescaled one still goes through staging. Large
// ones (>= 8 MiB) cross in chunks ("pipelined" on CROSS_ALLREDUCE). Zero
// copy out of place, the same on the output slot.
TEST(MultiAgentInPlace, OneLocalRankSkipsTheStagingCopies) {
  std::string trace;
  timelineArgs(checkBin(), {"allreduce"}, "inplace", {}, "fused", "1", {}, &trace);
  ASSERT_FALSE(HasFailure());
  nlohmann::json j = nlohmann::json::parse(trace, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << trace.substr(0, 2000);
  const nlohmann::json& evs = j.is_array() ? j : j.value("traceEvents", nlohmann::json::array());
  std::map<int64_t, std::string> tensor_of;
  for (const auto& e : evs) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      tensor_of[e.value("pid", int64_t{0})] = e["args"].value("name", "");
    }
  }
  std::map<std::string, std::set<std::string>> acts;  // tensor -> activities begun
  for (const auto& e : evs) {
    const std::string ph = e.value("ph", "");
    if ((ph == "B" || ph == "X") && e.contains("name")) acts[tensor_of[e.value("pid", int64_t{0})]].insert(e.value("name", ""));
  }
  auto has = [&](const std::string& t, const std::string& a) { return acts[t].count(a) > 0; };
  // 8 MiB float32 sum, zero copy: the ring runs on the slot, nothing else.
  ASSERT_TRUE(has("zc.big", "NEGOTIATE_ACROSS_AGENTS")) << trace.substr(0, 3000);
  auto pipelined = timelineArgs(checkBin(), {"allreduce"}, "inplace-args", {"CROSS_ALLREDUCE"}, "pipelined", "0", {});
  EXPECT_EQ(pipelined["CROSS_ALLREDUCE zc.big"], "1");
  EXPECT_EQ(pipelined["CROSS_ALLREDUCE oop.big"], "0");
  EXPECT_EQ(pipelined["CROSS_ALLREDUCE scaled"], "0");
  EXPECT_FALSE(has("zc.big", "LOCAL_REDUCE"));
  EXPECT_FALSE(has("zc.big", "MEMCPY_OUT_FUSION_BUFFER"));
  // Zero copy out of place, 8 MiB: the backend reduces the input slot into
  // the output slot chunk by chunk; no copy anywhere. A small one is copied
  // into the output first (LOCAL_REDUCE), then reduced there.
  EXPECT_EQ(pipelined["CROSS_ALLREDUCE zcoop.big"], "1");
  EXPECT_EQ(pipelined["CROSS_ALLREDUCE zcoop.avg"], "1");
  EXPECT_TRUE(has("zcoop.big", "NEGOTIATE_ACROSS_AGENTS")) << trace.substr(0, 3000);
  EXPECT_FALSE(has("zcoop.big", "LOCAL_REDUCE"));
  EXPECT_FALSE(has("zcoop.big", "MEMCPY_OUT_FUSION_BUFFER"));
  EXPECT_FALSE(has("zcoop.avg", "LOCAL_REDUCE"));
  EXPECT_TRUE(has("zcoop.small", "LOCAL_REDUCE"));
  EXPECT_FALSE(has("zcoop.small", "MEMCPY_OUT_FUSION_BUFFER"));
  // 4 MiB average (below cross-pipeline-kb): no copy in; the division
  // runs in the slot afterwards, as the agent's copy-out step.
  EXPECT_FALSE(has("oop.big", "LOCAL_REDUCE"));
  EXPECT_TRUE(has("oop.big", "MEMCPY_OUT_FUSION_BUFFER"));
  // Prescaled: the scaling copy into staging stays.
  EXPECT_TRUE(has("scaled", "LOCAL_REDUCE"));
  // A small sum on its own: in place too.
  EXPECT_FALSE(has("t.float32.sum.1001", "LOCAL_REDUCE"));
  EXPECT_FALSE(has("t.float32.sum.1001", "MEMCPY_OUT_FUSION_BUFFER"));
  // 64 at once (fused when they meet in a cycle): packed straight from the
  // slots; a fused one's result is copied out of the fused buffer.
  int fused_out = 0;
  for (int k = 0; k < 64; ++k) {
    const std::string t = "async." + std::to_string(k);
    ASSERT_TRUE(has(t, "NEGOTIATE_ACROSS_AGENTS")) << t;
    EXPECT_FALSE(has(t, "LOCAL_REDUCE")) << t;
    fused_out += has(t, "MEMCPY_OUT_FUSION_BUFFER");
  }
  std::printf("%d of the 64 async allreduces were copied out of a fused buffer\n", fused_out);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MultiAgent,
                         ::testing::Values(std::vector<int>{1, 1}, std::vector<int>{2, 2},
                                           std::vector<int>{1, 2, 1}, std::vector<int>{1, 1, 1, 1}));

TEST(MultiAgentFaults, MismatchAcrossNodesNamesRanksOnBothSides) {
  Cluster c(2);
  ASSERT_TRUE(c.ok()) << c.error();
  // Ranks 0,1 on node0 and 2 on node1: the dtype differs only on node1.
  auto ranks = c.launchMultiJob("xmm", {2, 1}, {checkBin(), "mismatch"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << allLogs(c, 2);
  for (auto& p : ranks) {
    EXPECT_EQ(p.exit_code, 0) << p.output() << allLogs(c, 2);
    EXPECT_NE(p.output().find("OK mismatch errors reported and job recovered"), std::string::npos) << p.output();
  }
}

// Node loss: agent 1 of `c` is SIGKILLed while the job loops over
// allreduces of `count` floats on `layout`; the first rank (on agent 0) must
// fail with PEER_FAILURE naming the lost node (`lost_name`) within the
// heartbeat timeout, and every rank must end.
void killAgentOneMidJob(Cluster& c, const std::string& job, const std::vector<int>& layout,
                        size_t count, const std::string& lost_name) {
  auto ranks = c.launchMultiJob(job, layout, {checkBin(), "loop", "1000000", std::to_string(count)});
  // Let the job run, then kill node1's agent mid-collective.
  ASSERT_FALSE(waitProcess(ranks[0], std::chrono::milliseconds(1500))) << ranks[0].output() << allLogs(c, 2);
  killProcess(c.agent(1), SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(waitProcess(ranks[0], std::chrono::seconds(10))) << "rank 0 hangs\n" << allLogs(c, 2);
  double detect = std::chrono::duration<double>(ranks[0].ended - killed).count();
  std::string out = ranks[0].output();
  EXPECT_EQ(ranks[0].exit_code, 1) << out;
  EXPECT_NE(out.find("PEER_FAILURE"), std::string::npos) << out;
  EXPECT_NE(out.find(lost_name), std::string::npos) << "the error must name the lost node:\n"
                                                    << out;
  EXPECT_LT(detect, 5.0) << out;
  for (size_t r = 1; r < ranks.size(); ++r) {
    ASSERT_TRUE(waitProcess(ranks[r], std::chrono::seconds(10))) << "rank " << r << " hangs";
    EXPECT_NE(ranks[r].exit_code, 0) << ranks[r].output();
  }
}

void killedAgentFailsEveryRank(const std::string& job, const std::vector<int>& layout, size_t count,
                               std::map<std::string, std::string> agent_env = {}) {
  Cluster c(2, std::move(agent_env));
  ASSERT_TRUE(c.ok()) << c.error();
  killAgentOneMidJob(c, job, layout, count, "node1");
}

// 16 MiB allreduces cross in chunks (pipelined): node0 fills and drains a
// staging buffer for its two ranks while node1 is lost.
TEST(MultiAgentFaults, KilledAgentFailsEveryRankDuringAPipelinedAllreduce) {
  killedAgentFailsEveryRank("nodeloss-big", {2, 1}, 4u << 20);
}

TEST(MultiAgentFaults, KilledAgentFailsEveryRankNamingTheNode) {
  killedAgentFailsEveryRank("nodeloss", {1, 1}, 4096);
}

// The same over the tcp backend (the kernel closes the lost agent's
// sockets): small allreduces, then pipelined 16 MiB ones.
TEST(MultiAgentFaults, KilledAgentFailsEveryRankOverTheTcpBackend) {
  killedAgentFailsEveryRank("nodeloss-tcp", {1, 1}, 4096, {{"KOLO_BACKEND", "tcp"}});
  killedAgentFailsEveryRank("nodeloss-tcp-big", {2, 1}, 4u << 20, {{"KOLO_BACKEND", "tcp"}});
}

// A coordinator that sends compact Worlds to every job (--brief-world-slots
// 0; by default only jobs of more than 256 agents get them): the agents
// place themselves from their own slot and the local sizes, the job is
// exact across them, and a lost node is named by its cross rank.
TEST(MultiAgentCompactWorld, JobIsExactAndALostNodeIsNamedByCrossRank) {
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_args = {"--brief-world-slots", "0"};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("compact", {2, 1}, {checkBin(), "allreduce"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << allLogs(c, 2);
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
    EXPECT_NE(r.output().find("allreduce checks passed"), std::string::npos) << r.output();
  }
  EXPECT_NE(
      c.agentLog(1).find("job compact generation 1: 3 ranks on 2 agents; local ranks start at 2"),
      std::string::npos)
      << c.agentLog(1);
  killAgentOneMidJob(c, "compact-loss", {1, 1}, 4096, "lost node at cross rank 1");
}

// The agents' collectives over the tcp backend instead of ucx: every dtype
// and op, odd sizes, empty tensors and the 1M-element (pipelined) cases, on
// the mixed layout.
TEST(MultiAgentTcp, EveryDtypeOpAndSizeMatchesReference) {
  Cluster c(3, {{"KOLO_BACKEND", "tcp"}, {"KOLO_CROSS_PIPELINE_KB", "2048"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("multitcp", {1, 2, 1}, {checkBin(), "allreduce", "--big"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << allLogs(c, 3);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << allLogs(c, 3);
    EXPECT_NE(ranks[r].output().find("allreduce checks passed"), std::string::npos) << ranks[r].output();
  }
  // The agents did use it.
  EXPECT_NE(c.agentLog(0).find("job multitcp: backend tcp (set by agent rank 0)"),
            std::string::npos)
      << c.agentLog(0);
}

// The default backend (auto): both agents agree before they connect, and
// `kolo job` on each says which and why (agent/backends/backend_choice.h).
TEST(MultiAgentBackend, AutoIsAgreedBeforeConnectingAndKoloJobSaysWhich) {
  Cluster c(2);
  ASSERT_TRUE(c.ok()) << c.error();
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool rdma =
      fs::exists("/sys/class/infiniband", ec) && !fs::is_empty("/sys/class/infiniband", ec);
  const std::string stop = c.dir() + "/stop-auto", steps = c.dir() + "/steps-auto";
  auto ranks = c.launchMultiJob("auto", {1, 1}, {checkBin(), "until", stop},
                                {{"KOLO_CHECK_PROGRESS", steps}});
  std::string step;
  ASSERT_TRUE(waitForFile(steps, ranks[0], std::chrono::seconds(60), &step)) << allLogs(c, 2);
  for (int a = 0; a < 2; ++a) {
    Proc p = spawnProcess({binDir() + "/kolo", "job", "auto", "--agent", c.agentRpc(a)}, {},
                          c.dir() + "/kolo-job-" + std::to_string(a) + ".log");
    ASSERT_TRUE(waitProcess(p, std::chrono::seconds(20)));
    EXPECT_EQ(p.exit_code, 0) << p.output();
    const std::string want = rdma ? "ucx (auto: every agent has RDMA"
                                  : "tcp (auto: agent rank 0 offers tcp (no RDMA device))";
    EXPECT_NE(p.output().find(want), std::string::npos) << p.output();
    EXPECT_NE(c.agentLog(a).find("job auto: backend " + std::string(rdma ? "ucx" : "tcp")),
              std::string::npos)
        << c.agentLog(a);
  }
  std::ofstream(stop) << "stop\n";
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << allLogs(c, 2);
  for (auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
}

// Agents set to different backends fail the job on every rank with the
// reason, within the backend timeout, instead of half connecting.
TEST(MultiAgentBackend, AgentsSetToDifferentBackendsFailTheJobNamingBoth) {
  ClusterOptions o;
  o.agents = 2;
  o.agent_env = {{"KOLO_BACKEND_TIMEOUT_MS", "5000"}};
  o.per_agent_env = {{{"KOLO_BACKEND", "tcp"}}, {{"KOLO_BACKEND", "ucx"}}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("clash", {1, 1}, {checkBin(), "loop", "3"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(30))) << allLogs(c, 2);
  for (auto& r : ranks) {
    EXPECT_NE(r.exit_code, 0) << r.output();
    EXPECT_NE(
        r.output().find(
            "the agents disagree on the backend: agent rank 0 is set to tcp, agent rank 1 to ucx"),
        std::string::npos)
        << r.output() << allLogs(c, 2);
  }
}

}  // namespace
}  // namespace kolo::testing
