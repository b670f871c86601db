// Response cache (Horovod's, at agent granularity): remembers the
// parameters of names that were negotiated before, and gives each one a
// cache bit so that later cycles agree on ready names with one small
// vector Min-reduce instead of sending full requests (NegotiationState,
// agent/cross/negotiation_state.h, is its one user).
//
// Every agent of a job performs the same sequence of put / get / erase in
// the same order (they all complete the same responses in the same order
// and walk common hits in bit order), so their caches, and hence their
// bits, stay identical. Bits are assigned deterministically:
//   1. an existing name keeps its bit (its params are updated);
//   2. otherwise the lowest bit freed by erase() is reused;
//   3. otherwise, while below capacity, the next new bit;
//   4. otherwise the least recently used entry is evicted and its bit reused
//      (HOROVOD_CACHE_CAPACITY; KOLO_CACHE_CAPACITY here).
// Erasing the highest bits in use shrinks the bit space, identically on
// every agent. One thread only (the job's negotiation thread); no locks.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/ipc_layout.h"

namespace kolo::negotiation {

constexpr uint32_t kDefaultCacheCapacity = 1024;  // Horovod's HOROVOD_CACHE_CAPACITY default

// Whether a request's parameters match a cached response's (the caller's
// rule: NegotiationState::sameParams, which compares what every rank must
// agree on and ignores arena offsets and handles).
using SameParams = bool (*)(const SubmitDesc& a, const SubmitDesc& b);

enum class CacheState {
  kMiss,     // name not cached
  kHit,      // name cached with the same params
  kInvalid,  // name cached with different params: erase it everywhere, renegotiate
};

struct CacheEntry {
  std::string name;
  SubmitDesc params{};
  uint32_t bit = 0;
};

class ResponseCache {
 public:
  ResponseCache(size_t capacity, SameParams same) : capacity_(capacity), same_(same) {}

  // Barrier and join are never cached: they carry no tensor to describe.
  static bool isCacheable(CollectiveType c);

  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  size_t size() const { return lru_.size(); }
  // Length of the bit space (highest bit in use + 1): the number of cache
  // bits every agent encodes each cycle.
  uint32_t numBits() const { return static_cast<uint32_t>(by_bit_.size()); }

  // Does not change recency.
  CacheState lookup(std::string_view name, const SubmitDesc& params) const;
  std::optional<uint32_t> bitOf(std::string_view name) const;

  // Inserts (or updates) `name`, makes it most recently used and returns its
  // bit; nullopt when the cache is disabled or the collective is not
  // cacheable. When the cache was full, the least recently used entry is
  // evicted and, if `evicted` is given, copied there.
  std::optional<uint32_t> put(const std::string& name, const SubmitDesc& params,
                              std::optional<CacheEntry>* evicted = nullptr);

  // The entry behind `bit`, made most recently used; nullptr if none. Serve
  // common hits in increasing bit order so every agent touches the LRU alike.
  const CacheEntry* get(uint32_t bit);
  // Same without changing recency.
  const CacheEntry* peek(uint32_t bit) const;

  // Removes the entry behind `bit`; its bit becomes free for reuse (and the
  // bit space shrinks while its highest bit is free).
  bool erase(uint32_t bit);
  void clear();

 private:
  using List = std::list<CacheEntry>;  // front = most recently used

  size_t capacity_;
  SameParams same_;
  List lru_;
  std::vector<std::optional<List::iterator>> by_bit_;
  std::unordered_map<std::string, uint32_t> name_to_bit_;
  std::set<uint32_t> free_bits_;
};

}  // namespace kolo::negotiation
