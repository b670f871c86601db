#include "agent/ops/cross_plan.h"

namespace kolo {

CrossLegPlan planCrossLeg(const CrossLegInputs& in) {
  CrossLegPlan p;
  // One local rank whose slot is host memory, with nothing to apply before
  // the agents reduce: the backend works on the slot itself. That saves a
  // copy of the whole tensor into a staging buffer and one back (half the
  // memory traffic around the ring). The slot is written only by the
  // backend, which is done with it before the op completes, whatever its
  // status (Backend's contract); a failed op leaves it undefined, as an
  // in-place MPI or NCCL allreduce does. Out of place (an output slot), the
  // backend works on the output slot, and the input is first copied into it.
  p.in_place = in.ok && in.count > 0 && !in.direct && in.sources == 1 && in.outputs <= 1 && !in.has_scratch &&
               !in.has_before_finish && in.prescale == 1.0 &&
               (in.collective == CollectiveType::kAllreduce ||
                (in.collective == CollectiveType::kBroadcast && in.outputs == 0));
  p.copy_in = p.in_place && in.output_elsewhere;
  p.in_place_final = p.in_place && in.postscale == 1.0;
  // A large allreduce is pipelined: the negotiation thread reduces it into
  // the staging buffer chunk by chunk as it posts the chunks, and the job's
  // drain thread writes each reduced chunk back into the slots. Nothing is
  // left to pipeline when the ring runs in place and needs no scaling; the
  // device path keeps its own staging.
  p.pipelined = in.ok && in.collective == CollectiveType::kAllreduce && !in.has_before_finish &&
                in.pipeline_bytes > 0 && in.bytes >= in.pipeline_bytes &&
                (!p.in_place_final || p.copy_in);
  return p;
}

}  // namespace kolo
