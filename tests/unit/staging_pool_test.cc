#include "common/staging_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace kolo::staging {
namespace {

TEST(StagingPool, SmallBuffersAreAlignedAndNotHeld) {
  trim();
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{(1 << 20) - 65}}) {
    Buffer b = acquire(n);
    ASSERT_NE(b.get(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u) << n;
    std::memset(b.get(), 0xAB, n);  // the whole requested size is usable (ASan would see an overrun)
  }
  EXPECT_EQ(stats().cached_bytes, 0u);
}

TEST(StagingPool, LargeBuffersAreReusedInsteadOfMappedAgain) {
  trim();
  const size_t n = 48u << 20;  // above glibc's mmap threshold
  char* first = nullptr;
  {
    Buffer b = acquire(n);
    first = b.get();
    std::memset(b.get(), 1, n);
  }
  EXPECT_GE(stats().cached_bytes, n);
  auto hits = stats().hits;
  {
    Buffer b = acquire(n - 12345);  // same size class
    EXPECT_EQ(b.get(), first) << "the released buffer comes back";
    EXPECT_EQ(stats().hits, hits + 1);
  }
  // Shared owners release it too.
  {
    auto s = acquireShared(n);
    EXPECT_EQ(s.get(), first);
    auto copy = s;
  }
  EXPECT_GE(stats().cached_bytes, n);
  trim();
  EXPECT_EQ(stats().cached_bytes, 0u);
}

TEST(StagingPool, SizeClassesWasteAtMostAQuarter) {
  trim();
  // Each request gets its own class's block; a request never gets a smaller
  // block, and a block is never more than 1.25x (+64) of the request.
  for (size_t n = (1u << 20); n < (300u << 20); n = n * 9 / 8 + 4097) {
    Buffer b = acquire(n);
    std::memset(b.get() + n - 1, 7, 1);  // last byte usable
    b.reset();
    auto st = stats();
    EXPECT_GE(st.cached_bytes, n) << n;
    EXPECT_LE(st.cached_bytes, n + n / 4 + 64) << n;
    trim();
  }
}

TEST(StagingPool, ThreadsTakeAndReleaseConcurrently) {
  trim();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        Buffer b = acquire((size_t{1} << 20) * (1 + (i + t) % 5));
        b.get()[0] = static_cast<char>(i);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_LE(stats().cached_bytes, size_t{1024} << 20);
  trim();
}

}  // namespace
}  // namespace kolo::staging
