// First-fit allocator with coalescing over one contiguous range of byte
// offsets (the data region of the shared arena). Pure bookkeeping: it never
// touches the memory itself, so it is unit-tested without an arena.
// Every returned offset is a multiple of kDataAlignment (64 bytes) and every
// block's size is rounded up to it. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace kolo {

class ArenaAllocator {
 public:
  // Manages [begin, begin + bytes). `begin` is rounded up and the end down to
  // the alignment, so the usable capacity may be slightly smaller.
  ArenaAllocator(uint64_t begin, uint64_t bytes);
  ArenaAllocator(const ArenaAllocator&) = delete;
  ArenaAllocator& operator=(const ArenaAllocator&) = delete;

  // An aligned offset of a free block of at least `bytes` (0 counts as one
  // alignment unit), or nullopt when no free block is large enough.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Frees a block returned by allocate(); false if `offset` is not the
  // start of a live block (nothing changes then).
  bool free(uint64_t offset);
  // Size of the live block starting at `offset`, or 0.
  uint64_t blockSize(uint64_t offset) const;

  uint64_t begin() const { return begin_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t usedBytes() const;
  uint64_t largestFreeBlock() const;
  size_t liveBlocks() const;
  size_t freeBlocks() const;  // fragments; 1 when everything is free

  static uint64_t roundUp(uint64_t bytes);

 private:
  mutable std::mutex mu_;
  uint64_t begin_ = 0;
  uint64_t capacity_ = 0;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> size, sorted, never adjacent
  std::map<uint64_t, uint64_t> live_;  // offset -> size
};

}  // namespace kolo
