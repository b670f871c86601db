// Where an op's tensors live, as a strategy chosen once per op
// (memoryOf) by Agent::executeOnLoop and given the op's collective type:
//
//   hostMemory()    the ranks' slots in their shared-memory arenas (or, on
//                   the direct path, their own memory, which the collective
//                   type decides per rank): the collective's op type runs it
//                   (agent/ops/<collective>.cc); an op that failed before it
//                   ran is announced here (agent/ops/host_memory.cc)
//   deviceMemory()  device tensors (docs/gpu.md): the reduction kernel over
//                   the ranks' device slots on one GPU; across agents over
//                   NCCL or staged through host memory (agent/ops/device_memory.cc)
//
// Loop thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "agent/core/job.h"
#include "agent/core/tensor_table.h"

namespace kolo {

class CollectiveOp;
class OpHost;

class OpMemory {
 public:
  virtual ~OpMemory() = default;
  virtual const char* name() const = 0;
  // Runs the node-ready op (`handles` by local rank). `kind` is the op type
  // of its collective, null when the agent has none (the op fails).
  virtual void runOnLoop(OpHost& host, Job& job, const CollectiveOp* kind, ReadyOp op,
                         std::vector<uint64_t> handles) const = 0;
};

const OpMemory& hostMemory();
const OpMemory& deviceMemory();

// The op's memory kind: device when any rank submitted a device tensor.
const OpMemory& memoryOf(const ReadyOp& op);

}  // namespace kolo
