// Device ops over ranks on several GPUs of one agent (docs/gpu.md, "Several
// GPUs per node"): the grouping plan (gpu/gpu_groups.h) from the ranks'
// GPUs and the peer access between them, then the peer kernel on the loop
// or the node-local NCCL communicator on the staging thread
// (core/device_several_gpus.h), then the completions.
#pragma once

#include <memory>
#include <vector>

#include "agent/core/device_runtime.h"
#include "agent/ops/op.h"

namespace kolo {

void runSeveralGpusOnLoop(OpHost& host, Job& job, ReadyOp op, DeviceLocalOp dop,
                          std::vector<std::shared_ptr<DeviceGrant>> hold,
                          std::vector<uint64_t> handles);

}  // namespace kolo
