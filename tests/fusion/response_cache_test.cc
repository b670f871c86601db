#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "agent/negotiation/cache_bits.h"
#include "agent/negotiation/response_cache.h"

namespace kolo::negotiation {
namespace {

CacheParams params(std::vector<int64_t> shape = {4, 4}) {
  CacheParams p;
  p.shape = std::move(shape);
  return p;
}

TEST(ResponseCache, MissHitAndInvalidOnEveryParameter) {
  ResponseCache cache(8);
  EXPECT_EQ(cache.lookup("g", params()), CacheState::kMiss);
  auto bit = cache.put("g", params());
  ASSERT_TRUE(bit.has_value());
  EXPECT_EQ(*bit, 0u);
  EXPECT_EQ(cache.lookup("g", params()), CacheState::kHit);
  EXPECT_EQ(cache.bitOf("g"), bit);

  std::vector<std::function<void(CacheParams&)>> changes = {
      [](CacheParams& p) { p.dtype = DataType::kFloat16; },
      [](CacheParams& p) { p.shape = {4, 5}; },
      [](CacheParams& p) { p.reduce_op = ReduceOp::kAverage; },
      [](CacheParams& p) { p.prescale = 2; },
      [](CacheParams& p) { p.postscale = 0.5; },
      [](CacheParams& p) { p.collective = CollectiveType::kAllgather; },
      [](CacheParams& p) { p.root = 1; },
      [](CacheParams& p) { p.device = 0; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    CacheParams p = params();
    changes[i](p);
    EXPECT_EQ(cache.lookup("g", p), CacheState::kInvalid) << "change " << i;
  }
  // Putting the new params updates the entry in place and keeps its bit.
  CacheParams p = params({8});
  EXPECT_EQ(cache.put("g", p), bit);
  EXPECT_EQ(cache.lookup("g", p), CacheState::kHit);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ResponseCache, EvictsLeastRecentlyUsedAndReusesItsBit) {
  ResponseCache cache(3);
  EXPECT_EQ(cache.put("a", params()), 0u);
  EXPECT_EQ(cache.put("b", params()), 1u);
  EXPECT_EQ(cache.put("c", params()), 2u);
  ASSERT_NE(cache.get(0), nullptr);  // touch "a": "b" is now the oldest
  EXPECT_EQ(cache.get(0)->name, "a");
  EXPECT_EQ(cache.put("d", params()), 1u);
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
  ResponseCache cache(10);
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

TEST(ResponseCache, CapacityZeroDisables) {
  ResponseCache cache(0);
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.put("g", params()).has_value());
  EXPECT_EQ(cache.lookup("g", params()), CacheState::kMiss);
  EXPECT_EQ(cache.numBits(), 0u);
}

TEST(ResponseCache, BarrierAndJoinAreNotCached) {
  ResponseCache cache(4);
  CacheParams p = params();
  p.collective = CollectiveType::kBarrier;
  EXPECT_FALSE(cache.put("b", p).has_value());
  p.collective = CollectiveType::kJoin;
  EXPECT_FALSE(cache.put("j", p).has_value());
  p.collective = CollectiveType::kBroadcast;
  p.root = 2;
  EXPECT_TRUE(cache.put("bc", p).has_value());
}

// Two agents that perform the same sequence agree on every bit at every step.
TEST(ResponseCache, SameSequenceGivesSameBits) {
  ResponseCache a(16), b(16);
  std::mt19937_64 rng(1234);
  for (int step = 0; step < 5000; ++step) {
    std::string name = "t" + std::to_string(rng() % 40);
    CacheParams p = params({static_cast<int64_t>(rng() % 3)});
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

TEST(CacheBits, SetTestAndOr) {
  CacheBits v;
  setBit(v, 0);
  setBit(v, 64);
  setBit(v, 130);
  EXPECT_EQ(v.size(), 3u);
  EXPECT_TRUE(testBit(v, 64));
  EXPECT_FALSE(testBit(v, 65));
  EXPECT_FALSE(testBit(v, 1000));
  EXPECT_EQ(setBits(v), (std::vector<uint32_t>{0, 64, 130}));
  CacheBits w;
  setBit(w, 64);
  setBit(w, 5);
  CacheBits a = v;
  andInto(a, w);
  EXPECT_EQ(setBits(a), (std::vector<uint32_t>{64}));
  CacheBits o = w;
  orInto(o, v);
  EXPECT_EQ(setBits(o), (std::vector<uint32_t>{0, 5, 64, 130}));
  clearBit(o, 64);
  EXPECT_FALSE(testBit(o, 64));
  EXPECT_EQ(wordsFor(0), 0u);
  EXPECT_EQ(wordsFor(64), 1u);
  EXPECT_EQ(wordsFor(65), 2u);
}

// Three agents run one cycle of the agreement, the allreduces done by hand.
TEST(CacheSync, StatusBitsActAsOrAndHitsAsAnd) {
  const uint32_t nbits = 100;
  std::vector<CacheSync> agents(3);
  for (auto& a : agents) {
    a.addHit(1);
    a.addHit(70);
  }
  agents[0].addHit(5);
  agents[2].addHit(99);
  agents[1].setUncachedInQueue();

  CacheBits reduced = agents[0].encodeAnd(nbits);
  EXPECT_EQ(reduced.size(), wordsFor(kNumStatusBits + nbits));
  for (size_t i = 1; i < agents.size(); ++i) andInto(reduced, agents[i].encodeAnd(nbits));
  for (auto& a : agents) {
    a.decodeAnd(reduced);
    EXPECT_FALSE(a.shutdown());
    EXPECT_TRUE(a.uncachedInQueue());
    EXPECT_FALSE(a.invalidInQueue());
    EXPECT_FALSE(a.needsInvalidRound());
    EXPECT_EQ(a.hits(), (std::set<uint32_t>{1, 70}));
  }
}

TEST(CacheSync, ShutdownAndInvalidRound) {
  const uint32_t nbits = 10;
  std::vector<CacheSync> agents(2);
  agents[0].addHit(2);
  agents[0].addHit(4);
  agents[1].addHit(2);
  agents[1].addHit(4);
  agents[1].addInvalid(4);
  agents[0].setShutdown();

  CacheBits reduced = agents[0].encodeAnd(nbits);
  andInto(reduced, agents[1].encodeAnd(nbits));
  for (auto& a : agents) a.decodeAnd(reduced);
  CacheBits inv = agents[0].encodeInvalidOr(nbits);
  for (auto& a : agents) {
    EXPECT_TRUE(a.shutdown());
    EXPECT_TRUE(a.needsInvalidRound());
  }
  orInto(inv, agents[1].encodeInvalidOr(nbits));
  EXPECT_EQ(inv.size(), wordsFor(nbits));
  for (auto& a : agents) {
    a.decodeInvalidOr(inv);
    EXPECT_EQ(a.invalid(), (std::set<uint32_t>{4}));
    EXPECT_EQ(a.hits(), (std::set<uint32_t>{2}));  // the erased entry is no longer a hit
  }
}

}  // namespace
}  // namespace kolo::negotiation
