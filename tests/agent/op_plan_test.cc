// planOp (agent/ops/op_plan.h): one host op's plan from its descriptors and
// the job's world, with exact expectations for every collective and mode.
#include "agent/ops/op_plan.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/ipc_layout.h"

namespace kolo {
namespace {

SubmitDesc desc(CollectiveType c, DataType dt, uint64_t bytes, std::vector<int64_t> shape = {}) {
  SubmitDesc d;
  std::memset(&d, 0, sizeof(d));
  d.collective = static_cast<uint8_t>(c);
  d.dtype = static_cast<uint8_t>(dt);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  d.prescale = d.postscale = 1.0;
  d.data_offset = 4096;
  d.data_bytes = bytes;
  d.ndim = static_cast<uint8_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  std::strcpy(d.name, "t");
  d.name_len = 1;
  return d;
}

ReadyOp ready(const SubmitDesc& d, int local) {
  ReadyOp op;
  op.name = "t";
  op.descs.assign(local, d);
  for (int i = 0; i < local; ++i) op.descs[i].data_offset = 4096 * (i + 1);
  return op;
}

// `agents` agents of `per` ranks each; this one is cross rank `me`.
OpWorld world(int agents, int per, int me = 0, uint64_t pipeline = 8 << 20) {
  OpWorld w;
  w.world_size = agents * per;
  w.local_size = per;
  w.cross_size = agents;
  w.rank_offset = me * per;
  for (int a = 0; a < agents; ++a) {
    w.rank_offsets.push_back(a * per);
    w.local_sizes.push_back(per);
  }
  w.pipeline_bytes = pipeline;
  return w;
}

TEST(OpPlan, AllreduceOnOneAgentIsLocalAndAverageIsSumOverTheWorld) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 4096);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage);
  d.postscale = 2.0;
  d.prescale = 0.5;
  OpPlan p = planOp(ready(d, 4), world(1, 4));
  EXPECT_EQ(p.placement, OpPlacement::kOneAgent);
  EXPECT_EQ(p.memory, OpMemoryKind::kShared);
  EXPECT_EQ(p.path, OpPath::kLocal);
  EXPECT_EQ(p.reduce, ReduceOp::kSum);
  EXPECT_EQ(p.prescale, 0.5);
  EXPECT_EQ(p.postscale, 0.5);  // 2.0 / 4 ranks
  EXPECT_EQ(p.count, 1024u);
  EXPECT_FALSE(p.out_of_place);
  EXPECT_FALSE(p.joined);
  EXPECT_TRUE(p.error.isOk());
}

TEST(OpPlan, EmptyAllreduceOnOneAgentMovesNothingButAcrossAgentsItNegotiates) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 0);
  EXPECT_EQ(planOp(ready(d, 2), world(1, 2)).path, OpPath::kNothing);
  EXPECT_EQ(planOp(ready(d, 2), world(2, 2)).path, OpPath::kStaged);
}

TEST(OpPlan, AverageDividesByTheWholeWorldAcrossAgents) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat64, 800);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage);
  OpPlan p = planOp(ready(d, 2), world(3, 2));
  EXPECT_EQ(p.placement, OpPlacement::kAcrossAgents);
  EXPECT_EQ(p.postscale, 1.0 / 6);
  EXPECT_EQ(p.count, 100u);
  // Two local sources: reduced into a staging buffer first; scaled after.
  EXPECT_EQ(p.path, OpPath::kStaged);
  EXPECT_FALSE(p.leg.in_place);
  EXPECT_TRUE(p.leg.localStepFirst());
}

TEST(OpPlan, OneRankPerAgentRunsInPlaceAndLargeScaledOnesPipeline) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 1 << 20);
  OpPlan small = planOp(ready(d, 1), world(2, 1));
  EXPECT_EQ(small.path, OpPath::kInPlace);
  EXPECT_TRUE(small.leg.in_place_final);
  d.data_bytes = 16 << 20;
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage);
  OpPlan big = planOp(ready(d, 1), world(2, 1));
  EXPECT_EQ(big.path, OpPath::kPipelined);
  EXPECT_TRUE(big.leg.in_place);
  EXPECT_TRUE(big.leg.drains());
  EXPECT_FALSE(big.leg.fills());
  // Several local ranks: staged and pipelined (filled and drained in chunks).
  OpPlan many = planOp(ready(d, 4), world(2, 4));
  EXPECT_EQ(many.path, OpPath::kPipelined);
  EXPECT_FALSE(many.leg.in_place);
  EXPECT_TRUE(many.leg.fills());
  // --cross-pipeline-kb 0: never pipelined.
  EXPECT_EQ(planOp(ready(d, 4), world(2, 4, 0, 0)).path, OpPath::kStaged);
}

TEST(OpPlan, OutOfPlaceLoneRankCopiesItsInputIntoTheOutputSlot) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 4096);
  d.out_offset = 1 << 20;
  d.out_bytes = 4096;
  OpPlan p = planOp(ready(d, 1), world(2, 1));
  EXPECT_TRUE(p.out_of_place);
  EXPECT_EQ(p.path, OpPath::kInPlace);
  EXPECT_TRUE(p.leg.copy_in);
  EXPECT_TRUE(p.leg.localStepFirst());
}

TEST(OpPlan, DirectMemoryNeverRunsInPlace) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 4096);
  d.flags = kSubmitFlagUserMemory;
  OpPlan p = planOp(ready(d, 1), world(2, 1));
  EXPECT_EQ(p.memory, OpMemoryKind::kDirect);
  EXPECT_EQ(p.path, OpPath::kStaged);
}

TEST(OpPlan, StreamedAndSplitAreRecognised) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 16 << 20);
  d.flags = kSubmitFlagStreamed;
  OpPlan alone = planOp(ready(d, 1), world(2, 1));
  EXPECT_TRUE(alone.streamed);
  EXPECT_EQ(alone.path, OpPath::kInPlace);  // the ring reads the slot: nothing to pipeline
  OpPlan two = planOp(ready(d, 2), world(2, 2));
  EXPECT_TRUE(two.streamed);
  EXPECT_EQ(two.path, OpPath::kPipelined);
  EXPECT_FALSE(two.leg.localStepFirst());  // the input is read only on the negotiation thread
  d.flags = kSubmitFlagSplit;
  EXPECT_EQ(planOp(ready(d, 4), world(1, 4)).path, OpPath::kSplit);
  EXPECT_EQ(planOp(ready(d, 4), world(2, 4)).path, OpPath::kSplit);  // (the agent answers retry)
}

TEST(OpPlan, JoinedRanksNeedAZeroSourceOnlyForMinMaxProduct) {
  SubmitDesc d = desc(CollectiveType::kAllreduce, DataType::kFloat32, 4096);
  ReadyOp op = ready(d, 2);
  op.absent = {false, true};
  OpPlan sum = planOp(op, world(2, 2));
  EXPECT_TRUE(sum.joined);
  EXPECT_FALSE(sum.zero_source);
  EXPECT_EQ(sum.path, OpPath::kInPlace);  // one present rank
  for (auto& x : op.descs) x.reduce_op = static_cast<uint8_t>(ReduceOp::kMin);
  OpPlan min = planOp(op, world(2, 2));
  EXPECT_TRUE(min.zero_source);
  EXPECT_EQ(min.path, OpPath::kStaged);
}

TEST(OpPlan, BroadcastCountsBytesAndRunsInPlaceAlone) {
  SubmitDesc d = desc(CollectiveType::kBroadcast, DataType::kFloat32, 4000);
  OpPlan one = planOp(ready(d, 3), world(1, 3));
  EXPECT_EQ(one.path, OpPath::kLocal);
  EXPECT_EQ(one.count, 4000u);
  EXPECT_EQ(planOp(ready(d, 1), world(2, 1)).path, OpPath::kInPlace);
  EXPECT_EQ(planOp(ready(d, 3), world(2, 3)).path, OpPath::kStaged);
}

TEST(OpPlan, AllgatherOffsetsFollowTheFirstDimensions) {
  SubmitDesc d = desc(CollectiveType::kAllgather, DataType::kFloat32, 0, {2, 3});
  ReadyOp op = ready(d, 2);
  op.metas = {{2, 1, 0, 4}, {2, 1, 0, 4}};
  OpPlan p = planOp(op, world(2, 2));
  ASSERT_TRUE(p.error.isOk()) << p.error.message();
  EXPECT_EQ(p.offsets, (std::vector<uint64_t>{0, 24, 36, 36, 84}));  // rows of 3 floats
  EXPECT_EQ(p.agentBlock(world(2, 2), 0), 36u);
  EXPECT_EQ(p.agentBlock(world(2, 2), 1), 48u);
  EXPECT_EQ(p.path, OpPath::kStaged);
}

TEST(OpPlan, AllgatherRanksThatDisagreeFailWithTheirRanks) {
  SubmitDesc d = desc(CollectiveType::kAllgather, DataType::kFloat32, 0, {2});
  ReadyOp op = ready(d, 2);
  op.metas = {{2, 1, 0, 4}, {2, 2, 0, 4}};
  OpPlan p = planOp(op, world(2, 2, 1));
  EXPECT_EQ(p.error.code(), Code::kInvalidArgument);
  EXPECT_EQ(
      p.error.message(),
      "allgather of tensor 't': ranks 2 and 3 list different first dimensions for the other ranks");
  EXPECT_EQ(p.offsets, (std::vector<uint64_t>(5, 0)));
  op.metas = {{2, 1}, {2, 1}};
  EXPECT_EQ(planOp(op, world(2, 2)).error.message(),
            "allgather of tensor 't': rank 0's list of first dimensions is not one of this "
            "generation's size 4");
}

TEST(OpPlan, AllgatherJoinedRankMustHaveNoRows) {
  SubmitDesc d = desc(CollectiveType::kAllgather, DataType::kFloat32, 0, {2});
  ReadyOp op = ready(d, 2);
  op.absent = {false, true};
  op.metas = {{2, 3}, {}};
  EXPECT_EQ(planOp(op, world(1, 2)).error.message(),
            "allgather of tensor 't': rank 1 has joined but is listed with first dimension 3");
  op.metas = {{2, 0}, {}};
  OpPlan p = planOp(op, world(1, 2));
  EXPECT_TRUE(p.error.isOk());
  EXPECT_EQ(p.offsets, (std::vector<uint64_t>{0, 8, 8}));
}

TEST(OpPlan, AlltoallTakesTheRanksOneMatrix) {
  SubmitDesc d = desc(CollectiveType::kAlltoall, DataType::kInt32, 0, {3});
  ReadyOp op = ready(d, 2);
  op.metas = {{1, 2, 3, 0}, {1, 2, 3, 0}};
  OpPlan p = planOp(op, world(1, 2));
  ASSERT_TRUE(p.error.isOk());
  EXPECT_EQ(p.splits, (std::vector<int64_t>{1, 2, 3, 0}));
  op.metas[1] = {1, 2, 0, 3};
  OpPlan bad = planOp(op, world(1, 2));
  EXPECT_EQ(bad.error.message(),
            "alltoall of tensor 't': ranks 0 and 1 hold different split matrices");
  EXPECT_EQ(bad.splits, (std::vector<int64_t>(4, 0)));
}

TEST(OpPlan, ReducescatterBlocksSpreadTheRemainderOverTheFirstRanks) {
  SubmitDesc d = desc(CollectiveType::kReducescatter, DataType::kFloat32, 0, {7, 2});
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage);
  OpPlan p = planOp(ready(d, 3), world(1, 3));
  EXPECT_EQ(p.count, 14u);
  EXPECT_EQ(p.reduce, ReduceOp::kSum);
  EXPECT_EQ(p.postscale, 1.0 / 3);
  // 7 rows over 3 ranks: 3, 2, 2 rows of 2 elements.
  EXPECT_EQ(p.offsets, (std::vector<uint64_t>{0, 6, 10, 14}));
}

TEST(OpPlan, AnOpsOwnErrorIsKept) {
  SubmitDesc d = desc(CollectiveType::kAllgather, DataType::kFloat32, 0, {2});
  ReadyOp op = ready(d, 1);
  op.error = invalidArgument("ranks disagree on the dtype");
  OpPlan p = planOp(op, world(2, 1));
  EXPECT_EQ(p.error.message(), "ranks disagree on the dtype");
  EXPECT_EQ(p.offsets, (std::vector<uint64_t>(3, 0)));
}

TEST(OpPlan, NamesReadWell) {
  EXPECT_STREQ(opPathName(OpPath::kPipelined), "pipelined");
  EXPECT_STREQ(opPathName(OpPath::kInPlace), "in place");
  EXPECT_STREQ(opPlacementName(OpPlacement::kAcrossAgents), "across agents");
  EXPECT_STREQ(opMemoryName(OpMemoryKind::kDirect), "direct");
}

}  // namespace
}  // namespace kolo
