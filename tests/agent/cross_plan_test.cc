// planCrossLeg (agent/ops/cross_plan.h): in place, staged, pipelined, and
// where the result is once the agents are done.
#include "agent/ops/cross_plan.h"

#include <gtest/gtest.h>

namespace kolo {
namespace {

CrossLegInputs allreduce(uint64_t bytes, size_t sources = 1) {
  CrossLegInputs in;
  in.collective = CollectiveType::kAllreduce;
  in.bytes = bytes;
  in.count = bytes / 4;
  in.sources = sources;
  in.pipeline_bytes = 8 << 20;
  return in;
}

TEST(CrossPlan, OneRankSmallAllreduceRunsInPlace) {
  CrossLegPlan p = planCrossLeg(allreduce(1024));
  EXPECT_TRUE(p.in_place);
  EXPECT_FALSE(p.copy_in);
  EXPECT_FALSE(p.pipelined);
  EXPECT_FALSE(p.needsStaging());
  EXPECT_FALSE(p.localStepFirst());
  EXPECT_TRUE(p.resultInSlots(false, false));
  EXPECT_FALSE(p.resultInSlots(false, true));  // read from the fused buffer
}

TEST(CrossPlan, LargeInPlaceUnscaledAllreduceHasNothingToPipeline) {
  CrossLegPlan p = planCrossLeg(allreduce(64 << 20));
  EXPECT_TRUE(p.in_place);
  EXPECT_FALSE(p.pipelined);
}

TEST(CrossPlan, LargeScaledInPlaceAllreduceDrainsOnly) {
  CrossLegInputs in = allreduce(64 << 20);
  in.postscale = 0.5;
  CrossLegPlan p = planCrossLeg(in);
  EXPECT_TRUE(p.in_place);
  EXPECT_TRUE(p.pipelined);
  EXPECT_FALSE(p.fills());
  EXPECT_TRUE(p.drains());
  EXPECT_FALSE(p.resultInSlots(false, false));
  EXPECT_TRUE(p.resultInSlots(true, false));
}

TEST(CrossPlan, OutOfPlaceOneRankCopiesIn) {
  CrossLegInputs in = allreduce(64 << 20);
  in.outputs = 1;
  in.output_elsewhere = true;
  CrossLegPlan p = planCrossLeg(in);
  EXPECT_TRUE(p.in_place);
  EXPECT_TRUE(p.copy_in);
  EXPECT_TRUE(p.pipelined);
  EXPECT_TRUE(p.fills());
  EXPECT_FALSE(p.drains());
  in.bytes = in.count = 1024;
  p = planCrossLeg(in);
  EXPECT_FALSE(p.pipelined);
  EXPECT_TRUE(p.localStepFirst());  // the copy into the output slot
}

TEST(CrossPlan, SeveralRanksReduceIntoTheFirstSlotAndPipelineLargeOnes) {
  CrossLegPlan small = planCrossLeg(allreduce(1024, 2));
  EXPECT_FALSE(small.in_place);
  EXPECT_TRUE(small.first_slot);
  EXPECT_FALSE(small.needsStaging());
  EXPECT_FALSE(small.pipelined);
  EXPECT_TRUE(small.localStepFirst());
  EXPECT_FALSE(small.resultInSlots(false, false));  // copied into the other slots
  CrossLegPlan large = planCrossLeg(allreduce(8 << 20, 2));
  EXPECT_TRUE(large.first_slot);
  EXPECT_FALSE(large.needsStaging());
  EXPECT_TRUE(large.pipelined);
  EXPECT_TRUE(large.fills());
  EXPECT_TRUE(large.drains());
  EXPECT_FALSE(large.localStepFirst());
  EXPECT_TRUE(large.resultInSlots(true, false));
  CrossLegInputs pre = allreduce(8 << 20, 4);
  pre.prescale = 0.5;  // applied to every source as it is reduced into the first slot
  pre.postscale = 2.0;
  EXPECT_TRUE(planCrossLeg(pre).first_slot);
}

TEST(CrossPlan, SeveralRanksStageWhenTheFirstSlotCannotHoldTheSum) {
  CrossLegInputs oop = allreduce(1024, 2);
  oop.outputs = 2;  // zero copy out of place: the inputs must stay as they are
  EXPECT_FALSE(planCrossLeg(oop).first_slot);
  EXPECT_TRUE(planCrossLeg(oop).needsStaging());
  CrossLegInputs direct = allreduce(1024, 2);
  direct.direct = true;  // the first rank's tensor is in its own process
  EXPECT_FALSE(planCrossLeg(direct).first_slot);
  CrossLegInputs joined = allreduce(1024, 2);
  joined.has_scratch = true;  // a joined rank's zeros
  EXPECT_FALSE(planCrossLeg(joined).first_slot);
  CrossLegInputs device = allreduce(1024, 2);
  device.has_before_finish = true;
  EXPECT_FALSE(planCrossLeg(device).first_slot);
  CrossLegInputs bcast = allreduce(1024, 2);
  bcast.collective = CollectiveType::kBroadcast;  // the root's data, not a sum
  EXPECT_FALSE(planCrossLeg(bcast).first_slot);
  EXPECT_TRUE(planCrossLeg(bcast).needsStaging());
  CrossLegInputs failed = allreduce(1024, 2);
  failed.ok = false;
  EXPECT_FALSE(planCrossLeg(failed).first_slot);
  EXPECT_FALSE(planCrossLeg(allreduce(1024, 1)).first_slot);  // one rank: in place
}

TEST(CrossPlan, NeverPipelined) {
  CrossLegInputs off = allreduce(64 << 20, 2);
  off.pipeline_bytes = 0;
  EXPECT_FALSE(planCrossLeg(off).pipelined);
  CrossLegInputs device = allreduce(64 << 20, 1);
  device.has_before_finish = true;  // device staging keeps its own buffer
  EXPECT_FALSE(planCrossLeg(device).in_place);
  EXPECT_FALSE(planCrossLeg(device).pipelined);
  CrossLegInputs failed = allreduce(64 << 20, 2);
  failed.ok = false;
  EXPECT_FALSE(planCrossLeg(failed).pipelined);
  EXPECT_FALSE(planCrossLeg(failed).in_place);
  CrossLegInputs bcast = allreduce(64 << 20, 1);
  bcast.collective = CollectiveType::kBroadcast;
  EXPECT_TRUE(planCrossLeg(bcast).in_place);
  EXPECT_FALSE(planCrossLeg(bcast).pipelined);
  bcast.outputs = 1;  // broadcast is in place only on its own slot
  EXPECT_FALSE(planCrossLeg(bcast).in_place);
}

TEST(CrossPlan, PrescaleOrJoinedRanksNeedStaging) {
  CrossLegInputs pre = allreduce(1024);
  pre.prescale = 2.0;
  EXPECT_FALSE(planCrossLeg(pre).in_place);
  CrossLegInputs zeros = allreduce(1024);
  zeros.has_scratch = true;
  EXPECT_FALSE(planCrossLeg(zeros).in_place);
}

}  // namespace
}  // namespace kolo
