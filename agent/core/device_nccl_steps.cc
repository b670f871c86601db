// device_nccl_steps.h over the device seam (CUDA or the host emulation).
#include "agent/core/device_nccl_steps.h"

#include <algorithm>

#include "agent/core/device_grant.h"

namespace kolo {

namespace {

SeamGrant* seam(DeviceGrant* g) { return static_cast<SeamGrant*>(g); }

Status checkOp(const DeviceLocalOp& op) {
  const size_t k = op.grants.size();
  if (gpu::deviceApi() == nullptr)
    return unavailable("this kolo-agent has no device implementation");
  if (k == 0 || op.offsets.size() != k || op.events.size() != k)
    return internalError("device op without ranks");
  if (k > static_cast<size_t>(gpu::kMaxDeviceSources)) {
    return invalidArgument("device tensors of " + std::to_string(k) +
                           " ranks on one GPU: at most " + std::to_string(gpu::kMaxDeviceSources) +
                           " are wired");
  }
  for (DeviceGrant* g : op.grants) {
    if (seam(g)->ctx_ != seam(op.grants[0])->ctx_) return internalError("device op over two GPUs");
  }
  return okStatus();
}

std::vector<void*> slotsOf(const DeviceLocalOp& op) {
  std::vector<void*> slots;
  for (size_t i = 0; i < op.grants.size(); ++i)
    slots.push_back(seam(op.grants[i])->slot(op.offsets[i]));
  return slots;
}

}  // namespace

StatusOr<NcclCrossBuffer> enqueueNcclCrossInput(const DeviceLocalOp& op) {
  RETURN_IF_ERROR(checkOp(op));
  gpu::DeviceApi& api = *gpu::deviceApi();
  DeviceCtx& ctx = *seam(op.grants[0])->ctx_;
  RETURN_IF_ERROR(api.setDevice(ctx.device));
  ctx.sweep();
  for (size_t i = 0; i < op.grants.size(); ++i)
    RETURN_IF_ERROR(seam(op.grants[i])->in_.at(op.events[i])->streamWait(ctx.s()));
  std::vector<void*> slots = slotsOf(op);
  NcclCrossBuffer out;
  out.data = slots[0];
  if (op.broadcast) {
    if (op.broadcast_root >= 0 && op.broadcast_root < static_cast<int>(slots.size()))
      out.data = slots[op.broadcast_root];
  } else if (op.count > 0) {
    RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, slots.data(), static_cast<int>(slots.size()),
                                     slots.data(), 1, op.count, op.prescale, 1.0, ctx.s()));
  }
  ASSIGN_OR_RETURN(auto ev, api.createEvent(false));
  RETURN_IF_ERROR(ev->record(ctx.s()));
  out.ready = std::shared_ptr<gpu::DevEvent>(std::move(ev));
  return out;
}

Status enqueueNcclCrossOutput(const DeviceLocalOp& op, const NcclCrossBuffer& buf, bool ok) {
  RETURN_IF_ERROR(checkOp(op));
  gpu::DeviceApi& api = *gpu::deviceApi();
  DeviceCtx& ctx = *seam(op.grants[0])->ctx_;
  RETURN_IF_ERROR(api.setDevice(ctx.device));
  std::vector<void*> slots = slotsOf(op);
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  Status st;
  if (ok && bytes > 0 && buf.data != nullptr) {
    if (op.broadcast) {
      for (size_t i = 0; i < slots.size() && st.isOk(); ++i) {
        if (slots[i] != buf.data) st = api.copyAsync(slots[i], buf.data, bytes, ctx.s());
      }
    } else {
      // One source through the kernel: the postscale, into up to 8 slots at
      // once (buf.data is slot 0), the rest copied from slot 0.
      const size_t nd = std::min<size_t>(slots.size(), gpu::kMaxDeviceOutputs);
      const void* src = buf.data;
      st = api.launchReduce(op.dtype, op.op, &src, 1, slots.data(), static_cast<int>(nd), op.count,
                            1.0, op.postscale, ctx.s());
      for (size_t i = nd; i < slots.size() && st.isOk(); ++i)
        st = api.copyAsync(slots[i], slots[0], bytes, ctx.s());
    }
  }
  Status rec;
  for (size_t i = 0; i < op.grants.size(); ++i) {
    Status r = seam(op.grants[i])->out_.at(op.events[i])->record(ctx.s());
    if (!r.isOk() && rec.isOk()) rec = r;
  }
  return st.isOk() ? rec : st;
}

}  // namespace kolo
