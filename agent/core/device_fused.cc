// Device Tensor Fusion on the agent stream (device_runtime.h enqueueFused,
// docs/gpu.md "Device Tensor Fusion"): the ready allreduces of a cycle
// packed with the batched copy into a fusion buffer in device memory,
// reduced by one launch, unpacked. Loop thread only.
#include "agent/core/device_fused.h"

#include <algorithm>
#include <string>

#include "agent/gpu/device_api.h"
#include "common/log.h"

namespace kolo {

namespace {

constexpr uint64_t kFusionGranularity = 2ull << 20;  // as the arenas

SeamGrant* seam(DeviceGrant* g) { return static_cast<SeamGrant*>(g); }

// A fusion buffer of at least `bytes` on ctx's GPU: the one it has, or a new
// one (the old one parked until the stream has passed what may still read it).
StatusOr<char*> fusionBuffer(gpu::DeviceApi& api, DeviceCtx& ctx, uint64_t bytes) {
  if (ctx.fusion && ctx.fusion->size() >= bytes) return static_cast<char*>(ctx.fusion->data());
  if (ctx.fusion) {
    RetiredGrant r;
    ASSIGN_OR_RETURN(r.passed, api.createEvent(false));
    RETURN_IF_ERROR(r.passed->record(ctx.s()));
    r.arena = std::move(ctx.fusion);
    ctx.retired.push_back(std::move(r));
  }
  const uint64_t n = (bytes + kFusionGranularity - 1) / kFusionGranularity * kFusionGranularity;
  ASSIGN_OR_RETURN(ctx.fusion, api.createArena(ctx.device, n));
  log::get("agent.device")
      ->info("device fusion: a fusion buffer of {} bytes on {} device {}", ctx.fusion->size(),
             api.name(), ctx.device);
  return static_cast<char*>(ctx.fusion->data());
}

Status checkFusable(const std::vector<DeviceLocalOp>& ops, const std::vector<uint64_t>& offsets,
                    uint64_t buffer_bytes) {
  if (ops.size() < 2 || offsets.size() != ops.size())
    return internalError("device fusion of fewer than two ops");
  const DeviceLocalOp& a = ops[0];
  const size_t k = a.grants.size();
  if (k == 0 || k > static_cast<size_t>(gpu::kMaxDeviceSources))
    return internalError("device fusion over " + std::to_string(k) + " ranks");
  for (size_t j = 0; j < ops.size(); ++j) {
    const DeviceLocalOp& o = ops[j];
    if (o.broadcast || o.collective != CollectiveType::kAllreduce || o.dtype != a.dtype ||
        o.op != a.op || o.prescale != a.prescale || o.postscale != a.postscale ||
        o.grants != a.grants || o.offsets.size() != k || o.events.size() != k) {
      return internalError("device fusion of unlike ops ('" + a.name + "' and '" + o.name + "')");
    }
    if (offsets[j] + o.count * dataTypeSize(o.dtype) > buffer_bytes)
      return internalError("device fusion: '" + o.name + "' runs past the fusion buffer");
  }
  if (buffer_bytes % dataTypeSize(a.dtype) != 0)
    return internalError("device fusion buffer not a whole number of elements");
  return okStatus();
}

// Every rank's out_ready of every op on `s` (after anything was enqueued).
Status recordAll(const std::vector<DeviceLocalOp>& ops, void* s) {
  Status first;
  for (const DeviceLocalOp& o : ops) {
    for (size_t i = 0; i < o.grants.size(); ++i) {
      Status st = seam(o.grants[i])->out_[o.events[i]]->record(s);
      if (!st.isOk() && first.isOk()) first = st;
    }
  }
  return first;
}

// The waits, the pack, the one reduction and the unpack.
Status enqueueSteps(gpu::DeviceApi& api, DeviceCtx& ctx, const std::vector<DeviceLocalOp>& ops,
                    const std::vector<uint64_t>& offsets, uint64_t buffer_bytes,
                    DeviceFusedLaunches* n) {
  const DeviceLocalOp& a = ops[0];
  const size_t k = a.grants.size();
  void* s = ctx.s();
  for (const DeviceLocalOp& o : ops) {
    for (size_t i = 0; i < k; ++i) {
      SeamGrant* g = seam(o.grants[i]);
      if (g->ctx_.get() != &ctx) return internalError("device fusion over two GPUs");
      RETURN_IF_ERROR(g->in_[o.events[i]]->streamWait(s));
    }
  }
  ASSIGN_OR_RETURN(char* buf, fusionBuffer(api, ctx, buffer_bytes * k));
  std::vector<gpu::CopySegment> pack, unpack;
  pack.reserve(ops.size() * k);
  unpack.reserve(ops.size() * k);
  for (size_t j = 0; j < ops.size(); ++j) {
    const DeviceLocalOp& o = ops[j];
    const size_t bytes = o.count * dataTypeSize(o.dtype);
    for (size_t i = 0; i < k; ++i) {
      void* slot = seam(o.grants[i])->slot(o.offsets[i]);
      pack.push_back({slot, buf + i * buffer_bytes + offsets[j], bytes});
      unpack.push_back({buf + offsets[j], slot, bytes});
    }
  }
  ASSIGN_OR_RETURN(int packed, api.batchedCopy(pack.data(), pack.size(), s));
  n->batched_copy += static_cast<uint64_t>(packed);
  std::vector<const void*> srcs;
  for (size_t i = 0; i < k; ++i) srcs.push_back(buf + i * buffer_bytes);
  void* dst = buf;
  RETURN_IF_ERROR(api.launchReduce(a.dtype, a.op, srcs.data(), static_cast<int>(k), &dst, 1,
                                   buffer_bytes / dataTypeSize(a.dtype), a.prescale, a.postscale,
                                   s));
  n->reduce += 1;
  ASSIGN_OR_RETURN(int unpacked, api.batchedCopy(unpack.data(), unpack.size(), s));
  n->batched_copy += static_cast<uint64_t>(unpacked);
  return okStatus();
}

}  // namespace

StatusOr<DeviceFusedLaunches> enqueueFusedOnCtx(gpu::DeviceApi& api, DeviceCtx& ctx,
                                                const std::vector<DeviceLocalOp>& ops,
                                                const std::vector<uint64_t>& offsets,
                                                uint64_t buffer_bytes) {
  RETURN_IF_ERROR(checkFusable(ops, offsets, buffer_bytes));
  RETURN_IF_ERROR(api.setDevice(ctx.device));
  ctx.sweep();
  DeviceFusedLaunches n;
  Status st = enqueueSteps(api, ctx, ops, offsets, buffer_bytes, &n);
  // Some waits or copies may be enqueued: out_ready still goes after them.
  Status rec = recordAll(ops, ctx.s());
  if (!st.isOk()) return st;
  if (!rec.isOk()) return rec;
  return n;
}

}  // namespace kolo
