// NegotiationState with joined agents (kolo_join): pure logic, every agent's
// state stepped through the same cycle as CrossJob runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "agent/cross/negotiation_state.h"
#include "common/dtype.h"
#include "tests/agent/negotiation_cycle.h"

namespace kolo {
namespace {
using testing_negotiation::cycle;
using testing_negotiation::request;

TEST(NegotiationJoin, JoinedAgentStandsInForUncachedNames) {
  NegotiationState a(0, 2, 16), b(1, 2, 16);
  a.setJoined(true);
  b.addLocal(request("x"));
  auto r1 = cycle({&a, &b});  // b announces x
  EXPECT_TRUE(r1[0].empty());
  EXPECT_TRUE(r1[1].empty());
  auto r2 = cycle({&a, &b});  // a stands in: x completes on both
  ASSERT_EQ(r2[0].size(), 1u);
  ASSERT_EQ(r2[1].size(), 1u);
  EXPECT_EQ(r2[0][0].name, "x");
  EXPECT_EQ(r2[1][0].name, "x");
  EXPECT_TRUE(r2[0][0].error.isOk());
  EXPECT_EQ(r2[0][0].params.data_bytes, 16u);  // what a's zero contribution is built from
}

TEST(NegotiationJoin, JoinedAgentSetsEveryCachedBit) {
  NegotiationState a(0, 2, 16), b(1, 2, 16);
  a.addLocal(request("x"));
  b.addLocal(request("x"));
  auto r = cycle({&a, &b});
  ASSERT_EQ(r[0].size(), 1u);  // x is cached now
  a.setJoined(true);
  r = cycle({&a, &b});  // a's first joined cycle: it stands in from the next one
  EXPECT_TRUE(r[0].empty());
  b.addLocal(request("x"));
  r = cycle({&a, &b});
  ASSERT_EQ(r[1].size(), 1u);
  EXPECT_EQ(r[0].size(), 1u);
  EXPECT_TRUE(r[1][0].error.isOk());
}

TEST(NegotiationJoin, WhenEveryAgentHasJoinedOnlyNamesSomeoneHasComplete) {
  NegotiationState a(0, 2, 16), b(1, 2, 16);
  for (const char* n : {"x", "y"}) {
    a.addLocal(request(n));
    b.addLocal(request(n));
  }
  auto r = cycle({&a, &b});
  ASSERT_EQ(r[0].size(), 2u);  // x and y are cached
  a.setJoined(true);
  b.setJoined(true);
  for (int i = 0; i < 3; ++i) {  // nobody has anything: no response, though both stand in
    r = cycle({&a, &b});
    EXPECT_TRUE(r[0].empty()) << "cycle " << i << ": " << r[0][0].name;
    EXPECT_TRUE(r[1].empty());
  }
  a.addLocal(request("x"));  // a rank's last submission, still negotiating after it joined
  r = cycle({&a, &b});
  ASSERT_EQ(r[0].size(), 1u);
  ASSERT_EQ(r[1].size(), 1u);
  EXPECT_EQ(r[0][0].name, "x");
  EXPECT_EQ(r[1][0].name, "x");  // b takes part with zeros
  b.setJoined(false);
  a.setJoined(false);
  b.addLocal(request("y"));
  r = cycle({&a, &b});
  EXPECT_TRUE(r[1].empty());  // after the join round, y needs a again
}

TEST(NegotiationJoin, OnlyAllreduceGoesOnWhileAnAgentStandsIn) {
  NegotiationState a(0, 2, 16), b(1, 2, 16);
  a.setJoined(true);
  b.addLocal(request("g", CollectiveType::kBroadcast));
  b.addLocal(request("h", CollectiveType::kAllgather));
  cycle({&a, &b});
  auto r = cycle({&a, &b});
  ASSERT_EQ(r[0].size(), 2u);
  ASSERT_EQ(r[1].size(), 2u);
  EXPECT_EQ(r[1][0].name, "g");
  EXPECT_EQ(r[1][0].error.code(), Code::kInvalidArgument);
  EXPECT_EQ(r[1][0].error.message(), r[0][0].error.message());
  EXPECT_EQ(r[1][0].error.message(),
            "broadcast of tensor 'g' cannot run while every rank of a node has joined (kolo_join): until every rank "
            "has joined, only allreduce goes on (the joined ranks contribute zeros); allgather is not supported "
            "with join, as in Horovod (DistributedOptimizer: sparse_as_dense=True).");
  EXPECT_EQ(r[1][1].name, "h");
  EXPECT_EQ(r[1][1].error.code(), Code::kInvalidArgument);
  EXPECT_EQ(r[0][1].error.message(), r[1][1].error.message());
}

TEST(NegotiationJoin, NoStandInOnceJoinEnds) {
  NegotiationState a(0, 2, 16), b(1, 2, 16);
  a.setJoined(true);
  a.setJoined(false);
  b.addLocal(request("x"));
  cycle({&a, &b});
  auto r = cycle({&a, &b});
  EXPECT_TRUE(r[1].empty());  // x waits for a's ranks again
}

// Inline allreduces (CrossJob::cycle): the payload slots are a function of
// the cache alone, so two agents that cached the same names in the same
// order lay them out alike, whatever each has pending; only small,
// ungrouped allreduces get one, in bit order, while the region has room.
TEST(NegotiationInline, SlotsFollowTheCacheAndAreAlikeOnEveryAgent) {
  NegotiationState a(0, 2, 16), b(1, 2, 16);
  auto grouped = request("g", CollectiveType::kAllreduce, 2);
  grouped.params.group_id = 7;
  grouped.params.group_size = 1;
  std::vector<CrossRequest> reqs = {request("s1", CollectiveType::kAllreduce, 1),  // 4 B
                                    request("big", CollectiveType::kAllreduce, 100),  // 400 B
                                    request("bc", CollectiveType::kBroadcast, 2), grouped,
                                    request("s2", CollectiveType::kAllreduce, 3),  // 12 B
                                    request("s3", CollectiveType::kAllreduce, 60),   // 240 B
                                    request("ag.__sizes", CollectiveType::kAllreduce, 2)};  // an allgather's sizes
  for (const auto& r : reqs) {
    a.addLocal(r);
    b.addLocal(r);
  }
  auto done = cycle({&a, &b});  // announced by both: completed and cached, in the same order on both
  ASSERT_EQ(done[0].size(), reqs.size());
  ASSERT_EQ(done[1].size(), reqs.size());
  EXPECT_EQ(a.cachedNames(), reqs.size());
  EXPECT_TRUE(a.inlineSlots(0, 4096).empty());
  auto sa = a.inlineSlots(256, 4096);
  b.addLocal(request("s2", CollectiveType::kAllreduce, 3));  // pending on b only: no difference
  auto sb = b.inlineSlots(256, 4096);
  ASSERT_EQ(sa.size(), 3u);
  ASSERT_EQ(sb.size(), sa.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].name, sb[i].name);
    EXPECT_EQ(sa[i].bit, sb[i].bit);
    EXPECT_EQ(sa[i].offset, sb[i].offset);
    EXPECT_EQ(sa[i].bytes, sb[i].bytes);
  }
  EXPECT_EQ(sa[0].name, "s1");
  EXPECT_EQ(sa[0].offset, 0u);
  EXPECT_EQ(sa[0].bytes, 4u);
  EXPECT_EQ(sa[1].name, "s2");
  EXPECT_EQ(sa[1].offset, 8u);  // 8-byte aligned
  EXPECT_EQ(sa[2].name, "s3");
  EXPECT_EQ(sa[2].offset, 24u);
  EXPECT_LT(sa[0].bit, sa[1].bit);
  EXPECT_LT(sa[1].bit, sa[2].bit);
  // A region with room for the first two only stops there (bit order).
  auto small = a.inlineSlots(256, 100);
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(small[1].name, "s2");
}

}  // namespace
}  // namespace kolo
