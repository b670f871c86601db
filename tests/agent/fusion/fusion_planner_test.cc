#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "agent/fusion/chunk_planner.h"
#include "agent/fusion/fusion_planner.h"

namespace kolo::fusion {
namespace {

FusionEntry entry(std::string name, uint64_t bytes, DataType dt = DataType::kFloat32) {
  FusionEntry e;
  e.name = std::move(name);
  e.bytes = bytes;
  e.dtype = dt;
  return e;
}

// Names of each group, for compact assertions.
std::vector<std::vector<std::string>> names(const std::vector<FusionEntry>& in,
                                            const std::vector<FusedGroup>& groups) {
  std::vector<std::vector<std::string>> out;
  for (const auto& g : groups) {
    out.emplace_back();
    for (const auto& s : g.slots) out.back().push_back(in[s.index].name);
  }
  return out;
}

using Names = std::vector<std::vector<std::string>>;

TEST(FusionPlanner, FusesCompatibleEntriesWithAlignedOffsets) {
  std::vector<FusionEntry> in = {entry("a", 100), entry("b", 200), entry("c", 36)};
  auto groups = planFusion(in, {1000, 64});
  ASSERT_EQ(groups.size(), 1u);
  const auto& g = groups[0];
  ASSERT_EQ(g.slots.size(), 3u);
  EXPECT_TRUE(g.fused());
  EXPECT_EQ(g.slots[0].offset, 0u);
  EXPECT_EQ(g.slots[1].offset, 128u);
  EXPECT_EQ(g.slots[2].offset, 384u);
  EXPECT_EQ(g.slots[2].bytes, 36u);
  EXPECT_EQ(g.buffer_bytes, 420u);
}

TEST(FusionPlanner, RunningTotalStaysWithinThreshold) {
  const uint64_t mb = 1 << 20;
  std::vector<FusionEntry> in;
  for (int i = 0; i < 5; ++i) in.push_back(entry("t" + std::to_string(i), 40 * mb));
  auto groups = planFusion(in, {100 * mb, 64});
  EXPECT_EQ(names(in, groups), (Names{{"t0", "t1"}, {"t2", "t3"}, {"t4"}}));
  for (const auto& g : groups) EXPECT_LE(g.buffer_bytes, 100 * mb);
  EXPECT_FALSE(groups[2].fused());
}

TEST(FusionPlanner, AlignmentPaddingCountsAgainstThreshold) {
  // 100 + pad to 128 + 100 = 228 > 200: the second entry does not fit.
  std::vector<FusionEntry> in = {entry("a", 100), entry("b", 100)};
  EXPECT_EQ(names(in, planFusion(in, {200, 64})), (Names{{"a"}, {"b"}}));
  EXPECT_EQ(names(in, planFusion(in, {228, 64})), (Names{{"a", "b"}}));
}

TEST(FusionPlanner, ZeroThresholdDisablesFusion) {
  std::vector<FusionEntry> in = {entry("a", 8), entry("b", 8), entry("c", 8)};
  auto groups = planFusion(in, {0, 64});
  EXPECT_EQ(names(in, groups), (Names{{"a"}, {"b"}, {"c"}}));
}

TEST(FusionPlanner, EntryLargerThanThresholdGoesAlone) {
  std::vector<FusionEntry> in = {entry("big", 5000), entry("a", 10), entry("b", 10)};
  auto groups = planFusion(in, {1000, 64});
  EXPECT_EQ(names(in, groups), (Names{{"big"}, {"a", "b"}}));
  EXPECT_EQ(groups[0].buffer_bytes, 5000u);
}

TEST(FusionPlanner, EntriesAtOrAboveMaxEntryBytesAreNeverFused) {
  std::vector<FusionEntry> in = {entry("a", 10), entry("big", 500), entry("b", 10), entry("edge", 100),
                                 entry("c", 99)};
  FusionOptions o{1000, 64};
  o.max_entry_bytes = 100;
  auto groups = planFusion(in, o);
  // The small ones fuse around the large ones (look-ahead), the large ones go alone.
  EXPECT_EQ(names(in, groups), (Names{{"a", "b", "c"}, {"big"}, {"edge"}}));
  o.max_entry_bytes = 0;  // no limit: everything fits the threshold together
  EXPECT_EQ(names(in, planFusion(in, o)), (Names{{"a", "big", "b", "edge", "c"}}));
}

TEST(FusionPlanner, LookAheadSkipsOtherDtypesForMixedPrecision) {
  std::vector<FusionEntry> in = {entry("w1", 100, DataType::kFloat32),
                                 entry("h1", 100, DataType::kFloat16),
                                 entry("w2", 100, DataType::kFloat32),
                                 entry("h2", 100, DataType::kFloat16)};
  auto groups = planFusion(in, {1 << 20, 64});
  // Groups are ordered by their first entry; entries keep their order.
  EXPECT_EQ(names(in, groups), (Names{{"w1", "w2"}, {"h1", "h2"}}));
}

TEST(FusionPlanner, LookAheadStopsWhenFusedPlusSkippedExceedsThreshold) {
  std::vector<FusionEntry> ok = {entry("a", 100), entry("h", 900, DataType::kFloat16),
                                 entry("c", 100)};
  EXPECT_EQ(names(ok, planFusion(ok, {1000, 64})), (Names{{"a", "c"}, {"h"}}));
  std::vector<FusionEntry> stop = {entry("a", 100), entry("h", 950, DataType::kFloat16),
                                   entry("c", 100)};
  EXPECT_EQ(names(stop, planFusion(stop, {1000, 64})), (Names{{"a"}, {"h"}, {"c"}}));
}

TEST(FusionPlanner, EveryParameterMustMatch) {
  auto base = entry("x", 8);
  std::vector<std::function<void(FusionEntry&)>> changes = {
      [](FusionEntry& e) { e.dtype = DataType::kFloat64; },
      [](FusionEntry& e) { e.reduce_op = ReduceOp::kMax; },
      [](FusionEntry& e) { e.prescale = 0.5; },
      [](FusionEntry& e) { e.postscale = 0.25; },
      [](FusionEntry& e) { e.device = 0; },
      [](FusionEntry& e) { e.process_set = 3; },
      [](FusionEntry& e) { e.collective = CollectiveType::kReducescatter; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    FusionEntry other = base;
    other.name = "y";
    changes[i](other);
    // Put the odd one in the middle: look-ahead must join the outer two.
    std::vector<FusionEntry> in = {base, other, base};
    in[2].name = "z";
    EXPECT_EQ(names(in, planFusion(in, {4096, 64})), (Names{{"x", "z"}, {"y"}})) << "change " << i;
  }
}

TEST(FusionPlanner, OnlyAllreduceReducescatterAllgatherFuse) {
  for (auto c : {CollectiveType::kBroadcast, CollectiveType::kAlltoall, CollectiveType::kBarrier,
                 CollectiveType::kJoin}) {
    std::vector<FusionEntry> in = {entry("a", 8), entry("b", 8)};
    in[0].collective = in[1].collective = c;
    EXPECT_EQ(planFusion(in, {4096, 64}).size(), 2u) << collectiveName(c);
  }
  for (auto c : {CollectiveType::kAllreduce, CollectiveType::kReducescatter,
                 CollectiveType::kAllgather}) {
    std::vector<FusionEntry> in = {entry("a", 8), entry("b", 8)};
    in[0].collective = in[1].collective = c;
    EXPECT_EQ(planFusion(in, {4096, 64}).size(), 1u) << collectiveName(c);
  }
}

TEST(FusionPlanner, AllgatherIgnoresReduceOpAndScales) {
  std::vector<FusionEntry> in = {entry("a", 8), entry("b", 8)};
  for (auto& e : in) e.collective = CollectiveType::kAllgather;
  in[1].reduce_op = ReduceOp::kMax;
  in[1].prescale = 3;
  EXPECT_EQ(planFusion(in, {4096, 64}).size(), 1u);
}

TEST(FusionPlanner, RandomPlansKeepInvariants) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    std::vector<FusionEntry> in;
    int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      FusionEntry e = entry("t" + std::to_string(i), 1 + rng() % 3000,
                            rng() % 3 == 0 ? DataType::kFloat16 : DataType::kFloat32);
      if (rng() % 10 == 0) e.collective = CollectiveType::kBroadcast;
      if (rng() % 10 == 0) e.device = 0;
      in.push_back(e);
    }
    const uint64_t threshold = rng() % 4 == 0 ? 0 : 64 + rng() % 8000;
    auto groups = planFusion(in, {threshold, 64});
    std::vector<int> seen(in.size(), 0);
    size_t last_first = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const auto& g = groups[gi];
      ASSERT_FALSE(g.slots.empty());
      if (gi > 0) {
        EXPECT_GT(g.slots[0].index, last_first) << "groups ordered by first entry";
      }
      last_first = g.slots[0].index;
      uint64_t end = 0;
      for (size_t k = 0; k < g.slots.size(); ++k) {
        const auto& s = g.slots[k];
        seen[s.index]++;
        EXPECT_EQ(s.offset % 64, 0u);
        EXPECT_GE(s.offset, end);
        EXPECT_EQ(s.bytes, in[s.index].bytes);
        end = s.offset + s.bytes;
        if (k > 0) {
          EXPECT_GT(s.index, g.slots[k - 1].index);
          EXPECT_TRUE(compatible(in[g.slots[0].index], in[s.index]));
        }
      }
      EXPECT_EQ(g.buffer_bytes, end);
      if (g.fused()) {
        EXPECT_LE(g.buffer_bytes, threshold);
      }
      if (threshold == 0) {
        EXPECT_EQ(g.slots.size(), 1u);
      }
    }
    for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(seen[i], 1) << "entry " << i;
  }
}

TEST(ChunkPlanner, SplitsIntoAlignedChunks) {
  auto c = planChunks(1000, 256, 4);
  ASSERT_TRUE(c.isOk());
  ASSERT_EQ(c->size(), 4u);
  EXPECT_EQ((*c)[0].offset, 0u);
  EXPECT_EQ((*c)[1].offset, 256u);
  EXPECT_EQ((*c)[3].offset, 768u);
  EXPECT_EQ((*c)[3].bytes, 232u);

  // 100 rounds down to a whole cache line.
  c = planChunks(1000, 100, 4);
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ((*c)[0].bytes, 64u);
  EXPECT_EQ(c->size(), 16u);  // 15 x 64 + 40
  EXPECT_EQ(c->back().bytes, 40u);

  // Below a cache line: whole elements.
  c = planChunks(80, 60, 8);
  ASSERT_TRUE(c.isOk());
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[0].bytes, 56u);
  EXPECT_EQ((*c)[1].bytes, 24u);
}

TEST(ChunkPlanner, EdgeCases) {
  auto one = planChunks(4096, 0, 2);
  ASSERT_TRUE(one.isOk());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].bytes, 4096u);

  auto none = planChunks(0, 128, 4);
  ASSERT_TRUE(none.isOk());
  EXPECT_TRUE(none->empty());

  auto tiny = planChunks(16, 3, 8);  // limit below one element: one element per chunk
  ASSERT_TRUE(tiny.isOk());
  EXPECT_EQ(tiny->size(), 2u);

  EXPECT_FALSE(planChunks(10, 4, 4).isOk());
  EXPECT_FALSE(planChunks(10, 4, 0).isOk());
}

TEST(ChunkPlanner, ChunksCoverTheBufferExactly) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    size_t elem = size_t{1} << (rng() % 4);
    uint64_t total = (rng() % 100000) * elem;
    uint64_t max = rng() % 5000;
    auto c = planChunks(total, max, elem);
    ASSERT_TRUE(c.isOk());
    uint64_t pos = 0;
    for (const auto& ch : *c) {
      EXPECT_EQ(ch.offset, pos);
      EXPECT_EQ(ch.bytes % elem, 0u);
      EXPECT_GT(ch.bytes, 0u);
      if (max >= elem) {
        EXPECT_LE(ch.bytes, max);
      }
      pos += ch.bytes;
    }
    EXPECT_EQ(pos, total);
  }
}

}  // namespace
}  // namespace kolo::fusion
