#include "agent/cross/fusion_buffer.h"

#include <algorithm>
#include <cstring>

#include "common/staging_pool.h"

namespace kolo {

FusionBuffer::FusionBuffer(uint64_t bytes, uint64_t alloc_bytes)
    : buf_(staging::acquireShared(std::max(bytes, alloc_bytes))), bytes_(bytes) {}

void FusionBuffer::packRange(uint64_t begin, uint64_t end) {
  uint64_t cursor = begin;
  for (const Part& p : parts_) {
    const uint64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.bytes);
    if (lo >= hi) continue;
    if (lo > cursor) std::memset(buf_.get() + cursor, 0, lo - cursor);
    std::memcpy(buf_.get() + lo, static_cast<const char*>(p.data) + (lo - p.offset), hi - lo);
    cursor = hi;
  }
  if (cursor < end) std::memset(buf_.get() + cursor, 0, end - cursor);
}

void FusionBuffer::packParts(const std::function<bool(const Part&)>& which) {
  for (const Part& p : parts_) {
    if (p.bytes > 0 && which(p)) std::memcpy(buf_.get() + p.offset, p.data, p.bytes);
  }
}

void FusionBuffer::unpackParts(const std::function<bool(const Part&)>& which) {
  for (const Part& p : parts_) {
    if (p.bytes > 0 && which(p)) std::memcpy(p.data, buf_.get() + p.offset, p.bytes);
  }
}

}  // namespace kolo
