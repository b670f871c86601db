#include "arena_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace kolo {
namespace {

TEST(ArenaAllocator, EveryOffsetIsAlignedAndInside) {
  ArenaAllocator a(100, 10'000);  // unaligned start: rounded up to 128
  EXPECT_EQ(a.begin(), 128u);
  EXPECT_EQ(a.capacity() % 64, 0u);
  EXPECT_LE(a.begin() + a.capacity(), 10'100u);
  std::vector<uint64_t> offs;
  for (uint64_t n : {1, 63, 64, 65, 0, 200}) {
    auto off = a.allocate(n);
    ASSERT_TRUE(off.has_value()) << n;
    EXPECT_EQ(*off % 64, 0u);
    EXPECT_GE(*off, a.begin());
    EXPECT_LE(*off + ArenaAllocator::roundUp(n), a.begin() + a.capacity());
    EXPECT_EQ(a.blockSize(*off), ArenaAllocator::roundUp(n));
    offs.push_back(*off);
  }
  // First fit from an empty arena packs blocks back to back.
  EXPECT_EQ(offs[0], 128u);
  EXPECT_EQ(offs[1], 192u);
  EXPECT_EQ(offs[2], 256u);
  EXPECT_EQ(offs[3], 320u);   // 65 bytes take two units
  EXPECT_EQ(offs[4], 448u);   // 0 bytes still take one unit
  EXPECT_EQ(offs[5], 512u);
  EXPECT_EQ(a.usedBytes(), 64u * 10);  // 1 + 1 + 1 + 2 + 1 + 4 units
}

TEST(ArenaAllocator, FirstFitTakesTheLowestHoleThatFits) {
  ArenaAllocator a(0, 64 * 100);
  auto x = a.allocate(64 * 2);
  auto y = a.allocate(64 * 4);
  auto z = a.allocate(64 * 2);
  ASSERT_TRUE(x && y && z);
  ASSERT_TRUE(a.free(*x));  // hole of 2 units at 0
  ASSERT_TRUE(a.free(*y));  // merges: hole of 6 units at 0
  auto big = a.allocate(64 * 5);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(*big, 0u);
  auto small = a.allocate(64);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(*small, 64u * 5);  // the unit left in the hole, before z
}

TEST(ArenaAllocator, FreeingCoalescesWithBothNeighbours) {
  ArenaAllocator a(0, 64 * 3);
  auto x = a.allocate(64);
  auto y = a.allocate(64);
  auto z = a.allocate(64);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(a.freeBlocks(), 0u);
  ASSERT_TRUE(a.free(*x));
  ASSERT_TRUE(a.free(*z));
  EXPECT_EQ(a.freeBlocks(), 2u);
  EXPECT_EQ(a.largestFreeBlock(), 64u);
  ASSERT_TRUE(a.free(*y));  // joins the holes before and after
  EXPECT_EQ(a.freeBlocks(), 1u);
  EXPECT_EQ(a.largestFreeBlock(), 64u * 3);
  EXPECT_EQ(a.usedBytes(), 0u);
  auto all = a.allocate(64 * 3);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, 0u);
}

TEST(ArenaAllocator, ExhaustionFailsAndRecoversAfterFree) {
  ArenaAllocator a(4096, 64 * 8);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 8; ++i) {
    auto off = a.allocate(50);
    ASSERT_TRUE(off.has_value());
    offs.push_back(*off);
  }
  EXPECT_FALSE(a.allocate(1).has_value());
  EXPECT_FALSE(a.allocate(64 * 9).has_value());     // larger than everything
  EXPECT_FALSE(a.allocate(UINT64_MAX).has_value());  // no overflow in rounding
  ASSERT_TRUE(a.free(offs[3]));
  EXPECT_FALSE(a.allocate(65).has_value());  // one unit free, two asked
  auto again = a.allocate(64);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, offs[3]);
}

TEST(ArenaAllocator, RejectsUnknownAndDoubleFree) {
  ArenaAllocator a(0, 64 * 8);
  auto x = a.allocate(64 * 2);
  ASSERT_TRUE(x.has_value());
  EXPECT_FALSE(a.free(*x + 64));  // inside a block, not its start
  EXPECT_FALSE(a.free(12345));
  EXPECT_TRUE(a.free(*x));
  EXPECT_FALSE(a.free(*x));
  EXPECT_EQ(a.freeBlocks(), 1u);
  EXPECT_EQ(a.usedBytes(), 0u);
}

TEST(ArenaAllocator, EmptyRangeHasNoCapacity) {
  ArenaAllocator a(10, 20);  // no aligned unit fits in [10, 30)
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_FALSE(a.allocate(1).has_value());
}

TEST(ArenaAllocator, RandomWorkloadNeverOverlapsAndFullyCoalesces) {
  ArenaAllocator a(0, 1 << 20);
  std::mt19937_64 rng(42);
  std::map<uint64_t, uint64_t> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t n = rng() % 5000;
      auto off = a.allocate(n);
      if (!off) continue;
      uint64_t size = ArenaAllocator::roundUp(n);
      auto next = live.lower_bound(*off);
      if (next != live.end()) {
        ASSERT_LE(*off + size, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *off);
      }
      live[*off] = size;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(a.free(it->first));
      live.erase(it);
    }
  }
  for (auto& [off, size] : live) ASSERT_TRUE(a.free(off));
  EXPECT_EQ(a.usedBytes(), 0u);
  EXPECT_EQ(a.freeBlocks(), 1u);
  EXPECT_EQ(a.largestFreeBlock(), a.capacity());
}

TEST(ArenaAllocator, ConcurrentThreadsGetDisjointBlocks) {
  ArenaAllocator a(0, 256 * 1024);
  std::mutex mu;
  std::map<uint64_t, uint64_t> live;  // every block currently handed out
  bool overlap = false;
  auto worker = [&](int seed) {
    std::mt19937 rng(seed);
    std::vector<uint64_t> mine;
    for (int i = 0; i < 5000; ++i) {
      if (mine.empty() || rng() % 2 == 0) {
        uint64_t n = 1 + rng() % 3000;
        auto off = a.allocate(n);
        if (!off) continue;
        std::lock_guard<std::mutex> lock(mu);
        uint64_t size = ArenaAllocator::roundUp(n);
        auto next = live.lower_bound(*off);
        if (next != live.end() && *off + size > next->first) overlap = true;
        if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > *off) {
          overlap = true;
        }
        live[*off] = size;
        mine.push_back(*off);
      } else {
        uint64_t off = mine.back();
        mine.pop_back();
        {
          std::lock_guard<std::mutex> lock(mu);
          live.erase(off);
        }
        a.free(off);
      }
    }
    for (uint64_t off : mine) {
      {
        std::lock_guard<std::mutex> lock(mu);
        live.erase(off);
      }
      a.free(off);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t + 1);
  for (auto& t : threads) t.join();
  EXPECT_FALSE(overlap);
  EXPECT_EQ(a.usedBytes(), 0u);
  EXPECT_EQ(a.liveBlocks(), 0u);
  EXPECT_EQ(a.freeBlocks(), 1u);
}

}  // namespace
}  // namespace kolo
