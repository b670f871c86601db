// Host memory: the collective's op type runs the op (shared-memory slots,
// or the ranks' own memory on the direct path). An op that failed before it
// ran (op.error) completes here on one agent; across agents the other agents
// must learn of it, or their ranks would wait for this name.
#include "agent/ops/memory.h"
#include "agent/ops/op.h"
#include "common/log.h"

namespace kolo {

namespace {

class HostMemory final : public OpMemory {
 public:
  const char* name() const override { return "host"; }
  void runOnLoop(OpHost& host, Job& job, const CollectiveOp* kind, ReadyOp op,
                 std::vector<uint64_t> handles) const override;
};

void HostMemory::runOnLoop(OpHost& host, Job& job, const CollectiveOp* kind, ReadyOp op,
                           std::vector<uint64_t> handles) const {
  const auto coll = static_cast<CollectiveType>(op.descs[0].collective);
  const auto dtype = static_cast<DataType>(op.descs[0].dtype);
  if (!op.error.isOk()) {
    log::get("agent.ops")->warn("job {}: {}", job.id(), op.error.message());
    if (job.world().cross_size == 1) {
      host.finishOpOnLoop(job.id(), handles, 0, op.error, dtype, {}, coll);
      return;
    }
    if (op.anyAbsent()) {  // (joined ranks have no slots to look at)
      LocalReduce r;
      r.dtype = dtype;
      r.op = ReduceOp::kSum;
      runCrossLegOnLoop(host, job, std::move(op), std::move(r), std::move(handles));
      return;
    }
  }
  // onSubmitOnLoop admitted only collectives that have an op type.
  if (kind == nullptr) {
    host.finishOpOnLoop(
        job.id(), handles, 0,
        internalError(std::string(collectiveName(coll)) + " has no op type in this agent"), dtype,
        {}, coll);
    return;
  }
  // The op's plan, once (agent/ops/op_plan.h).
  const OpPlan plan = planOp(op, opWorldOf(job, host.crossPipelineBytes()));
  kind->runOnLoop(host, job, plan, std::move(op), std::move(handles));
}

}  // namespace

const OpMemory& hostMemory() {
  static const HostMemory memory;
  return memory;
}

}  // namespace kolo
