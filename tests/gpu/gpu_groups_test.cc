// planGpuGroups (agent/gpu/gpu_groups.h): the grouping of a device op's
// local ranks by GPU and the route across the node's GPUs.
#include "agent/gpu/gpu_groups.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace kolo::gpu {
namespace {

auto allPeers = [](int, int) { return true; };
auto noPeers = [](int, int) { return false; };

std::vector<std::vector<int>> ranksOf(const GpuGroupPlan& p) {
  std::vector<std::vector<int>> out;
  for (const GpuGroup& g : p.groups) out.push_back(g.ranks);
  return out;
}

TEST(GpuGroups, OneGpuIsOneGroup) {
  auto p = planGpuGroups("t", {2, 2, 2}, noPeers, false, 16);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p->route, NodeRoute::kOneGpu);
  ASSERT_EQ(p->groups.size(), 1u);
  EXPECT_EQ(p->groups[0].gpu, 2);
  EXPECT_EQ(p->groups[0].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p->leader(), 2);
}

TEST(GpuGroups, GroupsByAscendingOrdinalLeaderLowest) {
  auto p = planGpuGroups("t", {3, 1, 3, 0, 1}, allPeers, false, 16);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p->route, NodeRoute::kPeerKernel);
  ASSERT_EQ(p->groups.size(), 3u);
  EXPECT_EQ(p->groups[0].gpu, 0);
  EXPECT_EQ(p->groups[1].gpu, 1);
  EXPECT_EQ(p->groups[2].gpu, 3);
  EXPECT_EQ(ranksOf(*p), (std::vector<std::vector<int>>{{3}, {1, 4}, {0, 2}}));
  EXPECT_EQ(p->leader(), 0);
  EXPECT_EQ(p->groupOf(4), 1);
  EXPECT_EQ(p->groupOf(2), 2);
  EXPECT_EQ(p->groupOf(9), -1);
}

TEST(GpuGroups, AsksEveryOrderedPairOnce) {
  std::multiset<std::pair<int, int>> asked;
  auto p = planGpuGroups(
      "t", {0, 1, 2, 1},
      [&](int a, int b) {
        asked.insert({a, b});
        return true;
      },
      false, 16);
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(asked,
            (std::multiset<std::pair<int, int>>{{0, 1}, {0, 2}, {1, 0}, {1, 2}, {2, 0}, {2, 1}}));
}

TEST(GpuGroups, OnePairWithoutPeerAccessTakesNodeNccl) {
  auto p = planGpuGroups(
      "t", {0, 1, 2}, [](int a, int b) { return !(a == 2 && b == 0); }, true, 16);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p->route, NodeRoute::kNodeNccl);
  p = planGpuGroups("t", {1, 0}, noPeers, true, 16);
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->route, NodeRoute::kNodeNccl);
  EXPECT_EQ(ranksOf(*p), (std::vector<std::vector<int>>{{1}, {0}}));
}

TEST(GpuGroups, RefusalTexts) {
  auto p = planGpuGroups("t", {0, 1}, noPeers, false, 16);
  ASSERT_FALSE(p.isOk());
  EXPECT_EQ(p.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "tensor 't': local ranks on GPUs without peer access (GPU 0 cannot access GPU 1) need "
            "the node-local NCCL communicator, and this kolo-agent was built without NCCL");
  p = planGpuGroups("t", {0, -1}, allPeers, true, 16);
  ASSERT_FALSE(p.isOk());
  EXPECT_EQ(p.status().message(), "tensor 't': local rank 1's GPU is not known to the agent");
  p = planGpuGroups("t", {}, allPeers, true, 16);
  ASSERT_FALSE(p.isOk());
  EXPECT_EQ(p.status().message(), "tensor 't': a device op without local ranks");
  p = planGpuGroups("t", {0, 1, 2}, allPeers, true, 2);
  ASSERT_FALSE(p.isOk());
  EXPECT_EQ(p.status().message(), "tensor 't': local ranks on 3 GPUs; at most 2 are wired");
  EXPECT_STREQ(nodeRouteName(NodeRoute::kNodeNccl), "node-local NCCL");
}

}  // namespace
}  // namespace kolo::gpu
