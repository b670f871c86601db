// Builds without NCCL: no node-local communicator (node_comm.h).
#include "agent/backends/nccl/node_comm.h"

namespace kolo::nccl {

bool nodeCommBuilt() { return false; }

StatusOr<std::unique_ptr<NodeComm>> createNodeComm(const std::vector<int>&,
                                                   std::chrono::milliseconds) {
  return unavailable("this kolo-agent was built without NCCL: no node-local NCCL communicator");
}

}  // namespace kolo::nccl
