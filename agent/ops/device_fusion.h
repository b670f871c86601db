// Device Tensor Fusion on one agent (docs/gpu.md, "Device Tensor Fusion"):
// the device allreduces that become ready in one pass of the agent's loop
// (a grouped allreduce's members come out together; so do the ops whose
// last rank's submissions the loop drained in one batch) are queued, and a
// flush posted behind them plans them with the host path's fusion planner
// (agent/fusion/fusion_planner.h: same dtype, op, scale factors and GPU;
// the job's fusion threshold, --fusion-threshold-mb or the trainers'
// KOLO_FUSION_THRESHOLD_MB / HOROVOD_FUSION_THRESHOLD; 64-byte offsets).
// A group of several runs as one fused cycle (DeviceRuntime::enqueueFused),
// a group of one on the op's own kernel as before. Loop thread only.
#pragma once

#include <memory>
#include <vector>

#include "agent/core/device_runtime.h"
#include "agent/core/job.h"
#include "agent/core/tensor_table.h"
#include "agent/ops/op.h"

namespace kolo {

struct DeviceFusionItem {
  ReadyOp op;
  DeviceLocalOp dop;
  std::vector<std::shared_ptr<DeviceGrant>> hold;  // the grants stay while queued
  std::vector<uint64_t> handles;
};

// Queues a ready device allreduce of the local-kernel route; the first of
// a pass posts the flush.
void queueDeviceFusionOnLoop(OpHost& host, Job& job, DeviceFusionItem item);

// One op alone: the local kernel (or copies), its timeline, its completion.
void runDeviceLocalOnLoop(OpHost& host, Job& job, const ReadyOp& op, const DeviceLocalOp& dop,
                          const std::vector<uint64_t>& handles);

}  // namespace kolo
