// Several GPUs per node (docs/gpu.md, "Several GPUs per node"): how one
// device op's local ranks are grouped by the GPU of their device arena,
// and how the groups' results are combined across the node's GPUs. Pure
// logic, built in every configuration and unit-tested everywhere
// (tests/gpu/gpu_groups_test.cc).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace kolo::gpu {

struct GpuGroup {
  int gpu = -1;            // the agent's ordinal
  std::vector<int> ranks;  // local ranks on it, ascending; ranks[0]'s slot holds the group's result
};

enum class NodeRoute {
  kOneGpu,      // one group: the reduction kernel over its slots (as before)
  kPeerKernel,  // every pair peer-accessible: the leader GPU's kernel reads the groups' results
  kNodeNccl,    // otherwise: a node-local NCCL communicator, one rank per GPU
};
const char* nodeRouteName(NodeRoute r);

struct GpuGroupPlan {
  NodeRoute route = NodeRoute::kOneGpu;
  std::vector<GpuGroup> groups;  // by ascending ordinal; groups[0] is the leader GPU's
  int leader() const { return groups.empty() ? -1 : groups[0].gpu; }
  // The group (index into `groups`) of local rank `r`, -1 if none.
  int groupOf(int r) const;
};

// `gpu[i]`: local rank i's GPU ordinal (>= 0). `can_access(a, b)`: GPU a's
// kernels can read GPU b's memory (asked for every ordered pair of the
// op's GPUs, a != b). `nccl_built`: this agent has a NCCL (or its
// emulation) for kNodeNccl. `max_gpus`: the leader kernel's sources.
// InvalidArgument (the op's refusal, naming `name`) for: no ranks, an
// unknown GPU, more GPUs than `max_gpus`, GPUs without peer access in a
// build without NCCL.
StatusOr<GpuGroupPlan> planGpuGroups(const std::string& name, const std::vector<int>& gpu,
                                     const std::function<bool(int, int)>& can_access,
                                     bool nccl_built, int max_gpus);

}  // namespace kolo::gpu
