// Allgather, reducescatter and alltoall of device tensors of the ranks
// sharing one GPU on one agent (docs/gpu.md, "Allgather, reducescatter,
// alltoall on the device"): the plans of agent/gpu/collective_plan.h,
// enqueued on the agent stream as device copies (allgather, alltoall) and
// reduction launches (reducescatter, one per rank's block, with the
// prescale and postscale), behind the ranks' in_ready waits the caller
// enqueued. Over the device seam only (agent/gpu/device_api.h), so the host
// emulation runs the same code. Any thread that owns the stream.
#pragma once

#include <vector>

#include "agent/core/device_runtime.h"
#include "agent/gpu/device_api.h"
#include "common/status.h"

namespace kolo {

// The copy and launch counts of one enqueued op (tests, timeline).
struct DeviceCollectiveWork {
  size_t copies = 0;
  size_t launches = 0;
};

// `ins[i]` / `outs[i]`: local rank i's input and output region (the agent's
// mapping; outs after the header room). Nothing is enqueued when the plan
// refuses the op (its error names the tensor).
StatusOr<DeviceCollectiveWork> enqueueDeviceCollective(gpu::DeviceApi& api, const DeviceLocalOp& op,
                                                       const std::vector<void*>& ins,
                                                       const std::vector<void*>& outs,
                                                       void* stream);

}  // namespace kolo
