// The device runtime's two steps around a NCCL collective across agents
// (docs/gpu.md, "Device tensors across agents": the kNcclCross route of
// agent/ops/device_cross_nccl.cc). Loop thread; neither step waits for the
// device.
#pragma once

#include <memory>
#include <vector>

#include "agent/core/device_runtime.h"
#include "agent/gpu/device_api.h"

namespace kolo {

// Where the agents' NCCL collective runs: a device pointer in the op's GPU
// (slot 0, or the broadcast root's slot), ready once `ready` has passed.
struct NcclCrossBuffer {
  void* data = nullptr;
  std::shared_ptr<gpu::DevEvent> ready;
  // Allgather, reducescatter, alltoall (enqueueNcclLayoutInput): where the
  // call writes (`data` is what this agent sends), and the blocks by cross
  // rank (allgather, alltoall: bytes; reducescatter: elements; alltoall:
  // `blocks` sent, `recv_blocks` received).
  void* out = nullptr;
  std::vector<size_t> blocks, recv_blocks;
  // Alltoall's send and receive buffers (`data`, `out`): retired behind the
  // agent stream by enqueueNcclLayoutOutput (so the buffer is move-only).
  std::unique_ptr<gpu::DevArena> staging;
};

// The job's layout across agents, for the layout collectives: the world's
// ranks, this agent's cross rank, and each agent's first global rank and
// rank count (by cross rank; every agent's ranks are consecutive).
struct NcclCrossLayout {
  int world = 0;
  int cross_rank = 0;
  std::vector<int> rank_offsets, local_sizes;
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

// The same two steps for allgather, reducescatter and alltoall
// (op.collective, op.meta as on one agent; docs/gpu.md, "Device tensors
// across agents"). Allgather: every local rank's rows into local rank 0's
// output at their global offsets, the agents' allgatherv in place there,
// then rank 0's output copied into the other ranks' outputs.
// Reducescatter: the k inputs reduced (prescale) into local rank 0's input,
// the agents' reducescatter in place there (each agent gets its ranks'
// rows), then each rank's rows into its output (postscale). Alltoall: the
// local ranks' rows into a send buffer by destination agent, the agents'
// alltoallv into a receive buffer by source agent, then each rank's rows
// into its output in source rank order (device_nccl_layout.cc). An error:
// nothing enqueued for NCCL (out_ready as above).
StatusOr<NcclCrossBuffer> enqueueNcclLayoutInput(const DeviceLocalOp& op,
                                                 const NcclCrossLayout& layout);
Status enqueueNcclLayoutOutput(const DeviceLocalOp& op, const NcclCrossLayout& layout,
                               NcclCrossBuffer& buf, bool ok);

}  // namespace kolo
