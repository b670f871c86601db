// NegotiationState's response cache at work across agents: the per-cycle
// vector (Min-reduced, so a status byte acts as "any agent" and a cache
// bit as "every agent") and the LRU eviction every agent performs alike.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/cross/negotiation_state.h"
#include "tests/agent/negotiation_cycle.h"

namespace kolo {
namespace {
using testing_negotiation::cycle;
using testing_negotiation::request;

std::vector<std::string> names(const std::vector<CrossResponse>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs) out.push_back(r.name);
  return out;
}

// Three agents: byte 0 ("nothing unannounced here") Min-reduces to 0 when
// any agent has an uncached request, and only the hits common to every
// agent complete, in bit order.
TEST(NegotiationCache, StatusByteActsAsAnyAgentAndHitsAsEveryAgent) {
  NegotiationState a(0, 3, 16), b(1, 3, 16), c(2, 3, 16);
  std::vector<NegotiationState*> all = {&a, &b, &c};
  for (auto* s : all) {
    for (const char* n : {"h1", "h2", "h3"}) s->addLocal(request(n));
  }
  auto first = cycle(all);  // announced by all: completed and cached
  for (const auto& r : first) EXPECT_EQ(names(r), (std::vector<std::string>{"h1", "h2", "h3"}));
  for (auto* s : all) EXPECT_EQ(s->cachedNames(), 3u);

  for (auto* s : all) s->addLocal(request("h3"));
  for (auto* s : all) s->addLocal(request("h1"));
  a.addLocal(request("h2"));
  b.addLocal(request("new"));  // uncached, on one agent only
  EXPECT_EQ(a.cacheVector()[0], 1);
  EXPECT_EQ(b.cacheVector()[0], 0);
  for (auto* s : all) EXPECT_EQ(s->cacheVectorSize(), NegotiationState::kHeaderBytes + 3);
  EXPECT_EQ(a.cacheVector()[NegotiationState::kHeaderBytes + 1], 1);  // h2 pending on a
  EXPECT_EQ(c.cacheVector()[NegotiationState::kHeaderBytes + 1], 0);
  auto second = cycle(all);
  for (const auto& r : second) EXPECT_EQ(names(r), (std::vector<std::string>{"h1", "h3"}));
  EXPECT_TRUE(a.hasPending());  // h2 waits for the others
  EXPECT_TRUE(b.hasPending());  // "new" waits for the others
  EXPECT_FALSE(c.hasPending());
}

// Capacity 2 (KOLO_CACHE_CAPACITY): a third name evicts the least recently
// used on every agent and reuses its bit. A copy of the evicted name that
// was pending as a hit on one agent is announced again, and completes once
// the other agent submits it too (it would otherwise wait on a bit that no
// longer exists).
TEST(NegotiationCache, FullCacheEvictsTheLeastRecentlyUsedAlikeOnEveryAgent) {
  NegotiationState a(0, 2, 2), b(1, 2, 2);
  for (auto* s : {&a, &b}) {
    s->addLocal(request("x"));
    s->addLocal(request("y"));
  }
  cycle({&a, &b});
  ASSERT_EQ(a.cachedNames(), 2u);
  for (auto* s : {&a, &b}) s->addLocal(request("x"));
  auto hit = cycle({&a, &b});  // a common hit: x becomes the most recently used
  EXPECT_EQ(names(hit[0]), std::vector<std::string>{"x"});

  a.addLocal(request("y"));  // a hit on a: waits on y's bit, unannounced
  for (auto* s : {&a, &b}) s->addLocal(request("z"));
  auto evict = cycle({&a, &b});  // z completes and evicts y (the LRU) everywhere
  EXPECT_EQ(names(evict[0]), std::vector<std::string>{"z"});
  EXPECT_EQ(names(evict[1]), std::vector<std::string>{"z"});
  EXPECT_EQ(a.cachedNames(), 2u);
  auto sa = a.inlineSlots(256, 4096), sb = b.inlineSlots(256, 4096);
  ASSERT_EQ(sa.size(), 2u);
  ASSERT_EQ(sb.size(), 2u);
  EXPECT_EQ(sa[0].name, "x");
  EXPECT_EQ(sa[1].name, "z");  // y's bit, reused
  EXPECT_EQ(sa[1].bit, 1u);
  EXPECT_EQ(sb[1].name, "z");
  EXPECT_EQ(sb[1].bit, 1u);
  EXPECT_TRUE(a.hasUnannounced());  // y, announced again

  auto wait = cycle({&a, &b});  // a announces y; b has not submitted it yet
  EXPECT_TRUE(wait[0].empty());
  EXPECT_TRUE(wait[1].empty());
  b.addLocal(request("y"));
  auto done = cycle({&a, &b});
  EXPECT_EQ(names(done[0]), std::vector<std::string>{"y"});
  EXPECT_EQ(names(done[1]), std::vector<std::string>{"y"});
  EXPECT_FALSE(a.hasPending());
  EXPECT_FALSE(b.hasPending());
  // y evicted x (used before z): the same on both agents.
  sa = a.inlineSlots(256, 4096);
  sb = b.inlineSlots(256, 4096);
  ASSERT_EQ(sa.size(), 2u);
  EXPECT_EQ(sa[0].name, "y");
  EXPECT_EQ(sa[1].name, "z");
  EXPECT_EQ(sb[0].name, "y");
  EXPECT_EQ(sb[1].name, "z");
}

// Capacity 0 (--disable-cache): nothing is cached, every cycle announces.
TEST(NegotiationCache, CapacityZeroNegotiatesEveryNameInFull) {
  NegotiationState a(0, 2, 0), b(1, 2, 0);
  for (int step = 0; step < 3; ++step) {
    for (auto* s : {&a, &b}) s->addLocal(request("x"));
    EXPECT_EQ(a.cacheVector()[0], 0);
    auto r = cycle({&a, &b});
    EXPECT_EQ(names(r[0]), std::vector<std::string>{"x"});
    EXPECT_EQ(a.cachedNames(), 0u);
    EXPECT_EQ(a.cacheVectorSize(), NegotiationState::kHeaderBytes);
  }
}

}  // namespace
}  // namespace kolo
