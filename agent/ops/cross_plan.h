// How the cross-agent leg of an allreduce or a broadcast runs, decided once
// per op (runCrossLegOnLoop, agent/ops/cross_leg.cc) and kept on the op
// (Job::CrossPending::leg), so that the code that hands the op to the
// negotiation thread and the code that finishes it (CollectiveOp::
// finishCrossOnLoop) read the same answer.
//
// CrossJob::postAllreduces makes one more choice that this one does not
// replace: whether a pipelined allreduce really goes to the backend in
// chunks is the agents' agreed choice (AgreedParams::pipeline_bytes), and
// when it does not, the work is filled whole first and finished like any
// other (CrossResult::drained says which happened).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kolo {

// What the decision needs from the op and the local step (LocalReduce).
struct CrossLegInputs {
  bool ok = true;  // false: the op carries an error to the other agents
  CollectiveType collective = CollectiveType::kAllreduce;
  size_t count = 0;                // elements
  uint64_t bytes = 0;              // the tensor's bytes
  size_t sources = 0;              // LocalReduce::slots
  size_t outputs = 0;              // LocalReduce::dsts (out of place, or joined ranks' zeros)
  bool output_elsewhere = false;   // the one output slot is not the input slot
  bool has_scratch = false;        // LocalReduce::scratch (zero source, device staging)
  bool has_before_finish = false;  // LocalReduce::before_finish (device staging)
  bool direct = false;             // a rank's tensor is in its own memory (LocalReduce::remote_slots)
  double prescale = 1.0;
  double postscale = 1.0;
  uint64_t pipeline_bytes = 0;  // --cross-pipeline-kb (0: never pipelined)
};

struct CrossLegPlan {
  // No staging buffer: the backend works on the one local rank's host slot
  // (its output slot when out of place).
  bool in_place = false;
  // In place on the output slot of an out-of-place op: the input is copied
  // into it first (chunk by chunk ahead of the ring when pipelined).
  bool copy_in = false;
  // The negotiation thread fills the staging buffer chunk by chunk
  // (CrossWork::fill) and the drain thread writes each chunk back
  // (CrossWork::drain).
  bool pipelined = false;
  // The agents' result needs no scaling or copy when it lands in place.
  bool in_place_final = false;
  // Several local ranks, an allreduce in place in their host slots: the
  // local step reduces them into the first rank's slot (in place) and the
  // agents reduce that slot, so no staging buffer is written and the
  // result is copied into the other ranks' slots only (the first one is
  // scaled in place, if at all).
  bool first_slot = false;

  // Whether the ring reads a staging buffer filled by the agent (not a slot).
  bool needsStaging() const { return !in_place && !first_slot; }
  // Pipelined: whether the negotiation thread must fill (reduce or copy the
  // input into) the buffer the ring reads, and whether the drain thread must
  // write the result back into the slots.
  bool fills() const { return pipelined && (!in_place || copy_in); }
  bool drains() const { return pipelined && !in_place_final; }
  // Not pipelined: whether the local step runs on the executor before the
  // op goes to the negotiation thread.
  bool localStepFirst() const { return !pipelined && (!in_place || copy_in); }
  // After the agents' collective: whether the result is already in the
  // ranks' slots (drained chunk by chunk, or reduced in place and unscaled
  // and not read from a fused buffer).
  bool resultInSlots(bool drained, bool fused) const {
    return drained || (in_place_final && !fused);
  }
  bool operator==(const CrossLegPlan&) const = default;
};

CrossLegPlan planCrossLeg(const CrossLegInputs& in);

}  // namespace kolo
