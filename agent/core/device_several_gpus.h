// Device ops over ranks on several GPUs of one agent (docs/gpu.md, "Several
// GPUs per node"): each GPU's ranks reduced on that GPU's agent stream into
// the group's first slot; then across the GPUs, by the leader GPU's kernel
// reading the other groups' results (kPeerKernel: events between the
// streams, the result copied back GPU to GPU) or over the node-local NCCL
// communicator (kNodeNccl); then every slot gets the result and every
// rank's out_ready is recorded on its GPU's stream. Allreduce and broadcast.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "agent/backends/nccl/node_comm.h"
#include "agent/core/device_runtime.h"
#include "agent/gpu/device_api.h"
#include "agent/gpu/gpu_groups.h"

namespace kolo {

class SeveralGpus {
 public:
  // Enqueues only (no host wait, but the NCCL calls' own settling). One op
  // at a time (a mutex): the link events are shared. `comm`: the plan's
  // communicator with kNodeNccl (its devices the groups' GPUs in order).
  Status enqueue(gpu::DeviceApi& api, const DeviceLocalOp& op, const gpu::GpuGroupPlan& plan,
                 nccl::NodeComm* comm);

 private:
  struct Group;
  StatusOr<gpu::DevEvent*> link(gpu::DeviceApi& api, int gpu);
  Status leaderWaitsForCopies(gpu::DeviceApi& api, std::vector<Group>& groups, int source);
  Status reduce(gpu::DeviceApi& api, const DeviceLocalOp& op, const gpu::GpuGroupPlan& plan,
                std::vector<Group>& groups, nccl::NodeComm* comm);
  Status broadcast(gpu::DeviceApi& api, const DeviceLocalOp& op, const gpu::GpuGroupPlan& plan,
                   std::vector<Group>& groups, nccl::NodeComm* comm);

  std::mutex mu_;
  // One event per GPU, recorded on its agent stream and waited for by
  // another GPU's (a wait takes the latest record when enqueued).
  std::map<int, std::unique_ptr<gpu::DevEvent>> links_;
};

}  // namespace kolo
