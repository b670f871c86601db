#include "agent/ops/op.h"

namespace kolo {

Status CollectiveOp::validateOnLoop(const Job&, ClientConn&, const SubmitDesc&,
                                    std::vector<int64_t>*) const {
  return okStatus();
}

void CollectiveOp::rankLeft(OpHost& host, Job& job, const std::vector<uint64_t>& handles) {
  host.finishOpOnLoop(job.id(), handles, 0,
                      job.failure().isOk() ? aborted("a rank left") : job.failure(),
                      DataType::kFloat32, {}, CollectiveType::kAllreduce);
}

const CollectiveOp* collectiveOp(CollectiveType c) {
  switch (c) {
    case CollectiveType::kAllreduce:
      return &allreduceOp();
    case CollectiveType::kBroadcast:
      return &broadcastOp();
    case CollectiveType::kAllgather:
      return &allgatherOp();
    case CollectiveType::kReducescatter:
      return &reducescatterOp();
    case CollectiveType::kAlltoall:
      return &alltoallOp();
    case CollectiveType::kBarrier:
    case CollectiveType::kJoin:
      break;
  }
  return nullptr;
}

}  // namespace kolo
