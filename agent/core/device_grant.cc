#include "agent/core/device_grant.h"

#include <cstring>

#include "common/log.h"

namespace kolo {

void DeviceCtx::sweep() {
  while (!retired.empty() && retired.front().passed->query().code() != Code::kInProgress)
    retired.pop_front();
}

SeamGrant::~SeamGrant() {
  if (!ctx_ || !ctx_->stream) return;
  // Not a drain on the loop: the arena and events stay alive until the
  // agent stream passes a marker recorded now.
  RetiredGrant r;
  r.arena = std::move(arena_);
  for (auto& e : in_) r.events.push_back(std::move(e));
  for (auto& e : out_) r.events.push_back(std::move(e));
  auto marker = gpu::deviceApi()->createEvent(false);
  Status st = marker.isOk() ? (*marker)->record(ctx_->s()) : marker.status();
  if (!st.isOk()) {
    // Cannot order the unmap behind the stream: keep the memory until exit.
    log::get("agent.device")
        ->warn("dropping a device arena: {} (kept mapped until the agent exits)", st.message());
    static auto* leaked = new std::deque<RetiredGrant>;
    leaked->push_back(std::move(r));
    return;
  }
  r.passed = std::move(*marker);
  ctx_->retired.push_back(std::move(r));
  ctx_->sweep();
}

StatusOr<std::shared_ptr<SeamGrant>> makeSeamGrant(gpu::DeviceApi& api,
                                                   std::shared_ptr<DeviceCtx> ctx, uint64_t bytes,
                                                   const std::string& client_events) {
  ASSIGN_OR_RETURN(uint32_t nevents, gpu::countEventHandles(client_events.size()));
  ctx->sweep();
  auto g = std::make_shared<SeamGrant>();
  ASSIGN_OR_RETURN(g->arena_, api.createArena(ctx->device, bytes));
  g->ctx_ = std::move(ctx);
  g->in_.reserve(gpu::kMaxDeviceEventPairs);
  g->out_.reserve(gpu::kMaxDeviceEventPairs);
  (void)nevents;
  ASSIGN_OR_RETURN(g->agent_events_, g->addEvents(client_events));
  return g;
}

StatusOr<std::string> SeamGrant::addEvents(const std::string& client_events) {
  gpu::DeviceApi& api = *gpu::deviceApi();
  ASSIGN_OR_RETURN(uint32_t n,
                   gpu::countEventHandles(client_events.size(), gpu::kMaxDeviceEventPairs));
  if (in_.size() + n > gpu::kMaxDeviceEventPairs) {
    return unavailable("this trainer would have " + std::to_string(in_.size() + n) +
                       " device event pairs; at most " + std::to_string(gpu::kMaxDeviceEventPairs) +
                       " are granted");
  }
  RETURN_IF_ERROR(api.setDevice(ctx_->device));
  std::vector<std::unique_ptr<gpu::DevEvent>> ins, outs;
  std::string handles;
  for (uint32_t i = 0; i < n; ++i) {
    gpu::IpcEventBytes h;
    std::memcpy(h.data(), client_events.data() + i * h.size(), h.size());
    ASSIGN_OR_RETURN(auto in, api.openEvent(h));
    ins.push_back(std::move(in));
    ASSIGN_OR_RETURN(auto out, api.createEvent(true));
    ASSIGN_OR_RETURN(gpu::IpcEventBytes oh, out->exportHandle());
    handles.append(reinterpret_cast<const char*>(oh.data()), oh.size());
    outs.push_back(std::move(out));
  }
  // All or nothing, so the indices stay the client's.
  for (uint32_t i = 0; i < n; ++i) {
    in_.push_back(std::move(ins[i]));
    out_.push_back(std::move(outs[i]));
  }
  return handles;
}

}  // namespace kolo
