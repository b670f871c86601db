// Process sets and grouped allgather / reducescatter end to end: real
// kolo-coordinator and kolo-agent binaries, rank processes running
// kolo_check_sets, on one agent and over several agents.
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
  char dir[] = "/tmp/kolo-gfuse-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/trace-%a.json";
  const std::string p0 = std::string(dir) + "/trace-node0.json", p1 = std::string(dir) + "/trace-node1.json";
  {
    Cluster c(2, {{"KOLO_TIMELINE_FILENAME", path}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob("gfuse", {1, 1}, {checkBin(), "grouped"});
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
  std::map<std::string, std::string> fused;  // "ACTIVITY tensor" -> its "fused"
  for (const auto& e : evs) {
    const std::string name = e.value("name", "");
    if ((name != "CROSS_ALLGATHER" && name != "CROSS_REDUCESCATTER") || !e.contains("args")) continue;
    fused[name + " " + tensor_of[e.value("pid", int64_t{0})]] = e["args"].value("fused", "1");
  }
  // gag.1 is empty on every rank: it never crosses agents.
  EXPECT_EQ(fused["CROSS_ALLGATHER gag.0"], "2") << ss.str().substr(0, 3000);
  EXPECT_EQ(fused["CROSS_ALLGATHER gag.2"], "2");
  EXPECT_EQ(fused["CROSS_REDUCESCATTER grs.0"], "2");
  EXPECT_EQ(fused["CROSS_REDUCESCATTER grs.1"], "2");
  EXPECT_EQ(fused.count("CROSS_ALLGATHER gag.1"), 0u);
  std::remove(p0.c_str());
  std::remove(p1.c_str());
  ::rmdir(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Sets,
                         ::testing::Values(std::vector<int>{3}, std::vector<int>{4}, std::vector<int>{2, 2},
                                           std::vector<int>{1, 2, 1}),
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return "agents_" + layoutName(info.param);
                         });

}  // namespace
}  // namespace kolo::testing
