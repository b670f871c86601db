// Host-only tests of the device collectives' planning
// (agent/gpu/collective_plan.h): the plans are run on host buffers (memcpy
// per segment, a scalar sum per reduction block) and compared bit-exact with
// the host path's layout computed independently here. Every build.
#include "agent/gpu/collective_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/ipc_layout.h"

namespace kolo::gpu {
namespace {

uintptr_t addr(const std::vector<uint8_t>& v) { return reinterpret_cast<uintptr_t>(v.data()); }

void runCopies(const std::vector<CopySegment>& segs) {
  for (const CopySegment& s : segs) std::memcpy(s.dst, s.src, s.bytes);
}

// Rank r's byte pattern: distinct per rank and position.
std::vector<uint8_t> pattern(int rank, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(rank * 37 + i * 7 + 1);
  return v;
}

void checkAllgather(const std::vector<int64_t>& dims, size_t row_bytes) {
  const size_t k = dims.size();
  const int64_t total = std::accumulate(dims.begin(), dims.end(), int64_t{0});
  std::vector<std::vector<uint8_t>> in(k),
      out(k, std::vector<uint8_t>(total * row_bytes + 1, 0xEE));
  std::vector<RankSlots> slots;
  std::vector<uint8_t> want;
  for (size_t r = 0; r < k; ++r) {
    in[r] =
        pattern(static_cast<int>(r), dims[r] * row_bytes + 1);  // +1: a non-null buffer when empty
    want.insert(want.end(), in[r].begin(), in[r].begin() + dims[r] * row_bytes);
    slots.push_back({addr(in[r]), addr(out[r])});
  }
  want.push_back(0xEE);  // nothing is written past the output
  auto segs = planAllgatherCopies(slots, dims, row_bytes, "t");
  ASSERT_TRUE(segs.isOk()) << segs.status().message();
  runCopies(*segs);
  for (size_t r = 0; r < k; ++r) EXPECT_EQ(out[r], want) << "rank " << r;
}

TEST(DeviceAllgatherPlan, EvenUnevenAndEmptyBlocksEveryElementSize) {
  for (size_t elem : {1, 2, 4, 8}) {
    for (size_t cols : {1, 3}) {
      checkAllgather({4, 4}, elem * cols);
      checkAllgather({3, 1, 0, 5}, elem * cols);
      checkAllgather({0, 0, 0}, elem * cols);
      checkAllgather({7}, elem * cols);
    }
  }
}

TEST(DeviceAllgatherPlan, OffsetsAndSegmentCount) {
  auto off = allgatherOffsets({3, 1, 0, 5}, 8, "t");
  ASSERT_TRUE(off.isOk());
  EXPECT_EQ(*off, (std::vector<uint64_t>{0, 24, 32, 32, 72}));
  // Addresses only (nothing is copied), 4 KiB apart: heap buffers with
  // outputs at +100 could overlap a neighbour's input and fail at random.
  std::vector<RankSlots> slots{
      {0x1000, 0x2000}, {0x3000, 0x4000}, {0x5000, 0x6000}, {0x7000, 0x8000}};
  auto segs = planAllgatherCopies(slots, {3, 1, 0, 5}, 8, "t");
  ASSERT_TRUE(segs.isOk());
  EXPECT_EQ(segs->size(), 12u);  // 3 ranks with rows x 4 destinations
}

TEST(DeviceAllgatherPlan, InPlaceSkipsTheSelfCopy) {
  // Each rank's input already sits at its block of its own output.
  const std::vector<int64_t> dims{2, 3};
  const size_t row = 4;
  std::vector<uint8_t> o0(20, 0), o1(20, 0);
  std::memset(o0.data(), 0x11, 8);
  std::memset(o1.data() + 8, 0x22, 12);
  std::vector<RankSlots> slots{{addr(o0), addr(o0)}, {addr(o1) + 8, addr(o1)}};
  auto segs = planAllgatherCopies(slots, dims, row, "t");
  ASSERT_TRUE(segs.isOk()) << segs.status().message();
  EXPECT_EQ(segs->size(), 2u);
  runCopies(*segs);
  std::vector<uint8_t> want(20, 0x22);
  std::memset(want.data(), 0x11, 8);
  EXPECT_EQ(o0, want);
  EXPECT_EQ(o1, want);
}

TEST(DeviceAllgatherPlan, Errors) {
  auto neg = allgatherOffsets({2, -1}, 4, "w");
  EXPECT_EQ(neg.status().message(),
            "allgather of device tensor 'w': rank 1's first dimension is -1");
  auto big = allgatherOffsets({INT64_MAX, INT64_MAX}, 8, "w");
  EXPECT_EQ(big.status().message(), "allgather of device tensor 'w': the sizes overflow 64 bits");
  std::vector<RankSlots> one{{0x1000, 0x2000}};
  auto count = planAllgatherCopies(one, {1, 2}, 4, "w");
  EXPECT_EQ(count.status().message(),
            "allgather of device tensor 'w': 1 ranks but 2 first dimensions");
  // Rank 0's input overlaps its output, not at its own block.
  std::vector<RankSlots> bad{{0x1004, 0x1000}, {0x3000, 0x4000}};
  auto ov = planAllgatherCopies(bad, {2, 2}, 4, "w");
  EXPECT_EQ(
      ov.status().message(),
      "allgather of device tensor 'w': rank 0's input overlaps rank 0's output at another offset");
}

TEST(DeviceReducescatterPlan, BlocksMatchTheHostPath) {
  for (int size : {1, 2, 3, 4}) {
    for (int64_t dim0 : {0, 1, 4, 7, 10}) {
      auto b = reducescatterBlocks(dim0, 3, size, "t");
      ASSERT_TRUE(b.isOk());
      uint64_t next = 0;
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ((*b)[r].offset, static_cast<uint64_t>(reducescatterRowOffset(dim0, size, r)) * 3);
        EXPECT_EQ((*b)[r].count, static_cast<uint64_t>(reducescatterRows(dim0, size, r)) * 3);
        EXPECT_EQ((*b)[r].offset, next);
        next += (*b)[r].count;
      }
      EXPECT_EQ(next, static_cast<uint64_t>(dim0) * 3);
    }
  }
}

template <typename T>
void checkReducescatter(int k, int64_t dim0, uint64_t cols) {
  const size_t n = static_cast<size_t>(dim0) * cols;
  std::vector<std::vector<T>> in(k, std::vector<T>(n + 1));
  std::vector<std::vector<T>> out(k);
  std::vector<RankSlots> slots;
  for (int r = 0; r < k; ++r) {
    for (size_t i = 0; i < n; ++i) in[r][i] = static_cast<T>((r + 1) * 3 + i % 11);
    out[r].assign(static_cast<size_t>(reducescatterRows(dim0, k, r)) * cols + 1, T(0));
    slots.push_back(
        {reinterpret_cast<uintptr_t>(in[r].data()), reinterpret_cast<uintptr_t>(out[r].data())});
  }
  auto plan = planReducescatter(slots, dim0, cols, sizeof(T), "t");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  for (const ReduceBlock& b : *plan) {
    ASSERT_EQ(b.srcs.size(), static_cast<size_t>(k));
    for (uint64_t i = 0; i < b.count; ++i) {
      T acc = 0;
      for (uintptr_t s : b.srcs) acc += reinterpret_cast<const T*>(s)[i];
      reinterpret_cast<T*>(b.dst)[i] = acc;
    }
  }
  for (int r = 0; r < k; ++r) {
    const size_t first = static_cast<size_t>(reducescatterRowOffset(dim0, k, r)) * cols;
    const size_t rows = static_cast<size_t>(reducescatterRows(dim0, k, r)) * cols;
    for (size_t i = 0; i < rows; ++i) {
      T want = 0;
      for (int s = 0; s < k; ++s) want += in[s][first + i];
      ASSERT_EQ(out[r][i], want) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(out[r][rows], T(0)) << "rank " << r << ": written past its block";
  }
}

TEST(DeviceReducescatterPlan, EvenUnevenAndEmptyBlocksEveryElementSize) {
  for (int k : {1, 2, 3, 4}) {
    for (int64_t dim0 : {0, 1, 3, 8, 9}) {
      checkReducescatter<uint8_t>(k, dim0, 2);
      checkReducescatter<int16_t>(k, dim0, 3);
      checkReducescatter<float>(k, dim0, 1);
      checkReducescatter<double>(k, dim0, 5);
    }
  }
}

TEST(DeviceReducescatterPlan, EmptyBlocksAreSkipped) {
  std::vector<uint8_t> a(16), b(16), c(16), oa(8), ob(8), oc(8);
  std::vector<RankSlots> s{{addr(a), addr(oa)}, {addr(b), addr(ob)}, {addr(c), addr(oc)}};
  auto plan = planReducescatter(s, 2, 1, 4, "t");  // 2 rows over 3 ranks: rank 2 gets none
  ASSERT_TRUE(plan.isOk());
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[1].rank, 1);
  EXPECT_EQ((*plan)[1].srcs[2], addr(c) + 4);
}

TEST(DeviceReducescatterPlan, Errors) {
  EXPECT_EQ(reducescatterBlocks(-2, 1, 2, "g").status().message(),
            "reducescatter of device tensor 'g': the first dimension is -2");
  EXPECT_EQ(reducescatterBlocks(4, 1, 0, "g").status().message(),
            "reducescatter of device tensor 'g': 0 ranks");
  std::vector<RankSlots> inplace{{0x1000, 0x1000}, {0x2000, 0x3000}};
  EXPECT_EQ(planReducescatter(inplace, 4, 1, 4, "g").status().message(),
            "reducescatter of device tensor 'g': rank 0's output overlaps rank 0's input "
            "(reducescatter is not in "
            "place)");
}

void checkAlltoall(int k, const std::vector<int64_t>& splits, size_t row_bytes) {
  std::vector<int64_t> dims(k, 0);
  for (int s = 0; s < k; ++s)
    for (int d = 0; d < k; ++d) dims[s] += splits[s * k + d];
  std::vector<std::vector<uint8_t>> in(k), out(k), want(k);
  for (int s = 0; s < k; ++s) in[s] = pattern(s, dims[s] * row_bytes + 1);
  // Reference: rank d receives, from rank 0 first, rank s's d-th block.
  for (int d = 0; d < k; ++d) {
    for (int s = 0; s < k; ++s) {
      int64_t first = 0;
      for (int j = 0; j < d; ++j) first += splits[s * k + j];
      auto b = in[s].begin() + first * row_bytes;
      want[d].insert(want[d].end(), b, b + splits[s * k + d] * row_bytes);
    }
    out[d].assign(want[d].size() + 1, 0xEE);
    want[d].push_back(0xEE);
  }
  std::vector<RankSlots> slots;
  for (int r = 0; r < k; ++r) slots.push_back({addr(in[r]), addr(out[r])});
  auto plan = planAlltoallCopies(slots, splits, dims, row_bytes, "t");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  runCopies(plan->copies);
  for (int d = 0; d < k; ++d) {
    EXPECT_EQ(out[d], want[d]) << "rank " << d;
    EXPECT_EQ(static_cast<size_t>(plan->recv_rows[d]) * row_bytes + 1, want[d].size());
    for (int s = 0; s < k; ++s) EXPECT_EQ(plan->recv_splits[d * k + s], splits[s * k + d]);
  }
}

TEST(DeviceAlltoallPlan, EvenUnevenAndEmptyBlocksEveryElementSize) {
  for (size_t elem : {1, 2, 4, 8}) {
    checkAlltoall(2, {1, 1, 1, 1}, elem);
    checkAlltoall(2, {0, 3, 2, 0}, elem * 3);
    checkAlltoall(3, {1, 0, 2, 0, 0, 0, 4, 1, 0}, elem);
    checkAlltoall(4, {1, 2, 3, 4, 0, 0, 0, 0, 5, 0, 1, 0, 2, 2, 2, 2}, elem * 2);
    checkAlltoall(1, {3}, elem);
    checkAlltoall(2, {0, 0, 0, 0}, elem);
  }
}

TEST(DeviceAlltoallPlan, Errors) {
  std::vector<RankSlots> s{{0x1000, 0x5000}, {0x2000, 0x6000}};
  EXPECT_EQ(planAlltoallCopies(s, {1, 1, 1}, {2, 2}, 4, "a").status().message(),
            "alltoall of device tensor 'a': 2 ranks need a 2x2 split matrix and 2 first "
            "dimensions, not 3 splits "
            "and 2 first dimensions");
  EXPECT_EQ(planAlltoallCopies(s, {1, -1, 1, 1}, {0, 2}, 4, "a").status().message(),
            "alltoall of device tensor 'a': rank 0 sends -1 rows to rank 1");
  EXPECT_EQ(
      planAlltoallCopies(s, {1, 1, 1, 2}, {2, 2}, 4, "a").status().message(),
      "alltoall of device tensor 'a': rank 1's splits add up to 3 rows, but its tensor has 2");
  std::vector<RankSlots> inplace{{0x1000, 0x1000}, {0x2000, 0x6000}};
  EXPECT_EQ(planAlltoallCopies(inplace, {1, 1, 1, 1}, {2, 2}, 4, "a").status().message(),
            "alltoall of device tensor 'a': rank 0's output overlaps rank 0's input (alltoall is "
            "not in place)");
}

}  // namespace
}  // namespace kolo::gpu
