// One agent's message in one negotiation cycle, and what the agents agree
// from everyone's. Pure: CrossJob::cycle runs the collective over the
// backend; this lays the message out and reads the result (unit-tested
// without a backend, tests/agent/cycle_message_test.cc).
//
// Layout:
//   [cache vector]  NegotiationState::cacheVector(): 3 header bytes, one per cache bit
//   [parameters]    AgreedParams::kWireBytes: the leader's values, 0xFF elsewhere
//   [payload]       only with inline slots: zeros to an 8-byte boundary, then
//                   the payload region (each slot at its offset, this agent's
//                   data where the name is ready here), zeros to a multiple of 8
// Without inline slots the agents Min-reduce the message in place. With
// them they allgather it, and each agent takes the Min of the cache vector
// and parameters itself and reduces the agreed slots' payloads in agent
// order (docs/fusion-and-timeline.md, "Inline allreduces").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "agent/cross/negotiation_state.h"

namespace kolo {

// The parameters every agent of a job must agree on, carried in each
// negotiation cycle: the leader's values win.
struct AgreedParams {
  uint64_t fusion_threshold_bytes = 0;
  uint64_t small_message_bytes = 0;
  uint64_t fusion_chunk_bytes = 0;       // 0: a fused buffer is one collective
  uint64_t fusion_max_tensor_bytes = 0;  // 0: any tensor may be fused
  uint64_t inline_bytes = 0;             // 0: no allreduce travels inside the cycle's message
  uint64_t pipeline_bytes = 0;           // 0: no unfused allreduce is posted in chunks
  static constexpr size_t kWireBytes = 24;
  // Leader: the values (fusion threshold in KiB, switch point in bytes,
  // fusion chunk and largest fused tensor in KiB, largest inline
  // allreduce in bytes, smallest pipelined allreduce in KiB; each 4 bytes
  // little-endian, saturated). Others:
  // all 0xFF, so that a bytewise Min yields the leader's bytes.
  void encode(bool leader, uint8_t* out) const;
  static AgreedParams decode(const uint8_t* in);
};

class CycleMessage {
 public:
  using InlineSlot = NegotiationState::InlineSlot;

  CycleMessage(std::vector<uint8_t> cache_vector, const AgreedParams& proposal, bool leader,
               std::vector<InlineSlot> slots);

  // The bytes this agent sends (and, Min-reduced in place, the result).
  uint8_t* data() { return msg_.data(); }
  size_t size() const { return msg_.size(); }
  // Allgathered (there are inline slots) rather than Min-reduced.
  bool gathers() const { return !slots_.empty(); }
  const std::vector<InlineSlot>& slots() const { return slots_; }
  // Where this agent puts its data for `slot` (slot.bytes long, zeroed).
  uint8_t* payload(const InlineSlot& slot) { return msg_.data() + head_ + slot.offset; }

  // Allgather: the receive buffer for every agent's message, agent after
  // agent (size() bytes each); then combineGathered() takes the Min of
  // their cache vectors and parameters into this message.
  uint8_t* gatherBuffer(int nagents);
  void combineGathered();

  // After the collective: the agreed parameters, the reduced cache vector
  // (for NegotiationState::complete), and the inline slots every agent
  // marked ready (their allreduces complete in this cycle).
  AgreedParams agreed() const;
  std::vector<uint8_t> reducedCacheVector() const;
  std::vector<const InlineSlot*> agreedInline() const;
  // Agent a's payload of `slot` in the gathered messages.
  const uint8_t* gatheredPayload(int agent, const InlineSlot& slot) const;
  int agents() const { return nagents_; }

 private:
  std::vector<uint8_t> msg_;
  size_t cache_bytes_ = 0;  // the cache vector's length
  size_t head_ = 0;         // the payload region's offset (8-byte aligned)
  std::vector<InlineSlot> slots_;
  std::vector<uint8_t> gathered_;
  int nagents_ = 0;
};

}  // namespace kolo
