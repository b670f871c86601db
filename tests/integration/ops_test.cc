// Join, grouped allreduce, out-of-place broadcast and compressed allreduce
// end to end: real kolo-coordinator and kolo-agent binaries, rank processes
// running kolo_check_ops, on one agent (N = 1, 2, 4) and over several agents
// (K = 2, 3 with 1-2 local ranks each).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check_ops"; }

std::string layoutName(const std::vector<int>& sizes) {
  std::string s;
  for (int n : sizes) s += (s.empty() ? "" : "_") + std::to_string(n);
  return s;
}

std::string allLogs(Cluster& c, int agents) {
  std::string s;
  for (int i = 0; i < agents; ++i) s += "--- agent " + std::to_string(i) + "\n" + c.agentLog(i);
  return s;
}

void runJob(const std::vector<int>& sizes, const std::string& job, const std::vector<std::string>& args,
            const std::string& needle, std::chrono::seconds timeout = std::chrono::seconds(180)) {
  int k = static_cast<int>(sizes.size());
  Cluster c(k);
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<std::string> argv = {checkBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto ranks = k == 1 ? c.launchJob(job, sizes[0], argv) : c.launchMultiJob(job, sizes, argv);
  ASSERT_TRUE(c.waitJob(ranks, timeout)) << "ranks did not finish\n" << allLogs(c, k);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << " output:\n" << out << allLogs(c, k);
    EXPECT_NE(out.find(needle), std::string::npos) << "rank " << r << " output:\n" << out;
  }
}

class Ops : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(Ops, JoinRanksRunningOutAtDifferentStepsContributeZeros) {
  const auto& sizes = GetParam();
  runJob(sizes, "join" + layoutName(sizes), {"join", layoutName(sizes)}, "join checks passed");
}

TEST_P(Ops, GroupedAllreduceMatchesReferenceAndMembershipMismatchFailsTheGroup) {
  const auto& sizes = GetParam();
  runJob(sizes, "grp" + layoutName(sizes), {"grouped"}, "grouped allreduce checks passed");
}

TEST_P(Ops, BroadcastOutOfPlaceLeavesInputAndFillsOutput) {
  const auto& sizes = GetParam();
  runJob(sizes, "boop" + layoutName(sizes), {"broadcast-oop"}, "out-of-place broadcast checks passed");
}

TEST_P(Ops, CompressedAllreduceMatchesWireTypeReference) {
  const auto& sizes = GetParam();
  runJob(sizes, "cmp" + layoutName(sizes), {"compressed", layoutName(sizes)}, "compressed allreduce checks passed");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Ops,
                         ::testing::Values(std::vector<int>{1}, std::vector<int>{2}, std::vector<int>{4},
                                           std::vector<int>{1, 1}, std::vector<int>{2, 1},
                                           std::vector<int>{1, 2, 1}),
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return "agents_" + layoutName(info.param);
                         });

}  // namespace
}  // namespace kolo::testing
