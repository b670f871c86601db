// Cross-agent negotiation, pure logic (no I/O): which names are ready on
// every agent, in one order that every agent computes identically.
//
// Each cycle every agent contributes (1) one byte per response-cache bit,
// set for its node-ready cached names, AND-reduced across agents (Min over
// 0/1 bytes), with byte 0 meaning "I have no unannounced uncached request";
// and, when some agent has one, (2) its unannounced requests, allgathered.
// Responses = common cache bits in ascending order, then names whose
// requests are now complete, in (agent, announcement) order. Cache bits are
// assigned in response order, so every agent's cache stays identical.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/ipc_layout.h"
#include "common/status.h"

namespace kolo {

struct CrossRequest {
  std::string name;
  SubmitDesc params;       // collective, dtype, op, shape, scale factors, root (handles unused)
  int first_rank = 0;      // a global rank that submitted it on that agent (for messages)
  std::string error;       // the ranks of that agent disagreed: every agent fails the name with this
};

struct CrossResponse {
  std::string name;
  Status error;            // mismatch across agents
};

std::string encodeRequests(const std::vector<CrossRequest>& reqs);
StatusOr<std::vector<CrossRequest>> decodeRequests(const std::string& bytes);

class NegotiationState {
 public:
  NegotiationState(int rank, int size, size_t cache_capacity)
      : rank_(rank), size_(size), capacity_(cache_capacity) {}

  // A node-ready name arrives from the loop.
  void addLocal(const CrossRequest& req);
  bool hasPending() const { return !pending_.empty(); }
  bool hasUnannounced() const { return !unannounced_.empty(); }

  // Cycle step 1: the bytes to AND-reduce.
  std::vector<uint8_t> cacheVector() const;
  size_t cacheVectorSize() const { return 1 + bit_names_.size(); }
  // Cycle step 2 (only if the reduced byte 0 is 0): what to allgather.
  std::string takeAnnouncements();
  // Cycle step 3: given the reduced vector and (if gathered) every agent's
  // announcements, returns the responses of this cycle in the agreed order.
  std::vector<CrossResponse> complete(const std::vector<uint8_t>& reduced,
                                      const std::vector<std::string>* gathered);

  size_t cachedNames() const { return name_bits_.size(); }

 private:
  struct Remote {
    std::vector<std::optional<CrossRequest>> by_agent;
    int count = 0;
  };
  void assignBit(const std::string& name, const SubmitDesc& params);
  void eraseBit(const std::string& name);
  static bool sameParams(const SubmitDesc& a, const SubmitDesc& b);

  int rank_;
  int size_;
  size_t capacity_;
  std::map<std::string, CrossRequest> pending_;      // node-ready here, not yet responded
  std::vector<std::string> unannounced_;             // uncached, not yet gathered
  std::map<std::string, Remote> remote_;             // uncached requests seen so far
  std::map<std::string, uint32_t> name_bits_;
  std::vector<std::string> bit_names_;               // bit -> name ("" = free)
  std::vector<SubmitDesc> bit_params_;
};

}  // namespace kolo
