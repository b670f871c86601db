// The negotiation cycle's message (CycleMessage), without a backend: the
// collective is done by hand here (a bytewise Min, or an allgather).
#include "agent/cross/cycle_message.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/agent/negotiation_cycle.h"

namespace kolo {
namespace {
using testing_negotiation::cycle;
using testing_negotiation::request;

AgreedParams params() {
  AgreedParams p;
  p.fusion_threshold_bytes = 64ull << 20;
  p.small_message_bytes = 65536;
  p.fusion_chunk_bytes = 8ull << 20;
  p.fusion_max_tensor_bytes = 1 << 20;
  p.inline_bytes = 256;
  p.pipeline_bytes = 8ull << 20;
  return p;
}

// Without inline slots: the cache vector then the parameters, Min-reduced
// in place; every agent reads the leader's parameters and the common bits.
TEST(CycleMessage, WithoutInlineSlotsItIsMinReducedInPlace) {
  const std::vector<uint8_t> v0 = {1, 1, 0, 1, 1, 0}, v1 = {0, 1, 0, 1, 0, 1};
  AgreedParams other = params();
  other.fusion_threshold_bytes = 1 << 20;  // ignored: not the leader's
  CycleMessage leader(v0, params(), true, {}), follower(v1, other, false, {});
  EXPECT_FALSE(leader.gathers());
  ASSERT_EQ(leader.size(), v0.size() + AgreedParams::kWireBytes);
  ASSERT_EQ(follower.size(), leader.size());
  for (size_t i = 0; i < leader.size(); ++i) {  // the backend's Min-allreduce
    const uint8_t m = std::min(leader.data()[i], follower.data()[i]);
    leader.data()[i] = follower.data()[i] = m;
  }
  for (CycleMessage* m : {&leader, &follower}) {
    EXPECT_EQ(m->reducedCacheVector(), (std::vector<uint8_t>{0, 1, 0, 1, 0, 0}));
    AgreedParams a = m->agreed();
    EXPECT_EQ(a.fusion_threshold_bytes, 64ull << 20);
    EXPECT_EQ(a.small_message_bytes, 65536u);
    EXPECT_EQ(a.pipeline_bytes, 8ull << 20);
    EXPECT_TRUE(m->agreedInline().empty());
  }
}

// With inline slots (from two agents' identical caches): the message is
// allgathered; each agent takes the Min of the cache vectors and
// parameters, finds the slots every agent marked ready, and reads every
// agent's payload of them at 8-byte aligned places.
TEST(CycleMessage, InlineSlotsAreAllgatheredAndAgreedWhereEveryAgentIsReady) {
  NegotiationState s0(0, 2, 16), s1(1, 2, 16);
  for (auto* s : {&s0, &s1}) {
    s->addLocal(request("a", CollectiveType::kAllreduce, 1));  // 4 B
    s->addLocal(request("b", CollectiveType::kAllreduce, 3));  // 12 B
  }
  cycle({&s0, &s1});  // both cached, alike
  s0.addLocal(request("a", CollectiveType::kAllreduce, 1));
  s0.addLocal(request("b", CollectiveType::kAllreduce, 3));
  s1.addLocal(request("b", CollectiveType::kAllreduce, 3));  // "a" is not ready on agent 1

  std::vector<std::unique_ptr<CycleMessage>> msgs;
  msgs.push_back(
      std::make_unique<CycleMessage>(s0.cacheVector(), params(), true, s0.inlineSlots(256, 4096)));
  msgs.push_back(
      std::make_unique<CycleMessage>(s1.cacheVector(), params(), false, s1.inlineSlots(256, 4096)));
  ASSERT_TRUE(msgs[0]->gathers());
  ASSERT_EQ(msgs[0]->slots().size(), 2u);
  ASSERT_EQ(msgs[0]->size(), msgs[1]->size());
  EXPECT_EQ(msgs[0]->size() % 8, 0u);
  for (int a = 0; a < 2; ++a) {
    for (const auto& slot : msgs[a]->slots()) {
      uint8_t* p = msgs[a]->payload(slot);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 8, 0u) << "slot of " << slot.name;
      std::vector<float> data(slot.bytes / 4, static_cast<float>(10 * a + slot.bit + 1));
      std::memcpy(p, data.data(), slot.bytes);
    }
  }
  // The backend's allgather: every agent's message, agent after agent.
  for (auto& m : msgs) {
    uint8_t* all = m->gatherBuffer(2);
    for (int a = 0; a < 2; ++a) std::memcpy(all + a * m->size(), msgs[a]->data(), m->size());
  }
  for (auto& m : msgs) m->combineGathered();
  for (auto& m : msgs) {
    EXPECT_EQ(m->agreed().fusion_threshold_bytes, 64ull << 20);
    std::vector<uint8_t> v = m->reducedCacheVector();
    ASSERT_EQ(v.size(), NegotiationState::kHeaderBytes + 2);
    auto agreed = m->agreedInline();
    ASSERT_EQ(agreed.size(), 1u);  // only "b" is ready on both
    EXPECT_EQ(agreed[0]->name, "b");
    for (int a = 0; a < 2; ++a) {
      float f[3];
      std::memcpy(f, m->gatheredPayload(a, *agreed[0]), sizeof f);
      EXPECT_EQ(f[2], static_cast<float>(10 * a + agreed[0]->bit + 1)) << "agent " << a;
    }
  }
}

}  // namespace
}  // namespace kolo
