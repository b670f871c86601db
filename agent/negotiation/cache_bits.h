// Bit vectors for the response cache's per-cycle agreement, as Horovod's
// CacheCoordinator uses them.
//
// Each cycle every agent encodes one vector and the agents AND-allreduce it:
//  - word 0, bits 0..2 are status bits stored inverted (1 = "no"), so that
//    the AND acts as an OR over agents: after the AND a status bit reads 0
//    when ANY agent raised it (shutdown, uncached work in its queue, an
//    invalid cache entry in its queue);
//  - bit kNumStatusBits + b is set when this agent has a pending hit on
//    cache bit b; after the AND it is set only for hits common to all.
// When some agent raised "invalid", a second, OR-allreduce of a vector with
// one bit per invalid cache bit (no status bits) tells everyone which
// entries to erase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

namespace kolo::negotiation {

using CacheBits = std::vector<uint64_t>;

enum class StatusBit : uint32_t {
  kShutdown = 0,
  kUncachedInQueue = 1,
  kInvalidInQueue = 2,
};
constexpr uint32_t kNumStatusBits = 3;

// Number of 64-bit words for `nbits` bits.
constexpr size_t wordsFor(uint32_t nbits) { return (nbits + 63) / 64; }

void setBit(CacheBits& v, uint32_t bit);  // grows v as needed
void clearBit(CacheBits& v, uint32_t bit);
bool testBit(const CacheBits& v, uint32_t bit);
// In place, word by word; the shorter vector counts as zero-extended.
void andInto(CacheBits& dst, const CacheBits& src);
void orInto(CacheBits& dst, const CacheBits& src);
// Set bits in increasing order.
std::vector<uint32_t> setBits(const CacheBits& v);

// One agent's side of one cycle's agreement. Fill it from the loop, encode,
// let the transport allreduce, decode.
class CacheSync {
 public:
  void setShutdown() { shutdown_ = true; }
  void setUncachedInQueue() { uncached_ = true; }
  void addHit(uint32_t cache_bit) { hits_.insert(cache_bit); }
  void addInvalid(uint32_t cache_bit) {
    invalid_.insert(cache_bit);
    invalid_in_queue_ = true;
  }

  // `num_cache_bits`: the cache's numBits(); every agent must pass the same
  // value (the caches are in lockstep), so the vectors have the same length.
  CacheBits encodeAnd(uint32_t num_cache_bits) const;
  // Reads the AND-reduced vector: status flags become "any agent", hits
  // become the common hits.
  void decodeAnd(const CacheBits& reduced);
  // True after decodeAnd when some agent has invalid entries: run the OR round.
  bool needsInvalidRound() const { return invalid_in_queue_; }
  CacheBits encodeInvalidOr(uint32_t num_cache_bits) const;
  void decodeInvalidOr(const CacheBits& reduced);

  bool shutdown() const { return shutdown_; }
  bool uncachedInQueue() const { return uncached_; }
  bool invalidInQueue() const { return invalid_in_queue_; }
  // Ordered by bit: every agent walks them in the same order.
  const std::set<uint32_t>& hits() const { return hits_; }
  const std::set<uint32_t>& invalid() const { return invalid_; }

 private:
  bool shutdown_ = false;
  bool uncached_ = false;
  bool invalid_in_queue_ = false;
  std::set<uint32_t> hits_;
  std::set<uint32_t> invalid_;
};

}  // namespace kolo::negotiation
