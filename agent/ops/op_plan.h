// The plan of one host op, computed once when its name is node-ready
// (HostMemory::runOnLoop) by a pure function of the descriptors the local
// ranks submitted and the job's world, and read by the op type and the
// cross leg instead of deciding inline:
//
//   placement  one agent, or several (the agents' collective follows the local step)
//   memory     the ranks' shared-memory slots, or (direct) a rank's own memory
//   path       what moves the data: nothing, the local executor, the ranks
//              themselves (split), the backend on the one rank's slot (in
//              place), through a staging buffer (staged), chunk by chunk
//              (pipelined)
//   modes      streamed copy-in, joined ranks (zeros / zero rows), out of place
//   reduction  the reduce op and scales: Average is Sum with the postscale
//              divided by the world size (the one place that says so)
//   blocks     allgather and reducescatter: each global rank's offset in the
//              whole tensor; alltoall: the agreed split matrix
//
// A plan that finds the ranks disagree (different first dimensions or
// split matrices) carries the error; the op fails with it (across agents
// after telling the other agents). Device tensors are planned by the
// device path (docs/gpu.md) before any op type sees them. Pure: no job, no
// clock, no I/O; tests/agent/op_plan_test.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "agent/core/tensor_table.h"
#include "agent/ops/cross_plan.h"
#include "common/dtype.h"
#include "common/status.h"

namespace kolo {

// What the plan reads of the job.
struct OpWorld {
  int world_size = 1;
  int local_size = 1;
  int cross_size = 1;
  int rank_offset = 0;            // this agent's first global rank
  std::vector<int> rank_offsets;  // first global rank of each agent, by cross rank
  std::vector<int> local_sizes;   // ranks on each agent, by cross rank
  uint64_t pipeline_bytes = 0;    // --cross-pipeline-kb (0: never pipelined)
};

enum class OpPlacement : uint8_t { kOneAgent, kAcrossAgents };
enum class OpMemoryKind : uint8_t { kShared, kDirect };
enum class OpPath : uint8_t { kNothing, kLocal, kSplit, kInPlace, kStaged, kPipelined };

const char* opPlacementName(OpPlacement p);
const char* opMemoryName(OpMemoryKind m);
const char* opPathName(OpPath p);

struct OpPlan {
  CollectiveType collective = CollectiveType::kAllreduce;
  OpPlacement placement = OpPlacement::kOneAgent;
  OpMemoryKind memory = OpMemoryKind::kShared;
  OpPath path = OpPath::kLocal;
  bool streamed = false;      // a rank's input is still being copied in (kSubmitFlagStreamed)
  bool joined = false;        // some local ranks have joined (ReadyOp::absent)
  bool zero_source = false;   // joined under Min, Max or Product: one zero source stands for them
  bool out_of_place = false;  // a rank's result goes to its output slot
  // The reduction (allreduce, reducescatter): elements and scaling of the whole tensor.
  ReduceOp reduce = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  uint64_t count = 0;  // elements (allreduce, reducescatter) or bytes (broadcast)
  // Across agents, allreduce and broadcast: the leg (cross_plan.h).
  CrossLegPlan leg;
  // Allgather: byte offset of each global rank's rows in the gathered
  // tensor; reducescatter: element offset of each global rank's block
  // (world_size + 1 entries). Empty otherwise.
  std::vector<uint64_t> offsets;
  // Alltoall: the agreed split matrix (world x world; zeros on an error).
  std::vector<int64_t> splits;
  Status error;  // the op's own (ReadyOp::error), or the ranks' disagreement found here

  // The first and one-past-last offset of agent `a`'s ranks (allgather,
  // reducescatter).
  uint64_t agentBlock(const OpWorld& w, int a) const {
    return offsets[w.rank_offsets[a] + w.local_sizes[a]] - offsets[w.rank_offsets[a]];
  }
};

OpPlan planOp(const ReadyOp& op, const OpWorld& world);

}  // namespace kolo
