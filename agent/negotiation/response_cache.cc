#include "agent/negotiation/response_cache.h"

namespace kolo::negotiation {

bool ResponseCache::isCacheable(CollectiveType c) {
  return c != CollectiveType::kBarrier && c != CollectiveType::kJoin;
}

CacheState ResponseCache::lookup(std::string_view name, const SubmitDesc& params) const {
  auto bit = bitOf(name);
  if (!bit) return CacheState::kMiss;
  return same_((*by_bit_[*bit])->params, params) ? CacheState::kHit : CacheState::kInvalid;
}

std::optional<uint32_t> ResponseCache::bitOf(std::string_view name) const {
  auto it = name_to_bit_.find(std::string(name));
  if (it == name_to_bit_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint32_t> ResponseCache::put(const std::string& name, const SubmitDesc& params,
                                           std::optional<CacheEntry>* evicted) {
  if (!enabled() || !isCacheable(static_cast<CollectiveType>(params.collective))) {
    return std::nullopt;
  }
  if (auto known = name_to_bit_.find(name); known != name_to_bit_.end()) {
    auto it = *by_bit_[known->second];
    it->params = params;
    lru_.splice(lru_.begin(), lru_, it);
    return known->second;
  }
  uint32_t bit;
  if (!free_bits_.empty()) {
    bit = *free_bits_.begin();
    free_bits_.erase(free_bits_.begin());
  } else if (lru_.size() < capacity_) {
    bit = static_cast<uint32_t>(by_bit_.size());
    by_bit_.emplace_back();
  } else {
    CacheEntry& victim = lru_.back();
    bit = victim.bit;
    name_to_bit_.erase(victim.name);
    if (evicted != nullptr) *evicted = std::move(victim);
    lru_.pop_back();
  }
  lru_.push_front(CacheEntry{name, params, bit});
  by_bit_[bit] = lru_.begin();
  name_to_bit_[name] = bit;
  return bit;
}

const CacheEntry* ResponseCache::get(uint32_t bit) {
  if (bit >= by_bit_.size() || !by_bit_[bit]) return nullptr;
  auto it = *by_bit_[bit];
  lru_.splice(lru_.begin(), lru_, it);
  return &*it;
}

const CacheEntry* ResponseCache::peek(uint32_t bit) const {
  if (bit >= by_bit_.size() || !by_bit_[bit]) return nullptr;
  return &**by_bit_[bit];
}

bool ResponseCache::erase(uint32_t bit) {
  if (bit >= by_bit_.size() || !by_bit_[bit]) return false;
  auto it = *by_bit_[bit];
  name_to_bit_.erase(it->name);
  lru_.erase(it);
  by_bit_[bit].reset();
  free_bits_.insert(bit);
  // Trailing free bits shrink the bit space (identically on every agent).
  while (!by_bit_.empty() && !by_bit_.back()) {
    free_bits_.erase(static_cast<uint32_t>(by_bit_.size() - 1));
    by_bit_.pop_back();
  }
  return true;
}

void ResponseCache::clear() {
  lru_.clear();
  by_bit_.clear();
  name_to_bit_.clear();
  free_bits_.clear();
}

}  // namespace kolo::negotiation
