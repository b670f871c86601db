// Response cache (Horovod's, at agent granularity): remembers the
// parameters of names that were negotiated before, and gives each one a
// cache bit so that later cycles agree on ready names with one small
// bit-vector AND instead of sending full requests (see cache_bits.h).
//
// Every agent of a job performs the same sequence of put / get / erase in
// the same order (they all follow the leader's ordered list and walk common
// hits in bit order), so their caches, and hence their bits, stay
// identical. Bits are assigned deterministically:
//   1. an existing name keeps its bit (its params are updated);
//   2. otherwise the lowest bit freed by erase() is reused;
//   3. otherwise, while below capacity, the next new bit;
//   4. otherwise the least recently used entry is evicted and its bit reused.
// Loop thread only; no locks.
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

namespace kolo::negotiation {

constexpr uint32_t kDefaultCacheCapacity = 1024;  // Horovod's HOROVOD_CACHE_CAPACITY default

// What must match for a cached response to be reused.
struct CacheParams {
  CollectiveType collective = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;  // broadcast root, -1 otherwise
  int device = -1;    // -1 = host memory
  bool operator==(const CacheParams&) const = default;
};

enum class CacheState {
  kMiss,     // name not cached
  kHit,      // name cached with the same params
  kInvalid,  // name cached with different params: erase it everywhere, renegotiate
};

struct CacheEntry {
  std::string name;
  CacheParams params;
  uint32_t bit = 0;
};

class ResponseCache {
 public:
  explicit ResponseCache(uint32_t capacity = kDefaultCacheCapacity) : capacity_(capacity) {}

  // Barrier and join are never cached: they carry no tensor to describe.
  static bool isCacheable(CollectiveType c);

  bool enabled() const { return capacity_ > 0; }
  uint32_t capacity() const { return capacity_; }
  size_t size() const { return lru_.size(); }
  // Length of the bit space (highest bit ever handed out + 1): the number of
  // cache bits every agent encodes each cycle.
  uint32_t numBits() const { return static_cast<uint32_t>(by_bit_.size()); }

  // Does not change recency.
  CacheState lookup(std::string_view name, const CacheParams& params) const;
  std::optional<uint32_t> bitOf(std::string_view name) const;

  // Inserts (or updates) `name`, makes it most recently used and returns its
  // bit; nullopt when the cache is disabled or the collective is not cacheable.
  std::optional<uint32_t> put(const std::string& name, const CacheParams& params);

  // The entry behind `bit`, made most recently used; nullptr if none. Serve
  // common hits in increasing bit order so every agent touches the LRU alike.
  const CacheEntry* get(uint32_t bit);
  // Same without changing recency.
  const CacheEntry* peek(uint32_t bit) const;

  // Removes the entry behind `bit`; its bit becomes free for reuse.
  bool erase(uint32_t bit);
  void clear();

 private:
  using List = std::list<CacheEntry>;  // front = most recently used

  uint32_t capacity_;
  List lru_;
  std::vector<std::optional<List::iterator>> by_bit_;
  std::unordered_map<std::string, uint32_t> name_to_bit_;
  std::set<uint32_t> free_bits_;
};

}  // namespace kolo::negotiation
