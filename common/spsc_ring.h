// Single-producer single-consumer ring of fixed-size entries laid out in
// shared memory (a memfd mapped by two processes). Lock-free; the producer
// owns `tail`, the consumer owns `head`; both are monotonically increasing
// 64-bit counters so wrap-around never aliases.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kolo {

struct alignas(64) RingHeader {
  alignas(64) std::atomic<uint64_t> head;  // next entry to consume
  alignas(64) std::atomic<uint64_t> tail;  // next entry to produce
  alignas(64) uint64_t capacity;           // entries; a power of two
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SpscRing() = default;
  // `mem` points at a RingHeader followed by capacity entries.
  SpscRing(void* mem) : hdr_(static_cast<RingHeader*>(mem)) {  // NOLINT
    entries_ = reinterpret_cast<T*>(static_cast<char*>(mem) + sizeof(RingHeader));
  }
  static size_t bytesFor(uint64_t capacity) { return sizeof(RingHeader) + capacity * sizeof(T); }
  // Initializes an empty ring (the creating side only).
  static void format(void* mem, uint64_t capacity) {
    auto* h = new (mem) RingHeader();
    h->head.store(0, std::memory_order_relaxed);
    h->tail.store(0, std::memory_order_relaxed);
    h->capacity = capacity;
  }
  bool valid() const { return hdr_ != nullptr; }
  uint64_t capacity() const { return hdr_->capacity; }

  bool tryPush(const T& e) {
    uint64_t tail = hdr_->tail.load(std::memory_order_relaxed);
    uint64_t head = hdr_->head.load(std::memory_order_acquire);
    if (tail - head >= hdr_->capacity) return false;
    std::memcpy(&entries_[tail & (hdr_->capacity - 1)], &e, sizeof(T));
    hdr_->tail.store(tail + 1, std::memory_order_release);
    return true;
  }
  bool tryPop(T* out) {
    uint64_t head = hdr_->head.load(std::memory_order_relaxed);
    uint64_t tail = hdr_->tail.load(std::memory_order_acquire);
    if (head == tail) return false;
    // A hostile producer could move `tail` arbitrarily; we only ever read
    // inside our mapping because the index is masked.
    std::memcpy(out, &entries_[head & (hdr_->capacity - 1)], sizeof(T));
    hdr_->head.store(head + 1, std::memory_order_release);
    return true;
  }
  bool empty() const {
    return hdr_->head.load(std::memory_order_acquire) == hdr_->tail.load(std::memory_order_acquire);
  }
  uint64_t size() const {
    return hdr_->tail.load(std::memory_order_acquire) - hdr_->head.load(std::memory_order_acquire);
  }

 private:
  RingHeader* hdr_ = nullptr;
  T* entries_ = nullptr;
};

}  // namespace kolo
