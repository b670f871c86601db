// Single-producer single-consumer ring of fixed-size entries laid out in
// shared memory (a memfd mapped by two processes). Lock-free; the producer
// owns `tail`, the consumer owns `head`; both are monotonically increasing
// 64-bit counters so wrap-around never aliases.
//
// The two processes do not trust each other (docs/security.md, "Shared
// memory the trainer can write"): each side keeps the ring's capacity and
// its own index in private memory and only publishes the index to the
// header; it never reads its own index or the capacity back from shared
// memory. The peer's index is read once per operation and bounds-checked
// (tail - head must lie in [0, capacity]); a ring whose peer broke that is
// corrupt from then on: every operation fails and corruption() says what
// was seen. Entries are copied out with memcpy at a masked index, so a
// hostile peer can only ever make us read or write inside the ring.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
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
  // `mem` points at a RingHeader followed by `capacity` entries. The side
  // that formatted the ring passes the capacity it formatted it with; the
  // other side (which checked the header) may pass 0 to take the header's
  // value once, here. The indices are taken from the header once, here too.
  explicit SpscRing(void* mem, uint64_t capacity = 0) : hdr_(static_cast<RingHeader*>(mem)) {
    entries_ = reinterpret_cast<T*>(static_cast<char*>(mem) + sizeof(RingHeader));
    capacity_ = capacity != 0 ? capacity : hdr_->capacity;
    head_ = hdr_->head.load(std::memory_order_acquire);
    tail_ = hdr_->tail.load(std::memory_order_acquire);
    if (capacity_ == 0 || (capacity_ & (capacity_ - 1)) != 0) {
      fail("capacity " + std::to_string(capacity_) + " is not a power of two");
    } else if (tail_ - head_ > capacity_) {
      fail("at attach, " + describe(tail_, head_));
    }
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
  // The private capacity (what this side formatted or checked at attach).
  uint64_t capacity() const { return capacity_; }
  // The peer broke the ring's invariants (or the header was bad at attach).
  bool corrupt() const { return !corruption_.empty(); }
  const std::string& corruption() const { return corruption_; }

  // Producer side. False when the ring is full or corrupt (see corrupt()).
  bool tryPush(const T& e) {
    if (corrupt()) return false;
    const uint64_t head = hdr_->head.load(std::memory_order_acquire);  // the consumer's, untrusted
    const uint64_t used = tail_ - head;
    if (used > capacity_) {
      fail("the consumer moved the head: " + describe(tail_, head));
      return false;
    }
    if (used == capacity_) return false;
    std::memcpy(&entries_[tail_ & (capacity_ - 1)], &e, sizeof(T));
    ++tail_;
    hdr_->tail.store(tail_, std::memory_order_release);
    return true;
  }
  // Consumer side. False when the ring is empty or corrupt (see corrupt()).
  bool tryPop(T* out) {
    if (corrupt()) return false;
    const uint64_t tail = hdr_->tail.load(std::memory_order_acquire);  // the producer's, untrusted
    const uint64_t avail = tail - head_;
    if (avail > capacity_) {
      fail("the producer moved the tail: " + describe(tail, head_));
      return false;
    }
    if (avail == 0) return false;
    std::memcpy(out, &entries_[head_ & (capacity_ - 1)], sizeof(T));
    ++head_;
    hdr_->head.store(head_, std::memory_order_release);
    return true;
  }
  // Consumer side: nothing to pop. A ring whose producer broke it is empty
  // here (tryPop reports the corruption).
  bool empty() const {
    if (corrupt()) return true;
    const uint64_t avail = hdr_->tail.load(std::memory_order_acquire) - head_;
    return avail == 0 || avail > capacity_;
  }
  // Consumer side: entries ready to pop (0 when corrupt).
  uint64_t size() const {
    if (corrupt()) return 0;
    const uint64_t avail = hdr_->tail.load(std::memory_order_acquire) - head_;
    return avail > capacity_ ? 0 : avail;
  }

 private:
  // "tail T, head H: N entries in a ring of C" (N may be negative: a head past the tail).
  std::string describe(uint64_t tail, uint64_t head) const {
    return "tail " + std::to_string(tail) + ", head " + std::to_string(head) + ": " +
           std::to_string(static_cast<int64_t>(tail - head)) + " entries in a ring of " +
           std::to_string(capacity_);
  }
  void fail(std::string why) {
    if (corruption_.empty()) corruption_ = std::move(why);
  }

  RingHeader* hdr_ = nullptr;
  T* entries_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t head_ = 0;  // the consumer's index (private; published to hdr_->head)
  uint64_t tail_ = 0;  // the producer's index (private; published to hdr_->tail)
  std::string corruption_;
};

}  // namespace kolo
