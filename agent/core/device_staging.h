// Page-locked host buffers for device tensors staged across agents
// (docs/gpu.md, "Device tensors across agents"): a copy from the device
// into pinned memory is asynchronous, so the staging wait has a deadline
// that fires, where a copy into pageable memory blocks until the stream
// reaches it (forever, if a trainer's stream never does).
//
// A buffer handed out is reused only after the device is done with it:
// when its last reference drops, an event is recorded on the GPU's agent
// stream (every copy from or into it was enqueued there before), and the
// buffer waits behind it. Idle buffers are kept for reuse up to a cache
// bound; the bytes in use are bounded by the device ops in flight (each one
// stages a tensor that lives in a trainer's device arena). Thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "agent/gpu/device_api.h"
#include "common/status.h"

namespace kolo {

class PinnedStaging : public std::enable_shared_from_this<PinnedStaging> {
 public:
  static constexpr size_t kDefaultCacheBytes = size_t{256} << 20;
  static constexpr size_t kMinBuffer = size_t{1} << 20;

  // Buffers are allocated on `device` and parked behind `stream`, both the
  // GPU's agent stream's.
  static std::shared_ptr<PinnedStaging> create(gpu::DeviceApi& api, int device, void* stream,
                                               size_t cache_bytes = kDefaultCacheBytes);
  ~PinnedStaging();

  // At least `bytes` of pinned memory (a power of two from kMinBuffer).
  StatusOr<std::shared_ptr<char>> acquire(size_t bytes);

  // The size class of a request. Pure.
  static size_t sizeClass(size_t bytes);

  size_t idleBytes();
  size_t parkedCount();

 private:
  PinnedStaging(gpu::DeviceApi& api, int device, void* stream, size_t cache_bytes)
      : api_(api), device_(device), stream_(stream), cache_bytes_(cache_bytes) {}
  void park(std::shared_ptr<gpu::DevHostBuffer> b);
  void sweepLocked();
  void keepLocked(std::shared_ptr<gpu::DevHostBuffer> b);

  struct Parked {
    std::shared_ptr<gpu::DevHostBuffer> buf;
    std::unique_ptr<gpu::DevEvent> passed;
  };

  gpu::DeviceApi& api_;
  const int device_;
  void* const stream_;
  const size_t cache_bytes_;
  std::mutex mu_;
  std::multimap<size_t, std::shared_ptr<gpu::DevHostBuffer>> idle_;  // size class -> buffer
  size_t idle_bytes_ = 0;
  std::deque<Parked> parked_;                              // in release order
  std::vector<std::shared_ptr<gpu::DevHostBuffer>> lost_;  // never reused nor freed
};

}  // namespace kolo
