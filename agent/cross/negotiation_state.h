// Cross-agent negotiation, pure logic (no I/O): which names are ready on
// every agent, in one order that every agent computes identically.
//
// Each cycle every agent contributes (1) one byte per response-cache bit,
// set for its node-ready cached names, AND-reduced across agents (Min over
// 0/1 bytes), with byte 0 meaning "I have no unannounced uncached request",
// byte 1 "none of my ranks is absent through kolo_join" and byte 2 "every
// one of my ranks has joined";
// and, when some agent has one, (2) its unannounced requests, allgathered.
// Responses = common cache bits in ascending order, then names whose
// requests are now complete, in (agent, announcement) order. Cache bits are
// assigned in response order and common hits touch the cache's LRU in bit
// order, so every agent's cache (negotiation::ResponseCache) stays
// identical, evictions included.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/negotiation/response_cache.h"
#include "common/ipc_layout.h"
#include "common/status.h"

namespace kolo {

struct CrossRequest {
  std::string name;
  SubmitDesc params{};     // collective, dtype, op, shape, scale factors, root (handles unused)
  int first_rank = 0;      // a global rank that submitted it on that agent (for messages)
  std::string error;  // that agent failed the op (Status::toString(): its code crosses too), e.g.
                      // its ranks disagreed: every agent fails the name with this
};

struct CrossResponse {
  std::string name;
  Status error;            // mismatch across agents
  SubmitDesc params{};     // the agreed parameters (a joined agent builds its zero contribution from them)
};

// Bounds on what a peer agent announces in one cycle (the receiving agent
// allocates by these sizes): the bytes of one agent's announcements, and
// the length of a request's error text.
constexpr uint64_t kMaxAnnouncementBytes = 64ull << 20;
constexpr uint32_t kMaxRequestErrorBytes = 64 * 1024;

std::string encodeRequests(const std::vector<CrossRequest>& reqs);
StatusOr<std::vector<CrossRequest>> decodeRequests(const std::string& bytes);

class NegotiationState {
 public:
  NegotiationState(int rank, int size, size_t cache_capacity)
      : rank_(rank), size_(size), cache_(cache_capacity, &NegotiationState::sameParams) {}

  // Whether two requests for one name agree on everything every rank must
  // agree on (TensorTable::describeMismatch finds no difference).
  static bool sameParams(const SubmitDesc& a, const SubmitDesc& b);

  // A node-ready name arrives from the loop.
  void addLocal(const CrossRequest& req);

  // Join: while every local rank has joined, this agent stands in for them:
  // its cache vector sets every bit, and standInForJoined() announces every
  // name another agent announced and this one has not (with that agent's
  // parameters), so the name completes everywhere; the caller contributes
  // zeros. While some agent stands in (byte 1 reduced to 0), every agent
  // fails any response other than an allreduce or allgather, identically.
  // Called before every cycle; the first cycle after joining does not stand
  // in yet (so the cycle in which the last node joins answers only names
  // some node really has). While every node had joined in the previous
  // cycle, the cached bits are inverted (1 = "not pending here"), so a name
  // completes as soon as any node has it and no node has to set bits for
  // names nobody submitted.
  void setJoined(bool joined) {
    if (!joined) joined_cycles_ = 0;
    joined_ = joined;
  }

  // Grouped allreduce `group_id` failed (decided by a response, so on every
  // agent at the same point): forgets every request of that group, this
  // agent's and the others' announcements alike, so a member that only
  // some agents submitted never completes later.
  void forgetGroup(uint64_t group_id);
  void standInForJoined();
  bool hasPending() const { return !pending_.empty(); }
  bool hasUnannounced() const { return !unannounced_.empty(); }

  // Cycle step 1: the bytes to AND-reduce.
  std::vector<uint8_t> cacheVector() const;
  size_t cacheVectorSize() const { return kHeaderBytes + cache_.numBits(); }
  static constexpr size_t kHeaderBytes = 3;
  // Cycle step 2 (only if the reduced byte 0 is 0): what to allgather.
  std::string takeAnnouncements();
  // Cycle step 3: given the reduced vector and (if gathered) every agent's
  // announcements, returns the responses of this cycle in the agreed order.
  std::vector<CrossResponse> complete(const std::vector<uint8_t>& reduced,
                                      const std::vector<std::string>* gathered);

  size_t cachedNames() const { return cache_.size(); }

  // The cached allreduces small enough to travel inside a cycle's message
  // (CrossJob::cycle): in ascending cache bit order while they fit
  // `max_total_bytes`, each up to `max_tensor_bytes`, at 8-byte aligned
  // offsets of the payload region. A function of the cache alone, which is
  // identical on every agent, so every agent lays the region out alike.
  struct InlineSlot {
    size_t bit = 0;
    std::string name;
    size_t offset = 0;
    size_t bytes = 0;  // the cached request's data_bytes
  };
  std::vector<InlineSlot> inlineSlots(uint64_t max_tensor_bytes, uint64_t max_total_bytes) const;
  // The cache bits of the coming cycle mean "not pending here" (every node
  // had joined): a set bit then no longer means "ready on every agent".
  bool invertedBits() const { return inverted(); }

 private:
  struct Remote {
    std::vector<std::optional<CrossRequest>> by_agent;
    int count = 0;
  };
  // Caches a completed name; a pending hit on the entry this evicts is
  // announced again (it no longer has a bit to wait on).
  void assignBit(const std::string& name, const SubmitDesc& params);
  void eraseBit(const std::string& name);
  bool isHit(const CrossRequest& req) const;

  int rank_;
  int size_;
  bool joined_ = false;
  int joined_cycles_ = 0;         // cycles completed while joined
  bool all_joined_last_ = false;  // the previous cycle's byte 2: every node had joined
  bool inverted() const { return joined_ && all_joined_last_; }
  std::map<std::string, CrossRequest> pending_;      // node-ready here, not yet responded
  std::vector<std::string> unannounced_;             // uncached, not yet gathered
  std::map<std::string, Remote> remote_;             // uncached requests seen so far
  negotiation::ResponseCache cache_;
};

}  // namespace kolo
