// Device tensors across agents over the job generation's NCCL communicator
// (docs/gpu.md, "Device tensors across agents": gpu::DeviceRoute::kNcclCross).
// Loop thread only.
#pragma once

#include <memory>
#include <vector>

#include "agent/core/device_runtime.h"
#include "agent/core/job.h"
#include "agent/core/tensor_table.h"

namespace kolo {

class OpHost;

// Allreduce or broadcast of `op` (its local step described by `dop`, the
// grants held by `hold`): the local kernel reduce into slot 0 on the agent
// stream, the collective handed to the job's negotiation thread, which posts
// it on the NCCL backend in the agreed order (the backend's stream waits for
// the local step's event), then the result from slot 0 into every rank's
// slot and every out_ready, and the completions. An op that cannot start is
// announced as failed to the other agents on the host path. Allgather and
// reducescatter (dop.collective, the per-agent layout from the job's world):
// the layout steps of device_nccl_steps.h around the agents' allgatherv /
// reducescatter.
void runNcclCrossOnLoop(OpHost& host, Job& job, ReadyOp op, const DeviceLocalOp& dop,
                        std::vector<std::shared_ptr<DeviceGrant>> hold,
                        std::vector<uint64_t> handles);

}  // namespace kolo
