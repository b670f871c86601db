// Host-only tests of the GPU kernels' planning (agent/gpu/plan.h): these run
// in every build, with or without CUDA.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "agent/gpu/plan.h"

namespace kolo::gpu {
namespace {

TEST(VectorSplit, AlignedBuffersAreAllVectorsPlusTail) {
  const uintptr_t a[] = {0x1000, 0x2000, 0x3000};
  VectorSplit s = planVectorSplit(a, 3, 1003, 4);
  EXPECT_EQ(s.elems_per_vector, 4u);
  EXPECT_EQ(s.head, 0u);
  EXPECT_EQ(s.vectors, 250u);
  EXPECT_EQ(s.tail, 3u);
}

TEST(VectorSplit, CommonMisalignmentGivesAScalarHead) {
  // float32 buffers all 4 bytes past a 16-byte boundary: 3 head elements.
  const uintptr_t a[] = {0x1004, 0x2004};
  VectorSplit s = planVectorSplit(a, 2, 100, 4);
  EXPECT_EQ(s.head, 3u);
  EXPECT_EQ(s.vectors, 24u);
  EXPECT_EQ(s.tail, 1u);
  EXPECT_EQ(s.head + s.vectors * s.elems_per_vector + s.tail, 100u);
}

TEST(VectorSplit, HeadLongerThanCountTakesEverything) {
  const uintptr_t a[] = {0x1002};
  VectorSplit s = planVectorSplit(a, 1, 3, 2);  // 7 head elements wanted, 3 exist
  EXPECT_EQ(s.head, 3u);
  EXPECT_EQ(s.vectors, 0u);
  EXPECT_EQ(s.tail, 0u);
}

TEST(VectorSplit, DifferentMisalignmentsFallBackToScalar) {
  const uintptr_t a[] = {0x1000, 0x2004};
  VectorSplit s = planVectorSplit(a, 2, 1000, 4);
  EXPECT_FALSE(s.vectorized());
  EXPECT_EQ(s.head, 1000u);
  EXPECT_EQ(s.tail, 0u);
}

TEST(VectorSplit, MisalignmentInsideAnElementFallsBackToScalar) {
  const uintptr_t a[] = {0x1002, 0x2002};  // float32 at 2 bytes past the boundary
  VectorSplit s = planVectorSplit(a, 2, 64, 4);
  EXPECT_FALSE(s.vectorized());
  EXPECT_EQ(s.head, 64u);
}

TEST(VectorSplit, EveryElementSizeAndOffsetCoversCountExactly) {
  for (size_t es : {1, 2, 4, 8}) {
    for (uintptr_t off = 0; off < 16; off += es) {
      for (size_t count : {0, 1, 15, 16, 17, 1000, 4099}) {
        const uintptr_t a[] = {0x10000 + off, 0x20000 + off};
        VectorSplit s = planVectorSplit(a, 2, count, es);
        EXPECT_EQ(s.head + s.vectors * s.elems_per_vector + s.tail, count)
            << "es=" << es << " off=" << off << " count=" << count;
        EXPECT_LT(s.tail, s.elems_per_vector);
        if (s.vectors > 0) {
          EXPECT_EQ((a[0] + s.head * es) % 16, 0u) << "vectors must start aligned";
        }
      }
    }
  }
}

std::vector<CopySegment> segs(std::initializer_list<std::tuple<uintptr_t, uintptr_t, size_t>> l) {
  std::vector<CopySegment> out;
  for (auto [s, d, n] : l)
    out.push_back({reinterpret_cast<const void*>(s), reinterpret_cast<void*>(d), n});
  return out;
}

TEST(BatchedCopyPlan, SplitsIntoChunksAndLaunches) {
  auto plan = planBatchedCopy(segs({{0x1000, 0x90000, 100}, {0x2000, 0xa0000, 0}, {0x3000, 0xb0000, 250}}),
                              /*chunk_bytes=*/100, /*max_items=*/2);
  ASSERT_TRUE(plan.isOk()) << plan.status().toString();
  ASSERT_EQ(plan->size(), 2u);
  ASSERT_EQ((*plan)[0].items.size(), 2u);
  ASSERT_EQ((*plan)[1].items.size(), 2u);
  const CopyItem& a = (*plan)[0].items[0];
  EXPECT_EQ(a.src, 0x1000u);
  EXPECT_EQ(a.dst, 0x90000u);
  EXPECT_EQ(a.bytes, 100u);
  // The empty segment is skipped; the 250-byte one becomes 100 + 100 + 50.
  EXPECT_EQ((*plan)[0].items[1].src, 0x3000u);
  EXPECT_EQ((*plan)[1].items[0].src, 0x3000u + 100);
  EXPECT_EQ((*plan)[1].items[0].dst, 0xb0000u + 100);
  EXPECT_EQ((*plan)[1].items[1].src, 0x3000u + 200);
  EXPECT_EQ((*plan)[1].items[1].bytes, 50u);
}

TEST(BatchedCopyPlan, CoversEveryByteExactlyOnce) {
  std::vector<CopySegment> in;
  size_t total = 0;
  for (size_t i = 0; i < 300; ++i) {
    const size_t n = (i * 7919) % 5000;
    in.push_back({reinterpret_cast<const void*>(0x100000 * (i + 1)),
                  reinterpret_cast<void*>(0x80000000 + 0x100000 * i), n});
    total += n;
  }
  auto plan = planBatchedCopy(in, 1024, 128);
  ASSERT_TRUE(plan.isOk());
  size_t got = 0;
  for (const auto& l : *plan) {
    EXPECT_GE(l.items.size(), 1u);
    EXPECT_LE(l.items.size(), 128u);
    for (const auto& it : l.items) {
      EXPECT_GE(it.bytes, 1u);
      EXPECT_LE(it.bytes, 1024u);
      got += it.bytes;
    }
  }
  EXPECT_EQ(got, total);
}

TEST(BatchedCopyPlan, NothingToCopyIsNoLaunch) {
  auto plan = planBatchedCopy(segs({{0x1000, 0x2000, 0}}), 1024, 128);
  ASSERT_TRUE(plan.isOk());
  EXPECT_TRUE(plan->empty());
}

TEST(BatchedCopyPlan, RefusesBadInput) {
  auto overlap = planBatchedCopy(segs({{0x1000, 0x1010, 64}}), 1024, 128);
  ASSERT_FALSE(overlap.isOk());
  EXPECT_EQ(overlap.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(overlap.status().message(),
            "batched copy: segment 0 has overlapping source and destination");
  auto null = planBatchedCopy(segs({{0x1000, 0x9000, 8}, {0, 0x2000, 8}}), 1024, 128);
  ASSERT_FALSE(null.isOk());
  EXPECT_EQ(null.status().message(), "batched copy: segment 1 has a null pointer");
  EXPECT_FALSE(planBatchedCopy({}, 8, 128).isOk());
  EXPECT_FALSE(planBatchedCopy({}, 1024, 0).isOk());
}

}  // namespace
}  // namespace kolo::gpu
