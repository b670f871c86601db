// Join, grouped allreduce, out-of-place broadcast and compressed allreduce
// end to end: real kolo-coordinator and kolo-agent binaries, rank processes
// running kolo_check_ops, on one agent (N = 1, 2, 4) and over several agents
// (K = 2, 3 with 1-2 local ranks each).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check_ops"; }

// Runs this suite's check program on every rank of a job (harness.h).
void runJob(const std::vector<int>& sizes, const std::string& job, const std::vector<std::string>& args,
            const std::string& needle, std::chrono::seconds timeout = std::chrono::seconds(180)) {
  runCheckJob(checkBin(), sizes, job, args, needle, timeout);
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

// Across agents the members of a group go out next to each other, so two
// float32 members fuse into one reduction: the timeline shows both tensors'
// CROSS_ALLREDUCE with fused = 2.
TEST(OpsTimeline, GroupMembersFuseAcrossAgents) {
  std::string trace;
  auto fused = fusedInTimeline(checkBin(), {"grouped"}, "grpfuse", {"CROSS_ALLREDUCE"}, &trace);
  EXPECT_EQ(fused["CROSS_ALLREDUCE grp.cpp.a"], "2") << trace.substr(0, 3000);
  EXPECT_EQ(fused["CROSS_ALLREDUCE grp.cpp.b"], "2");
}

// Horovod's variables in the trainers' environment tune their job on
// system agents that were started without them: HOROVOD_FUSION_THRESHOLD=0
// turns fusion off for this job, so the group's members cross unfused.
TEST(OpsTimeline, TrainersEnvironmentSetsTheJobsFusionThreshold) {
  std::string trace;
  auto fused = timelineArgs(checkBin(), {"grouped"}, "grpnofuse", {"CROSS_ALLREDUCE"}, "fused", "1",
                            {}, &trace, {{"HOROVOD_FUSION_THRESHOLD", "0"}});
  ASSERT_FALSE(fused.empty()) << trace.substr(0, 3000);
  EXPECT_EQ(fused["CROSS_ALLREDUCE grp.cpp.a"], "1") << trace.substr(0, 3000);
  EXPECT_EQ(fused["CROSS_ALLREDUCE grp.cpp.b"], "1");
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
