// Join, grouped allreduce, out-of-place broadcast and compressed allreduce
// end to end: real kolo-coordinator and kolo-agent binaries, rank processes
// running kolo_check_ops, on one agent (N = 1, 2, 4) and over several agents
// (K = 2, 3 with 1-2 local ranks each).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
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
  char dir[] = "/tmp/kolo-grp-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/trace-%a.json";
  const std::string p0 = std::string(dir) + "/trace-node0.json", p1 = std::string(dir) + "/trace-node1.json";
  {
    Cluster c(2, {{"KOLO_TIMELINE_FILENAME", path}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob("grpfuse", {1, 1}, {checkBin(), "grouped"});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(120))) << allLogs(c, 2);
    for (auto& r : ranks) ASSERT_EQ(r.exit_code, 0) << r.output();
  }  // the agents stop: the trace is complete
  std::ifstream f(p0);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ss.str().substr(0, 2000);
  const nlohmann::json& evs = j.is_array() ? j : j.value("traceEvents", nlohmann::json::array());
  std::map<int64_t, std::string> tensor_of;
  for (const auto& e : evs) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      tensor_of[e.value("pid", int64_t{0})] = e["args"].value("name", "");
    }
  }
  std::map<std::string, std::string> fused;  // tensor -> "fused" of its CROSS_ALLREDUCE
  for (const auto& e : evs) {
    if (e.value("name", "") != "CROSS_ALLREDUCE" || !e.contains("args")) continue;
    fused[tensor_of[e.value("pid", int64_t{0})]] = e["args"].value("fused", "1");
  }
  EXPECT_EQ(fused["grp.cpp.a"], "2") << ss.str().substr(0, 3000);
  EXPECT_EQ(fused["grp.cpp.b"], "2");
  std::remove(p0.c_str());
  std::remove(p1.c_str());
  ::rmdir(dir);
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
