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
  // Several local ranks (an allreduce, in place in their host slots): the
  // first rank's slot is the staging buffer. The local reduction then
  // writes the lines it has just read instead of a separate buffer's, and
  // the result is copied into k-1 slots instead of k: per op of S bytes on
  // k ranks, S bytes fewer written by the local step (and the staging
  // buffer's S bytes not touched at all) and S fewer by the copy back. The
  // first slot holds partial sums while the agents reduce, so a failed op
  // leaves it undefined, as in place above (a zero-copy rank's own buffer).
  p.first_slot = !p.in_place && in.ok && in.count > 0 && !in.direct && in.sources >= 2 &&
                 in.outputs == 0 && !in.has_scratch && !in.has_before_finish &&
                 in.collective == CollectiveType::kAllreduce;
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
