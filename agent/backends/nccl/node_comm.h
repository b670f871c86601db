// A node-local NCCL communicator owned by the agent (docs/gpu.md, "Several
// GPUs per node"): one NCCL rank per GPU, all in this process (created as
// ncclCommInitAll does: one unique id, every rank's init inside one
// ncclGroupStart/End, each with its GPU current). Over libnccl, or the NCCL
// emulation with the host-emulated device (nccl_api.h). Its collectives
// take one buffer and one stream per rank and are issued as one group, one
// collective at a time (a mutex), so every rank sees them in one order.
// No header of NCCL's: the agent's code compiles without NCCL.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kolo::nccl {

class NodeComm {
 public:
  virtual ~NodeComm() = default;  // ncclCommAbort of every rank (never hangs)
  virtual const std::vector<int>& devices() const = 0;
  // bufs[i], streams[i]: rank i's (on devices()[i]); in place.
  virtual Status allreduce(const std::vector<void*>& bufs, const std::vector<void*>& streams,
                           size_t count, DataType dtype, ReduceOp op) = 0;
  virtual Status broadcast(const std::vector<void*>& bufs, const std::vector<void*>& streams,
                           size_t bytes, int root) = 0;
  // Ok, or the first rank's asynchronous error (ncclCommGetAsyncError).
  virtual Status asyncError() = 0;
};

// False in builds without NCCL (node_comm_unavailable.cc).
bool nodeCommBuilt();
// Blocking (never on the agent's loop), bounded by `timeout`: NCCL's
// initialisation of every rank.
StatusOr<std::unique_ptr<NodeComm>> createNodeComm(const std::vector<int>& devices,
                                                   std::chrono::milliseconds timeout);

}  // namespace kolo::nccl
