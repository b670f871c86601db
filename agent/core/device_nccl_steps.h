// The device runtime's two steps around a NCCL collective across agents
// (docs/gpu.md, "Device tensors across agents": the kNcclCross route of
// agent/ops/device_cross_nccl.cc). Loop thread; neither step waits for the
// device.
#pragma once

#include <memory>

#include "agent/core/device_runtime.h"
#include "agent/gpu/device_api.h"

namespace kolo {

// Where the agents' NCCL collective runs: a device pointer in the op's GPU
// (slot 0, or the broadcast root's slot), ready once `ready` has passed.
struct NcclCrossBuffer {
  void* data = nullptr;
  std::shared_ptr<gpu::DevEvent> ready;
};

// Enqueues on the op's agent stream: every rank's in_ready wait; for an
// allreduce the reduction of the k slots into slot 0 with the prescale (the
// postscale comes after the agents' reduction); for a broadcast nothing
// (the root's slot is sent as it is, the others receive into slot 0); then
// records `ready`. An error: nothing for NCCL to run on (out_ready is
// recorded by enqueueNcclCrossOutput(op, {}, false)).
StatusOr<NcclCrossBuffer> enqueueNcclCrossInput(const DeviceLocalOp& op);

// Once the NCCL collective has completed (`ok`) or failed: with `ok`, the
// result in `buf` into every rank's slot (allreduce: with the postscale,
// through the reduction kernel over one source; broadcast: copies); in
// every case every rank's out_ready, recorded after it on the agent stream.
Status enqueueNcclCrossOutput(const DeviceLocalOp& op, const NcclCrossBuffer& buf, bool ok);

}  // namespace kolo
