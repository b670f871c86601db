// Jobs spanning several agents on this machine (each agent acts as a node:
// its own socket, its own UCX worker), through the real daemons.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check"; }


class MultiAgent : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(MultiAgent, EveryDtypeOpAndSizeMatchesReference) {
  const std::vector<int>& sizes = GetParam();
  int k = static_cast<int>(sizes.size());
  Cluster c(k);
  ASSERT_TRUE(c.ok()) << c.error();
  std::string job = "multi";
  for (int n : sizes) job += std::to_string(n);
  auto ranks = c.launchMultiJob(job, sizes, {checkBin(), "allreduce"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << allLogs(c, k);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << allLogs(c, k);
    EXPECT_NE(ranks[r].output().find("allreduce checks passed"), std::string::npos) << ranks[r].output();
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

TEST(MultiAgentFaults, KilledAgentFailsEveryRankNamingTheNode) {
  Cluster c(2);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("nodeloss", {1, 1}, {checkBin(), "loop", "1000000"});
  // Let the job run, then kill node1's agent mid-collective.
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_FALSE(waitProcess(ranks[0], std::chrono::milliseconds(1500))) << ranks[0].output() << allLogs(c, 2);
  killProcess(c.agent(1), SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(waitProcess(ranks[0], std::chrono::seconds(10))) << "rank 0 hangs\n" << allLogs(c, 2);
  double detect = std::chrono::duration<double>(ranks[0].ended - killed).count();
  std::string out = ranks[0].output();
  EXPECT_EQ(ranks[0].exit_code, 1) << out;
  EXPECT_NE(out.find("PEER_FAILURE"), std::string::npos) << out;
  EXPECT_NE(out.find("node1"), std::string::npos) << "the error must name the lost node:\n" << out;
  EXPECT_LT(detect, 5.0) << out;
  (void)t0;
  ASSERT_TRUE(waitProcess(ranks[1], std::chrono::seconds(10)));  // its agent is gone: it fails too
  EXPECT_NE(ranks[1].exit_code, 0);
}

}  // namespace
}  // namespace kolo::testing
