// Process sets and grouped allgather / reducescatter end to end: real
// kolo-coordinator and kolo-agent binaries, rank processes running
// kolo_check_sets, on one agent and over several agents.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check_sets"; }

class Sets : public ::testing::TestWithParam<std::vector<int>> {};

// Even ranks, odd ranks and {0, last} as sets: every collective on each,
// against references; the same name in flight on two sets; one set runs 20
// allreduces (and the job a barrier) while another set's op waits for a
// member; non-member, unknown-set, root, mismatch, disagreement, duplicate
// and removal errors.
TEST_P(Sets, EveryCollectiveOnTwoSetsAtOnceAndTheirErrors) {
  runCheckJob(checkBin(), GetParam(), "sets-" + layoutName(GetParam()), {"sets"}, "process-set checks passed",
              std::chrono::seconds(240));
}

// The same suite on the global set, and a grouped allgather whose members
// differ across ranks.
TEST_P(Sets, GroupedAllgatherAndReducescatterOnTheGlobalSet) {
  runCheckJob(checkBin(), GetParam(), "grouped-" + layoutName(GetParam()), {"grouped"}, "grouped checks passed",
              std::chrono::seconds(240));
}

// Across agents the allgathers of a group go out next to each other and
// travel as one fused allgather, and so do the reducescatters: the timeline
// shows each member's CROSS_ALLGATHER / CROSS_REDUCESCATTER with fused = 2.
TEST(SetsTimeline, GroupedAllgathersAndReducescattersFuseAcrossAgents) {
  std::string trace;
  auto fused =
      fusedInTimeline(checkBin(), {"grouped"}, "gfuse", {"CROSS_ALLGATHER", "CROSS_REDUCESCATTER"}, &trace);
  // gag.1 is empty on every rank: it never crosses agents.
  EXPECT_EQ(fused["CROSS_ALLGATHER gag.0"], "2") << trace.substr(0, 3000);
  EXPECT_EQ(fused["CROSS_ALLGATHER gag.2"], "2");
  EXPECT_EQ(fused["CROSS_REDUCESCATTER grs.0"], "2");
  EXPECT_EQ(fused["CROSS_REDUCESCATTER grs.1"], "2");
  EXPECT_EQ(fused.count("CROSS_ALLGATHER gag.1"), 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Sets,
                         ::testing::Values(std::vector<int>{3}, std::vector<int>{4}, std::vector<int>{2, 2},
                                           std::vector<int>{1, 2, 1}),
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return "agents_" + layoutName(info.param);
                         });

}  // namespace
}  // namespace kolo::testing
