// compactJobWorld: the agent's view of a compact brief World (a job of more
// agents than the coordinator's --brief-world-slots).
#include "agent/coord/compact_world.h"

#include <gtest/gtest.h>

namespace kolo {
namespace {

coord::World compact(const std::vector<int>& sizes, const std::string& self, int cross_rank,
                     int rank_offset, int local_size) {
  coord::World w;
  w.set_job_id("big");
  w.set_generation(3);
  w.set_state(coord::RUNNING);
  int total = 0;
  for (int n : sizes) {
    w.add_local_sizes(n);
    total += n;
  }
  w.set_world_size(total);
  if (!self.empty()) {
    w.mutable_self()->mutable_agent()->set_agent_id(self);
    w.mutable_self()->mutable_agent()->set_hostname("host-" + self);
    w.mutable_self()->set_cross_rank(cross_rank);
    w.mutable_self()->set_rank_offset(rank_offset);
    w.mutable_self()->set_local_size(local_size);
  }
  return w;
}

TEST(CompactWorld, OffsetsAreThePrefixSumsAndTheSelfPlacesThisAgent) {
  JobWorld jw;
  bool found = false;
  ASSERT_TRUE(compactJobWorld(compact({2, 1, 4, 3}, "me", 2, 3, 4), "me", &jw, &found).isOk());
  EXPECT_TRUE(found);
  EXPECT_EQ(jw.cross_size, 4);
  EXPECT_EQ(jw.cross_rank, 2);
  EXPECT_EQ(jw.rank_offset, 3);
  EXPECT_EQ(jw.rank_offsets, (std::vector<int>{0, 2, 3, 7}));
  EXPECT_EQ(jw.local_sizes, (std::vector<int>{2, 1, 4, 3}));
  EXPECT_EQ(jw.crossRankOf(8), 3);
  ASSERT_EQ(jw.agents.size(), 4u);
  EXPECT_EQ(jw.agents[2], "me (host host-me)");
  EXPECT_EQ(jw.agents[1], "at cross rank 1");
}

TEST(CompactWorld, NoSelfOrAnotherAgentsIsNotFound) {
  JobWorld jw;
  bool found = true;
  ASSERT_TRUE(compactJobWorld(compact({1, 1}, "", 0, 0, 0), "me", &jw, &found).isOk());
  EXPECT_FALSE(found);
  found = true;
  ASSERT_TRUE(compactJobWorld(compact({1, 1}, "other", 1, 1, 1), "me", &jw, &found).isOk());
  EXPECT_FALSE(found);
}

TEST(CompactWorld, ContradictionsAreInternalErrorsNamingTheJob) {
  JobWorld jw;
  bool found = false;
  Status st = compactJobWorld(compact({2, 2}, "me", 2, 4, 2), "me", &jw, &found);
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("puts this agent at cross rank 2 of 2"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("job big (generation 3)"), std::string::npos) << st.message();
  st = compactJobWorld(compact({2, 2}, "me", 1, 1, 2), "me", &jw, &found);
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(
      st.message().find("gives this agent ranks 1 + 2 at cross rank 1, but its sizes say 2 + 2"),
      std::string::npos)
      << st.message();
  coord::World w = compact({2, 2}, "me", 0, 0, 2);
  w.set_world_size(5);
  st = compactJobWorld(w, "me", &jw, &found);
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("ranks add up to 4, not its world size 5"), std::string::npos)
      << st.message();
  w = compact({2, 0}, "me", 0, 0, 2);
  st = compactJobWorld(w, "me", &jw, &found);
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("gives cross rank 1 0 ranks"), std::string::npos) << st.message();
}

// World.local_size_runs: (count, local size) pairs instead of local_sizes.
TEST(CompactWorld, RunsReadAsTheLocalSizesTheyEncode) {
  coord::World w = compact({}, "me", 4, 5, 4);
  for (int v : {3, 1, 1, 2, 2, 4}) w.add_local_size_runs(v);  // 1 1 1 2 4 4
  w.set_world_size(13);
  JobWorld jw;
  bool found = false;
  ASSERT_TRUE(compactJobWorld(w, "me", &jw, &found).isOk());
  EXPECT_TRUE(found);
  EXPECT_EQ(jw.cross_size, 6);
  EXPECT_EQ(jw.local_sizes, (std::vector<int>{1, 1, 1, 2, 4, 4}));
  EXPECT_EQ(jw.rank_offsets, (std::vector<int>{0, 1, 2, 3, 5, 9}));
  EXPECT_EQ(jw.cross_rank, 4);
  EXPECT_EQ(jw.agents[4], "me (host host-me)");
  EXPECT_EQ(jw.agents[5], "at cross rank 5");
}

TEST(CompactWorld, BadRunsAreInternalErrorsAndNeverExpandPastTheWorldSize) {
  JobWorld jw;
  bool found = false;
  auto withRuns = [](std::vector<int> runs, int world_size) {
    coord::World w = compact({}, "me", 0, 0, 1);
    for (int v : runs) w.add_local_size_runs(v);
    w.set_world_size(world_size);
    return w;
  };
  Status st = compactJobWorld(withRuns({2, 1, 3}, 5), "me", &jw, &found);
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("carries 3 local-size run numbers (expected (count, local size) "
                              "pairs alone)"),
            std::string::npos)
      << st.message();
  st = compactJobWorld(withRuns({0, 1}, 1), "me", &jw, &found);
  EXPECT_NE(st.message().find("repeats a local size 0 times"), std::string::npos) << st.message();
  // A count of 2^31-1 from a broken coordinator stops at the world size, at once.
  st = compactJobWorld(withRuns({2147483647, 1}, 8), "me", &jw, &found);
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("its agents' ranks pass its world size 8 at cross rank 8"),
            std::string::npos)
      << st.message();
  coord::World both = withRuns({1, 1}, 2);
  both.add_local_sizes(1);
  st = compactJobWorld(both, "me", &jw, &found);
  EXPECT_NE(st.message().find("2 local-size run numbers and local sizes"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace kolo
