#include "agent/core/device_staging.h"

#include <mutex>
#include <vector>

#include "common/log.h"

namespace kolo {

std::shared_ptr<PinnedStaging> PinnedStaging::create(gpu::DeviceApi& api, int device, void* stream,
                                                     size_t cache_bytes) {
  return std::shared_ptr<PinnedStaging>(new PinnedStaging(api, device, stream, cache_bytes));
}

namespace {

// Buffers the device may still copy from or into outlive their pool: they
// are kept here, reachable (not a leak a checker reports), until the process
// exits and its memory goes with it.
std::mutex g_graveyard_mu;
std::vector<std::shared_ptr<gpu::DevHostBuffer>>* g_graveyard = nullptr;

void keepForever(std::shared_ptr<gpu::DevHostBuffer> b) {
  std::lock_guard<std::mutex> lock(g_graveyard_mu);
  if (g_graveyard == nullptr) g_graveyard = new std::vector<std::shared_ptr<gpu::DevHostBuffer>>();
  g_graveyard->push_back(std::move(b));
}

}  // namespace

PinnedStaging::~PinnedStaging() {
  // Buffers the stream may still copy from or into are never freed under it.
  for (Parked& p : parked_) {
    if (p.passed->query().code() == Code::kInProgress) lost_.push_back(std::move(p.buf));
  }
  for (auto& b : lost_) keepForever(std::move(b));
}

size_t PinnedStaging::sizeClass(size_t bytes) {
  size_t c = kMinBuffer;
  while (c < bytes) c <<= 1;
  return c;
}

StatusOr<std::shared_ptr<char>> PinnedStaging::acquire(size_t bytes) {
  const size_t cls = sizeClass(bytes);
  std::shared_ptr<gpu::DevHostBuffer> buf;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sweepLocked();
    auto it = idle_.find(cls);
    if (it != idle_.end()) {
      buf = std::move(it->second);
      idle_.erase(it);
      idle_bytes_ -= cls;
    }
  }
  if (buf == nullptr) {
    RETURN_IF_ERROR(api_.setDevice(device_));
    auto b = api_.allocPinned(cls);
    if (!b.isOk()) {
      return b.status().withContext("pinned host memory of " + std::to_string(cls) +
                                    " bytes for staging a device tensor");
    }
    buf = std::shared_ptr<gpu::DevHostBuffer>(std::move(b).value());
  }
  char* p = static_cast<char*>(buf->data());
  auto self = shared_from_this();
  return std::shared_ptr<char>(p, [self, buf](char*) mutable { self->park(std::move(buf)); });
}

void PinnedStaging::park(std::shared_ptr<gpu::DevHostBuffer> b) {
  Parked p{std::move(b), nullptr};
  Status st = api_.setDevice(device_);
  if (st.isOk()) {
    auto ev = api_.createEvent(false);
    st = ev.isOk() ? (*ev)->record(stream_) : ev.status();
    if (st.isOk()) p.passed = std::move(ev).value();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!st.isOk()) {
    // Cannot tell when the device is done with it: never reused nor freed.
    log::get("agent.device")->warn("a staging buffer is not reused: {}", st.toString());
    lost_.push_back(std::move(p.buf));
    return;
  }
  parked_.push_back(std::move(p));
}

void PinnedStaging::sweepLocked() {
  while (!parked_.empty()) {
    Parked& p = parked_.front();
    Status q = p.passed->query();
    if (q.code() == Code::kInProgress) break;
    std::shared_ptr<gpu::DevHostBuffer> b = std::move(p.buf);
    parked_.pop_front();
    if (q.isOk()) {
      keepLocked(std::move(b));
    } else {  // the device failed: whether it is done with the buffer is unknown
      lost_.push_back(std::move(b));
    }
  }
}

void PinnedStaging::keepLocked(std::shared_ptr<gpu::DevHostBuffer> b) {
  const size_t n = b->size();
  if (idle_bytes_ + n > cache_bytes_) return;  // freed here: past the cache bound
  idle_bytes_ += n;
  idle_.emplace(n, std::move(b));
}

size_t PinnedStaging::idleBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  sweepLocked();
  return idle_bytes_;
}

size_t PinnedStaging::parkedCount() {
  std::lock_guard<std::mutex> lock(mu_);
  sweepLocked();
  return parked_.size();
}

}  // namespace kolo
