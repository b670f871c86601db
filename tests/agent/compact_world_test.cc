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

}  // namespace
}  // namespace kolo
