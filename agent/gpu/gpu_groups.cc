#include "agent/gpu/gpu_groups.h"

#include <map>

namespace kolo::gpu {

const char* nodeRouteName(NodeRoute r) {
  switch (r) {
    case NodeRoute::kOneGpu:
      return "one GPU";
    case NodeRoute::kPeerKernel:
      return "peer kernel";
    case NodeRoute::kNodeNccl:
      return "node-local NCCL";
  }
  return "?";
}

int GpuGroupPlan::groupOf(int r) const {
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int x : groups[g].ranks) {
      if (x == r) return static_cast<int>(g);
    }
  }
  return -1;
}

StatusOr<GpuGroupPlan> planGpuGroups(const std::string& name, const std::vector<int>& gpu,
                                     const std::function<bool(int, int)>& can_access,
                                     bool nccl_built, int max_gpus) {
  const std::string what = "tensor '" + name + "'";
  if (gpu.empty()) return invalidArgument(what + ": a device op without local ranks");
  std::map<int, std::vector<int>> by_gpu;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] < 0) {
      return invalidArgument(what + ": local rank " + std::to_string(i) +
                             "'s GPU is not known to the agent");
    }
    by_gpu[gpu[i]].push_back(static_cast<int>(i));
  }
  GpuGroupPlan plan;
  for (auto& [g, ranks] : by_gpu) plan.groups.push_back(GpuGroup{g, std::move(ranks)});
  if (plan.groups.size() == 1) return plan;
  if (static_cast<int>(plan.groups.size()) > max_gpus) {
    return invalidArgument(what + ": local ranks on " + std::to_string(plan.groups.size()) +
                           " GPUs; at most " + std::to_string(max_gpus) + " are wired");
  }
  bool all_peer = true;
  std::string missing;
  for (const GpuGroup& a : plan.groups) {
    for (const GpuGroup& b : plan.groups) {
      if (a.gpu == b.gpu || can_access(a.gpu, b.gpu)) continue;
      all_peer = false;
      if (missing.empty())
        missing = "GPU " + std::to_string(a.gpu) + " cannot access GPU " + std::to_string(b.gpu);
    }
  }
  if (all_peer) {
    plan.route = NodeRoute::kPeerKernel;
    return plan;
  }
  if (!nccl_built) {
    return invalidArgument(what + ": local ranks on GPUs without peer access (" + missing +
                           ") need the node-local NCCL communicator, and this kolo-agent was "
                           "built without NCCL");
  }
  plan.route = NodeRoute::kNodeNccl;
  return plan;
}

}  // namespace kolo::gpu
