// The device runtime's grants over the device seam (device_runtime.h,
// agent/gpu/device_api.h). Loop thread only, but for DeviceCtx::staging and
// what the staging thread reads of a grant its op holds (slots, events).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "agent/core/device_runtime.h"
#include "agent/core/device_staging.h"
#include "agent/gpu/device_api.h"

namespace kolo {

// What a dropped grant leaves behind until the agent stream has passed
// everything enqueued before the drop (no kernel may still read the arena
// when it is unmapped); freed by sweep(), never waited for on the loop.
struct RetiredGrant {
  std::unique_ptr<gpu::DevEvent> passed;
  std::unique_ptr<gpu::DevArena> arena;
  std::vector<std::unique_ptr<gpu::DevEvent>> events;
};

// One GPU's agent stream (every device op on that GPU runs on it, in order).
struct DeviceCtx {
  int device = 0;
  std::unique_ptr<gpu::DevStream> stream;
  std::shared_ptr<PinnedStaging> staging;  // thread-safe; parks behind `stream`
  std::deque<RetiredGrant> retired;
  // Device Tensor Fusion's buffer (device_fused.cc): grown on demand, the
  // old one retired behind the stream like a dropped grant's arena.
  std::unique_ptr<gpu::DevArena> fusion;
  void* s() const { return stream->get(); }
  // Frees the retired grants the stream has passed.
  void sweep();
};

class SeamGrant final : public DeviceGrant {
 public:
  ~SeamGrant() override;
  uint64_t bytes() const override { return arena_->size(); }
  uint32_t events() const override { return static_cast<uint32_t>(in_.size()); }
  int device() const override { return ctx_->device; }
  StatusOr<UniqueFd> exportFd() const override { return arena_->exportFd(); }
  const std::string& agentEvents() const override { return agent_events_; }
  StatusOr<std::string> addEvents(const std::string& client_events) override;

  void* slot(uint64_t offset) const { return static_cast<char*>(arena_->data()) + offset; }

  std::shared_ptr<DeviceCtx> ctx_;
  std::unique_ptr<gpu::DevArena> arena_;
  // Reserved for gpu::kMaxDeviceEventPairs at creation, so that adding
  // pairs on the loop never moves the ones the staging thread reads (by
  // index, operator[]: the index was validated on the loop).
  std::vector<std::unique_ptr<gpu::DevEvent>> in_;   // the client's, opened here
  std::vector<std::unique_ptr<gpu::DevEvent>> out_;  // ours, exported
  std::string agent_events_;
};

// The grant's arena and events on `ctx`'s GPU; `client_events`: the
// client's in_ready handles (64 bytes each).
StatusOr<std::shared_ptr<SeamGrant>> makeSeamGrant(gpu::DeviceApi& api,
                                                   std::shared_ptr<DeviceCtx> ctx, uint64_t bytes,
                                                   const std::string& client_events);

}  // namespace kolo
