#include "agent/negotiation/cache_bits.h"

#include <algorithm>
#include <bit>

namespace kolo::negotiation {

void setBit(CacheBits& v, uint32_t bit) {
  if (v.size() <= bit / 64) v.resize(bit / 64 + 1, 0);
  v[bit / 64] |= (uint64_t{1} << (bit % 64));
}

void clearBit(CacheBits& v, uint32_t bit) {
  if (v.size() > bit / 64) v[bit / 64] &= ~(uint64_t{1} << (bit % 64));
}

bool testBit(const CacheBits& v, uint32_t bit) {
  return v.size() > bit / 64 && ((v[bit / 64] >> (bit % 64)) & 1u) != 0;
}

void andInto(CacheBits& dst, const CacheBits& src) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i] &= i < src.size() ? src[i] : 0;
}

void orInto(CacheBits& dst, const CacheBits& src) {
  if (dst.size() < src.size()) dst.resize(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) dst[i] |= src[i];
}

std::vector<uint32_t> setBits(const CacheBits& v) {
  std::vector<uint32_t> out;
  for (size_t w = 0; w < v.size(); ++w) {
    uint64_t word = v[w];
    while (word != 0) {
      out.push_back(static_cast<uint32_t>(w * 64 + std::countr_zero(word)));
      word &= word - 1;
    }
  }
  return out;
}

CacheBits CacheSync::encodeAnd(uint32_t num_cache_bits) const {
  CacheBits v(wordsFor(kNumStatusBits + num_cache_bits), 0);
  // Status bits inverted: 1 means "not raised here".
  if (!shutdown_) setBit(v, static_cast<uint32_t>(StatusBit::kShutdown));
  if (!uncached_) setBit(v, static_cast<uint32_t>(StatusBit::kUncachedInQueue));
  if (!invalid_in_queue_) setBit(v, static_cast<uint32_t>(StatusBit::kInvalidInQueue));
  for (uint32_t b : hits_) {
    if (b < num_cache_bits) setBit(v, kNumStatusBits + b);
  }
  return v;
}

void CacheSync::decodeAnd(const CacheBits& reduced) {
  shutdown_ = !testBit(reduced, static_cast<uint32_t>(StatusBit::kShutdown));
  uncached_ = !testBit(reduced, static_cast<uint32_t>(StatusBit::kUncachedInQueue));
  invalid_in_queue_ = !testBit(reduced, static_cast<uint32_t>(StatusBit::kInvalidInQueue));
  hits_.clear();
  for (uint32_t b : setBits(reduced)) {
    if (b >= kNumStatusBits) hits_.insert(b - kNumStatusBits);
  }
}

CacheBits CacheSync::encodeInvalidOr(uint32_t num_cache_bits) const {
  CacheBits v(wordsFor(num_cache_bits), 0);
  for (uint32_t b : invalid_) {
    if (b < num_cache_bits) setBit(v, b);
  }
  return v;
}

void CacheSync::decodeInvalidOr(const CacheBits& reduced) {
  for (uint32_t b : setBits(reduced)) invalid_.insert(b);
  // A hit on an entry that is being erased cannot be served from the cache.
  for (uint32_t b : invalid_) hits_.erase(b);
}

}  // namespace kolo::negotiation
