#include "arena_allocator.h"

#include <algorithm>

#include "common/ipc_layout.h"

namespace kolo {

uint64_t ArenaAllocator::roundUp(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > UINT64_MAX - kDataAlignment) return UINT64_MAX;  // never fits
  return (bytes + kDataAlignment - 1) & ~uint64_t{kDataAlignment - 1};
}

ArenaAllocator::ArenaAllocator(uint64_t begin, uint64_t bytes) {
  uint64_t end = begin + bytes;
  begin_ = (begin + kDataAlignment - 1) & ~uint64_t{kDataAlignment - 1};
  end &= ~uint64_t{kDataAlignment - 1};
  capacity_ = end > begin_ ? end - begin_ : 0;
  if (capacity_ > 0) free_[begin_] = capacity_;
}

std::optional<uint64_t> ArenaAllocator::allocate(uint64_t bytes) {
  uint64_t need = roundUp(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first;
    uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[off + need] = rest;
    live_[off] = need;
    used_ += need;
    return off;
  }
  return std::nullopt;
}

bool ArenaAllocator::free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_.find(offset);
  if (live == live_.end()) return false;
  uint64_t off = offset;
  uint64_t size = live->second;
  live_.erase(live);
  used_ -= size;
  // Merge with the free neighbour after, then the one before.
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += size;
      return true;
    }
  }
  free_[off] = size;
  return true;
}

uint64_t ArenaAllocator::blockSize(uint64_t offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(offset);
  return it == live_.end() ? 0 : it->second;
}

uint64_t ArenaAllocator::usedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t ArenaAllocator::largestFreeBlock() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

size_t ArenaAllocator::liveBlocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

size_t ArenaAllocator::freeBlocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

}  // namespace kolo
