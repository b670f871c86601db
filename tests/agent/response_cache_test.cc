// The response cache behind NegotiationState (agent/negotiation/), with
// the live parameter rule (NegotiationState::sameParams).
#include "agent/negotiation/response_cache.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "agent/cross/negotiation_state.h"

namespace kolo::negotiation {
namespace {

SubmitDesc params(std::vector<int64_t> shape = {4, 4}) {
  SubmitDesc p{};
  p.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
  p.dtype = static_cast<uint8_t>(DataType::kFloat32);
  p.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  p.prescale = p.postscale = 1.0;
  p.root = -1;
  p.ndim = static_cast<uint8_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) p.shape[i] = shape[i];
  return p;
}

ResponseCache makeCache(size_t capacity) {
  return ResponseCache(capacity, &NegotiationState::sameParams);
}

TEST(ResponseCache, MissHitAndInvalidOnEveryParameter) {
  ResponseCache cache = makeCache(8);
  EXPECT_EQ(cache.lookup("g", params()), CacheState::kMiss);
  auto bit = cache.put("g", params());
  ASSERT_TRUE(bit.has_value());
  EXPECT_EQ(*bit, 0u);
  EXPECT_EQ(cache.lookup("g", params()), CacheState::kHit);
  EXPECT_EQ(cache.bitOf("g"), bit);

  std::vector<std::function<void(SubmitDesc&)>> changes = {
      [](SubmitDesc& p) { p.dtype = static_cast<uint8_t>(DataType::kFloat16); },
      [](SubmitDesc& p) { p.shape[1] = 5; },
      [](SubmitDesc& p) { p.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage); },
      [](SubmitDesc& p) { p.prescale = 2; },
      [](SubmitDesc& p) { p.postscale = 0.5; },
      [](SubmitDesc& p) { p.collective = static_cast<uint8_t>(CollectiveType::kBroadcast); },
      [](SubmitDesc& p) { p.root = 1; },
      [](SubmitDesc& p) { p.group_id = 3; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    SubmitDesc p = params();
    changes[i](p);
    EXPECT_EQ(cache.lookup("g", p), CacheState::kInvalid) << "change " << i;
  }
  // What differs between ranks anyway (their arena offsets, handles) is no change.
  SubmitDesc same = params();
  same.handle = 99;
  same.data_offset = 4096;
  EXPECT_EQ(cache.lookup("g", same), CacheState::kHit);
  // Putting the new params updates the entry in place and keeps its bit.
  SubmitDesc p = params({8});
  EXPECT_EQ(cache.put("g", p), bit);
  EXPECT_EQ(cache.lookup("g", p), CacheState::kHit);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ResponseCache, EvictsLeastRecentlyUsedAndReusesItsBit) {
  ResponseCache cache = makeCache(3);
  EXPECT_EQ(cache.put("a", params()), 0u);
  EXPECT_EQ(cache.put("b", params()), 1u);
  EXPECT_EQ(cache.put("c", params()), 2u);
  ASSERT_NE(cache.get(0), nullptr);  // touch "a": "b" is now the oldest
  EXPECT_EQ(cache.get(0)->name, "a");
  std::optional<CacheEntry> evicted;
  EXPECT_EQ(cache.put("d", params(), &evicted), 1u);
  ASSERT_TRUE(evicted.has_value());
  EXPECT_EQ(evicted->name, "b");
  EXPECT_EQ(evicted->bit, 1u);
  EXPECT_EQ(cache.lookup("b", params()), CacheState::kMiss);
  EXPECT_EQ(cache.peek(1)->name, "d");
  EXPECT_EQ(cache.numBits(), 3u);
  EXPECT_EQ(cache.size(), 3u);
  // peek does not touch: "c" is the oldest now, then "a".
  cache.peek(2);
  EXPECT_EQ(cache.put("e", params()), 2u);
  EXPECT_EQ(cache.lookup("c", params()), CacheState::kMiss);
}

TEST(ResponseCache, EraseFreesTheBitForReuseLowestFirst) {
  ResponseCache cache = makeCache(10);
  for (int i = 0; i < 5; ++i) cache.put("t" + std::to_string(i), params());
  EXPECT_TRUE(cache.erase(3));
  EXPECT_TRUE(cache.erase(1));
  EXPECT_FALSE(cache.erase(1));
  EXPECT_FALSE(cache.erase(77));
  EXPECT_EQ(cache.peek(1), nullptr);
  EXPECT_EQ(cache.lookup("t1", params()), CacheState::kMiss);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.put("x", params()), 1u);
  EXPECT_EQ(cache.put("y", params()), 3u);
  EXPECT_EQ(cache.put("z", params()), 5u);
  EXPECT_EQ(cache.numBits(), 6u);
}

// The bit space shrinks while its highest bits are free, so every agent
// sends a shorter vector once the last names are dropped.
TEST(ResponseCache, ErasingTheHighestBitsShrinksTheBitSpace) {
  ResponseCache cache = makeCache(10);
  for (int i = 0; i < 4; ++i) cache.put("t" + std::to_string(i), params());
  EXPECT_TRUE(cache.erase(1));
  EXPECT_EQ(cache.numBits(), 4u);
  EXPECT_TRUE(cache.erase(3));
  EXPECT_EQ(cache.numBits(), 3u);
  EXPECT_TRUE(cache.erase(2));
  EXPECT_EQ(cache.numBits(), 1u);  // bit 1 was free too
  EXPECT_EQ(cache.put("x", params()), 1u);
  EXPECT_EQ(cache.numBits(), 2u);
}

TEST(ResponseCache, CapacityZeroDisables) {
  ResponseCache cache = makeCache(0);
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.put("g", params()).has_value());
  EXPECT_EQ(cache.lookup("g", params()), CacheState::kMiss);
  EXPECT_EQ(cache.numBits(), 0u);
}

TEST(ResponseCache, BarrierAndJoinAreNotCached) {
  ResponseCache cache = makeCache(4);
  SubmitDesc p = params();
  p.collective = static_cast<uint8_t>(CollectiveType::kBarrier);
  EXPECT_FALSE(cache.put("b", p).has_value());
  p.collective = static_cast<uint8_t>(CollectiveType::kJoin);
  EXPECT_FALSE(cache.put("j", p).has_value());
  p.collective = static_cast<uint8_t>(CollectiveType::kBroadcast);
  p.root = 2;
  EXPECT_TRUE(cache.put("bc", p).has_value());
}

// Two agents that perform the same sequence agree on every bit at every step.
TEST(ResponseCache, SameSequenceGivesSameBits) {
  ResponseCache a = makeCache(16), b = makeCache(16);
  std::mt19937_64 rng(1234);
  for (int step = 0; step < 5000; ++step) {
    std::string name = "t" + std::to_string(rng() % 40);
    SubmitDesc p = params({static_cast<int64_t>(rng() % 3)});
    switch (rng() % 5) {
      case 0:
      case 1: {
        auto ba = a.put(name, p), bb = b.put(name, p);
        ASSERT_EQ(ba, bb) << "step " << step;
        break;
      }
      case 2: {
        ASSERT_EQ(a.lookup(name, p), b.lookup(name, p));
        break;
      }
      case 3: {
        uint32_t bit = static_cast<uint32_t>(rng() % 17);
        const CacheEntry* ea = a.get(bit);
        const CacheEntry* eb = b.get(bit);
        ASSERT_EQ(ea == nullptr, eb == nullptr);
        if (ea) {
          ASSERT_EQ(ea->name, eb->name);
        }
        break;
      }
      case 4: {
        uint32_t bit = static_cast<uint32_t>(rng() % 17);
        ASSERT_EQ(a.erase(bit), b.erase(bit));
        break;
      }
    }
    ASSERT_EQ(a.numBits(), b.numBits());
    ASSERT_EQ(a.size(), b.size());
    ASSERT_LE(a.size(), 16u);
    for (uint32_t bit = 0; bit < a.numBits(); ++bit) {
      const CacheEntry* ea = a.peek(bit);
      const CacheEntry* eb = b.peek(bit);
      ASSERT_EQ(ea == nullptr, eb == nullptr);
      if (ea) {
        ASSERT_EQ(ea->name, eb->name);
        ASSERT_EQ(ea->bit, bit);
        ASSERT_EQ(a.bitOf(ea->name), bit);
      }
    }
  }
}

}  // namespace
}  // namespace kolo::negotiation
