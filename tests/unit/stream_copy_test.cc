#include "common/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace kolo {
namespace {

// Every byte lands, for sizes on both sides of the threshold, with the
// source and destination at every offset within a 16-byte line (the
// non-temporal body needs an aligned destination; the head and tail are
// copied around it), and nothing outside [dst, dst + n) is written.
TEST(StreamCopy, CopiesExactlyAtEveryAlignmentAndSize) {
  const size_t sizes[] = {0,
                          1,
                          63,
                          kStreamCopyMinBytes - 1,
                          kStreamCopyMinBytes,
                          kStreamCopyMinBytes + 1,
                          kStreamCopyMinBytes + 63,
                          kStreamCopyMinBytes + 64 + 15,
                          3 * kStreamCopyMinBytes + 7};
  const size_t guard = 64;
  for (size_t n : sizes) {
    std::vector<uint8_t> src(n + 32);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 8) * 7 + 1);
    std::vector<uint8_t> dst(n + 32 + 2 * guard);
    for (size_t so : {0, 1, 8, 15}) {
      for (size_t dof : {0, 1, 9, 16, 31}) {
        std::memset(dst.data(), 0xEE, dst.size());
        uint8_t* d = dst.data() + guard + dof;
        streamCopy(d, src.data() + so, n);
        ASSERT_EQ(std::memcmp(d, src.data() + so, n), 0) << "n=" << n << " src+" << so << " dst+" << dof;
        for (size_t i = 0; i < guard + dof; ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote before dst, n=" << n;
        for (size_t i = guard + dof + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote past the end, n=" << n;
      }
    }
  }
}

// The budget is a quarter of the L3, within [kStreamCopyMinBytes,
// kStreamCopyMaxBudget]; arenaCopy is exact on both of its paths (memcpy
// while the node's bytes in flight fit the budget, non-temporal past it),
// around the threshold and unaligned.
TEST(StreamCopy, ArenaCopyIsExactWithAndWithoutBytesInFlight) {
  const size_t budget = streamCopyCacheBudget();
  EXPECT_GE(budget, kStreamCopyMinBytes);
  EXPECT_LE(budget, kStreamCopyMaxBudget);
  EXPECT_EQ(budget, streamCopyCacheBudget());
  for (size_t n : {kStreamCopyMinBytes - 1, kStreamCopyMinBytes, kStreamCopyMinBytes + 77}) {
    std::vector<uint8_t> src(n + 16), dst(n + 64);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + (i >> 12));
    for (size_t node_bytes : {size_t{0}, budget, size_t{1} << 40}) {
      std::memset(dst.data(), 0xEE, dst.size());
      arenaCopy(dst.data() + 3, src.data() + 5, n, node_bytes);
      ASSERT_EQ(std::memcmp(dst.data() + 3, src.data() + 5, n), 0) << n << " " << node_bytes;
      for (size_t i = 0; i < 3; ++i) ASSERT_EQ(dst[i], 0xEE);
      for (size_t i = 3 + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE);
    }
  }
}

}  // namespace
}  // namespace kolo
