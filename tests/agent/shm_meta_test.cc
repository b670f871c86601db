// The checks of the metadata a trainer leaves in shared memory (allgather
// sizes, alltoall split matrices), run on the agent's private copy
// (agent/core/shm_meta.h), with the refusals' texts.
#include "agent/core/shm_meta.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/dtype.h"

namespace kolo {
namespace {

// A float32 tensor [rows, 4] of collective `coll`, its output region
// `out_rows` rows after a prefix of `prefix` bytes.
SubmitDesc desc(CollectiveType coll, int64_t rows, uint64_t prefix, uint64_t out_rows) {
  SubmitDesc d{};
  d.collective = static_cast<uint8_t>(coll);
  d.dtype = static_cast<uint8_t>(DataType::kFloat32);
  d.ndim = 2;
  d.shape[0] = rows;
  d.shape[1] = 4;
  d.data_bytes = static_cast<uint64_t>(rows) * 16;
  d.out_bytes = prefix + out_rows * 16;
  d.name_len = 1;
  std::memcpy(d.name, "t", 1);
  return d;
}

TEST(ShmMeta, AlltoallAcceptsConsistentSplits) {
  // 2 ranks: rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 3 and 0.
  std::vector<int64_t> m = {1, 2, 3, 0};
  EXPECT_TRUE(
      checkAlltoallSplits(desc(CollectiveType::kAlltoall, 3, alltoallSplitsBytes(2), 4), 2, 0, m)
          .isOk());
  EXPECT_TRUE(
      checkAlltoallSplits(desc(CollectiveType::kAlltoall, 3, alltoallSplitsBytes(2), 2), 2, 1, m)
          .isOk());
}

TEST(ShmMeta, AlltoallSplitsThatWrapAroundAreRefused) {
  // Three rows of 2^63 - 1, 2^63 - 1 and 3 add up to 1 modulo 2^64.
  const int64_t big = INT64_MAX;
  std::vector<int64_t> m = {big, big, 3, 0, 0, 0, 0, 0, 0};
  Status st =
      checkAlltoallSplits(desc(CollectiveType::kAlltoall, 1, alltoallSplitsBytes(3), 1), 3, 0, m);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "alltoall of tensor 't': rank 0's splits add up to more than 2^64 rows, but its tensor "
            "has 1");
  // A column whose rows times the row size wrap around.
  std::vector<int64_t> c = {0, int64_t{1} << 60, 0, 0};
  st = checkAlltoallSplits(desc(CollectiveType::kAlltoall, 0, alltoallSplitsBytes(2), 0), 2, 1, c);
  EXPECT_EQ(
      st.message(),
      "alltoall of tensor 't': malformed descriptor: output region does not match the rows this "
      "rank receives");
}

TEST(ShmMeta, AlltoallLocalCopiesStayInsideWhatEachRankChecked) {
  std::vector<int64_t> m = {1, 2, 3, 0};
  auto copies = alltoallLocalCopies(m, 2, 0, 2, 16);
  ASSERT_EQ(copies.size(), 3u);
  // rank 0 -> 0: its row 0 to output row 0; 0 -> 1: its rows 1-2 to rank 1's
  // rows 0-1; 1 -> 0: its rows 0-2 to rank 0's rows 1-3.
  EXPECT_EQ(copies[0].src_off, 0u);
  EXPECT_EQ(copies[0].dst_off, 0u);
  EXPECT_EQ(copies[0].bytes, 16u);
  EXPECT_EQ(copies[1].src_off, 16u);
  EXPECT_EQ(copies[1].dst_local, 1);
  EXPECT_EQ(copies[1].bytes, 32u);
  EXPECT_EQ(copies[2].src_local, 1);
  EXPECT_EQ(copies[2].dst_off, 16u);
  EXPECT_EQ(copies[2].bytes, 48u);
}

TEST(ShmMeta, AllgatherSizesAreCheckedWithoutOverflow) {
  const uint64_t prefix = allgatherSizesBytes(3);
  std::vector<int64_t> ok = {2, 1, 0};
  EXPECT_TRUE(checkAllgatherSizes(desc(CollectiveType::kAllgather, 2, prefix, 3), 3, 0, ok).isOk());
  std::vector<int64_t> wrap = {2, INT64_MAX, INT64_MAX};  // 2 + 2^64 - 2 = 0 modulo 2^64
  Status st = checkAllgatherSizes(desc(CollectiveType::kAllgather, 2, prefix, 0), 3, 0, wrap);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "allgather of tensor 't': malformed descriptor: the ranks' first dimensions overflow");
  std::vector<int64_t> mul = {2, (int64_t{1} << 60) - 2,
                              0};  // 2^60 rows of 16 bytes: 0 modulo 2^64
  st = checkAllgatherSizes(desc(CollectiveType::kAllgather, 2, prefix, 0), 3, 0, mul);
  EXPECT_EQ(
      st.message(),
      "allgather of tensor 't': malformed descriptor: output region of 0 bytes, the ranks' first "
      "dimensions add up to 1152921504606846976 rows of 16 bytes");
  std::vector<int64_t> lies = {5, 1, 0};
  st = checkAllgatherSizes(desc(CollectiveType::kAllgather, 2, prefix, 6), 3, 0, lies);
  EXPECT_EQ(
      st.message(),
      "allgather of tensor 't': malformed descriptor: rank 0 lists first dimension 5 but sent "
      "shape [2, 4]");
}

TEST(ShmMeta, AMissingCopyIsRefused) {
  Status st = checkAllgatherSizes(desc(CollectiveType::kAllgather, 2, 0, 2), 2, 0, {});
  EXPECT_EQ(
      st.message(),
      "allgather of tensor 't': malformed descriptor: the output region lacks the ranks' first "
      "dimensions");
  st = checkAlltoallSplits(desc(CollectiveType::kAlltoall, 2, 0, 2), 2, 0, {});
  EXPECT_EQ(
      st.message(),
      "alltoall of tensor 't': malformed descriptor: the output region lacks the split matrix");
}

}  // namespace
}  // namespace kolo
