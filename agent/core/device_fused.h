// Device Tensor Fusion's enqueue on one GPU's agent stream (device_fused.cc;
// DeviceRuntime::enqueueFused in device_runtime.h says what it does).
#pragma once

#include <cstdint>
#include <vector>

#include "agent/core/device_grant.h"
#include "agent/core/device_runtime.h"

namespace kolo {

// `ops` over the same grants of `ctx`'s GPU; the launches it enqueued.
StatusOr<DeviceFusedLaunches> enqueueFusedOnCtx(gpu::DeviceApi& api, DeviceCtx& ctx,
                                                const std::vector<DeviceLocalOp>& ops,
                                                const std::vector<uint64_t>& offsets,
                                                uint64_t buffer_bytes);

}  // namespace kolo
