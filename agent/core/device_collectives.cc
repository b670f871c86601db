#include "agent/core/device_collectives.h"

#include "agent/gpu/collective_plan.h"

namespace kolo {

namespace {

std::vector<gpu::RankSlots> rankSlots(const std::vector<void*>& ins,
                                      const std::vector<void*>& outs) {
  std::vector<gpu::RankSlots> s(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) {
    s[i].in = reinterpret_cast<uintptr_t>(ins[i]);
    s[i].out = reinterpret_cast<uintptr_t>(outs[i]);
  }
  return s;
}

StatusOr<DeviceCollectiveWork> copyAll(gpu::DeviceApi& api,
                                       const std::vector<gpu::CopySegment>& segs, void* stream) {
  DeviceCollectiveWork w;
  for (const gpu::CopySegment& c : segs) {
    RETURN_IF_ERROR(api.copyAsync(c.dst, c.src, c.bytes, stream));
    ++w.copies;
  }
  return w;
}

}  // namespace

StatusOr<DeviceCollectiveWork> enqueueDeviceCollective(gpu::DeviceApi& api, const DeviceLocalOp& op,
                                                       const std::vector<void*>& ins,
                                                       const std::vector<void*>& outs,
                                                       void* stream) {
  if (ins.size() != outs.size() || ins.empty()) return internalError("device op without ranks");
  const std::vector<gpu::RankSlots> slots = rankSlots(ins, outs);
  switch (op.collective) {
    case CollectiveType::kAllgather: {
      ASSIGN_OR_RETURN(auto segs, gpu::planAllgatherCopies(slots, op.meta, op.row_bytes, op.name));
      return copyAll(api, segs, stream);
    }
    case CollectiveType::kAlltoall: {
      std::vector<int64_t> dims(slots.size(), 0);
      const size_t k = slots.size();
      if (op.meta.size() != k * k) {
        return internalError("alltoall of device tensor '" + op.name + "': a split matrix of " +
                             std::to_string(op.meta.size()) + " entries for " + std::to_string(k) +
                             " ranks");
      }
      for (size_t s = 0; s < k; ++s) {
        for (size_t d = 0; d < k; ++d) dims[s] += op.meta[s * k + d];
      }
      ASSIGN_OR_RETURN(auto p,
                       gpu::planAlltoallCopies(slots, op.meta, dims, op.row_bytes, op.name));
      return copyAll(api, p.copies, stream);
    }
    case CollectiveType::kReducescatter: {
      const size_t es = dataTypeSize(op.dtype);
      const uint64_t row_elems = es > 0 ? op.row_bytes / es : 0;
      ASSIGN_OR_RETURN(auto blocks, gpu::planReducescatter(slots, op.dim0, row_elems, es, op.name));
      DeviceCollectiveWork w;
      for (const gpu::ReduceBlock& b : blocks) {
        std::vector<const void*> srcs;
        for (uintptr_t p : b.srcs) srcs.push_back(reinterpret_cast<const void*>(p));
        void* dst = reinterpret_cast<void*>(b.dst);
        RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, srcs.data(),
                                         static_cast<int>(srcs.size()), &dst, 1, b.count,
                                         op.prescale, op.postscale, stream));
        ++w.launches;
      }
      return w;
    }
    default:
      return internalError("device op: " + std::string(collectiveName(op.collective)) +
                           " has no device plan");
  }
}

}  // namespace kolo
