// The client's slot planner (common/slot_plan.h): where each piece of a
// submission goes in the data region, and the descriptor it yields.
#include "common/slot_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kolo {
namespace {

SlotRequest request(CollectiveType c, const std::vector<int64_t>& shape,
                    DataType dt = DataType::kFloat32) {
  static std::vector<int64_t> keep;  // outlives the request in each test
  keep = shape;
  SlotRequest r;
  r.collective = c;
  r.name = "t";
  r.dtype = dt;
  r.ndim = static_cast<int>(keep.size());
  r.shape = keep.data();
  uint64_t n = dataTypeSize(dt);
  for (int64_t d : keep) n *= static_cast<uint64_t>(d);
  r.bytes = n;
  r.has_output = true;
  return r;
}

TEST(SlotPlan, PlainCopyTakesOneSlotOfTheTensorsBytes) {
  SlotRequest r = request(CollectiveType::kAllreduce, {10});
  r.prescale = 0.5;
  r.op = ReduceOp::kMax;
  auto p = planSlots(r, SlotGeometry{});
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p->slot_bytes, 40u);
  EXPECT_EQ(p->copy, CopyIn::kPlain);
  ASSERT_TRUE(p->result.has_value());
  EXPECT_EQ(p->result->offset(4096), 4096u);
  EXPECT_EQ(p->result_bytes, 40u);
  SubmitDesc d = describeSubmit(r, *p, 4096);
  EXPECT_EQ(d.data_offset, 4096u);
  EXPECT_EQ(d.data_bytes, 40u);
  EXPECT_EQ(d.out_offset, 0u);
  EXPECT_EQ(d.out_bytes, 0u);
  EXPECT_EQ(d.collective, static_cast<uint8_t>(CollectiveType::kAllreduce));
  EXPECT_EQ(d.reduce_op, static_cast<uint8_t>(ReduceOp::kMax));
  EXPECT_EQ(d.root, -1);
  EXPECT_EQ(d.prescale, 0.5);
  EXPECT_EQ(d.shape[0], 10);
  EXPECT_EQ(std::string(d.name, d.name_len), "t");
}

// The direct path (agent reads and writes the process's own memory): a
// host allreduce of at least direct_min_bytes outside the arena takes no
// slot, and the descriptor carries the addresses with the flag.
TEST(SlotPlan, DirectAllreduceTakesNoSlotAndNamesTheAddresses) {
  SlotRequest r = request(CollectiveType::kAllreduce, {1024});  // 4096 bytes
  r.input_addr = 0x10000;
  r.output_addr = 0x10000;  // in place
  SlotGeometry g;
  g.direct_min_bytes = 4096;
  auto p = planSlots(r, g);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_TRUE(p->direct);
  EXPECT_EQ(p->slot_bytes, 0u);
  EXPECT_EQ(p->copy, CopyIn::kNone);
  EXPECT_FALSE(p->result.has_value());
  SubmitDesc d = describeSubmit(r, *p, 777);
  EXPECT_EQ(d.flags & kSubmitFlagUserMemory, kSubmitFlagUserMemory);
  EXPECT_EQ(d.data_offset, 0x10000u);
  EXPECT_EQ(d.data_bytes, 4096u);
  EXPECT_EQ(d.out_bytes, 0u);  // in place

  r.output_addr = 0x20000;  // out of place
  p = planSlots(r, g);
  ASSERT_TRUE(p.isOk());
  d = describeSubmit(r, *p, 0);
  EXPECT_EQ(d.out_offset, 0x20000u);
  EXPECT_EQ(d.out_bytes, 4096u);

  r.output_addr = 0x10800;  // overlaps the input
  p = planSlots(r, g);
  ASSERT_FALSE(p.isOk());
  EXPECT_NE(p.status().message().find("overlaps the input"), std::string::npos);
}

TEST(SlotPlan, DirectPathOnlyForLargePlainHostAllreduces) {
  SlotGeometry g;
  g.direct_min_bytes = 4096;
  auto plan = [&](SlotRequest r) {
    r.input_addr = r.output_addr = 0x10000;
    auto p = planSlots(r, g);
    EXPECT_TRUE(p.isOk()) << p.status().toString();
    return p.isOk() && p->direct;
  };
  EXPECT_TRUE(plan(request(CollectiveType::kAllreduce, {1024})));
  EXPECT_FALSE(plan(request(CollectiveType::kAllreduce, {1023})));  // below the threshold
  EXPECT_FALSE(plan(request(CollectiveType::kBroadcast, {4096})));
  SlotRequest c = request(CollectiveType::kAllreduce, {4096}, DataType::kFloat16);
  c.compressed = true;  // float32 -> float16 in the slot
  EXPECT_FALSE(plan(c));
  SlotRequest z = request(CollectiveType::kAllreduce, {1024});
  z.output_offset = 8192;  // the output is a kolo_alloc_shared buffer
  EXPECT_FALSE(plan(z));
  g.direct_min_bytes = 0;  // off (not granted, or alone on its agent across agents)
  EXPECT_FALSE(plan(request(CollectiveType::kAllreduce, {1 << 20})));
}

TEST(SlotPlan, EmptyTensorNeedsNoSlotAndNoResult) {
  auto p = planSlots(request(CollectiveType::kJoin, {0}, DataType::kUint8), SlotGeometry{});
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->slot_bytes, 0u);
  EXPECT_FALSE(p->result.has_value());
  EXPECT_EQ(p->copy, CopyIn::kNone);
  EXPECT_EQ(
      describeSubmit(request(CollectiveType::kJoin, {0}, DataType::kUint8), *p, 999).data_offset,
      0u);
}

TEST(SlotPlan, BroadcastCarriesItsRootOthersDoNot) {
  SlotRequest r = request(CollectiveType::kBroadcast, {4});
  r.root = 3;
  auto p = planSlots(r, SlotGeometry{});
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(describeSubmit(r, *p, 64).root, 3);
  r.collective = CollectiveType::kAllreduce;
  EXPECT_EQ(describeSubmit(r, *p, 64).root, -1);
}

TEST(SlotPlan, CompressedAllreduceConvertsIntoAWireTypeSlot) {
  SlotRequest r = request(CollectiveType::kAllreduce, {8}, DataType::kBFloat16);
  r.compressed = true;
  auto p = planSlots(r, SlotGeometry{});
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->slot_bytes, 16u);
  EXPECT_EQ(p->copy, CopyIn::kToBFloat16);
  r.dtype = DataType::kFloat16;
  EXPECT_EQ(planSlots(r, SlotGeometry{})->copy, CopyIn::kToFloat16);
}

TEST(SlotPlan, ZeroCopyUsesTheSharedBufferInPlace) {
  std::map<uint64_t, uint64_t> shared{{8192, 256}};
  SlotGeometry g;
  g.shared = &shared;
  SlotRequest r = request(CollectiveType::kAllreduce, {16});
  r.input_offset = 8192 + 64;
  r.output_offset = 8192 + 64;
  auto p = planSlots(r, g);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p->slot_bytes, 0u);
  EXPECT_EQ(p->copy, CopyIn::kNone);
  EXPECT_EQ(p->result->offset(0), 8256u);
  EXPECT_FALSE(p->shared_input);
  SubmitDesc d = describeSubmit(r, *p, 0);
  EXPECT_EQ(d.data_offset, 8256u);
  EXPECT_EQ(d.out_bytes, 0u);
  // Out of place (broadcast_oop): copied into a slot even from the arena.
  r.out_of_place = true;
  EXPECT_EQ(planSlots(r, g)->copy, CopyIn::kPlain);
}

TEST(SlotPlan, ZeroCopyOutsideOneSharedBufferIsRefusedNamingTheCollective) {
  std::map<uint64_t, uint64_t> shared{{8192, 64}};
  SlotGeometry g;
  g.shared = &shared;
  SlotRequest r = request(CollectiveType::kBroadcast, {32});  // 128 bytes > 64
  r.input_offset = 8192;
  auto p = planSlots(r, g);
  ASSERT_EQ(p.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "broadcast of tensor 't': its 128 bytes start inside the shared arena but do not lie "
            "within one buffer from kolo_alloc_shared");
}

TEST(SlotPlan, ZeroCopyOutOfPlaceAllreduceNamesTheOutputRegion) {
  std::map<uint64_t, uint64_t> shared{{8192, 1024}, {16384, 256}};
  SlotGeometry g;
  g.shared = &shared;
  SlotRequest r = request(CollectiveType::kAllreduce, {64});
  r.input_offset = 8192;
  r.output_offset = 16384;
  auto p = planSlots(r, g);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_TRUE(p->shared_input);
  EXPECT_EQ(p->result->offset(0), 16384u);
  SubmitDesc d = describeSubmit(r, *p, 0);
  EXPECT_EQ(d.data_offset, 8192u);
  EXPECT_EQ(d.out_offset, 16384u);
  EXPECT_EQ(d.out_bytes, 256u);
  // Overlapping, and running past the output's buffer.
  r.output_offset = 8192 + 32;
  EXPECT_NE(planSlots(r, g).status().message().find("the output overlaps the input"),
            std::string::npos);
  r.output_offset = 16384 + 128;
  EXPECT_NE(planSlots(r, g).status().message().find("its output's 256 bytes"), std::string::npos);
}

TEST(SlotPlan, AllgatherSlotHoldsSizesThenOutputThenInput) {
  SlotRequest r = request(CollectiveType::kAllgather, {3, 2});  // rows of 8 bytes
  const int64_t dims[3] = {3, 1, 5};
  r.gather_dims = dims;
  SlotGeometry g;
  g.rank = 0;
  g.size = 3;
  auto p = planSlots(r, g);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  const uint64_t prefix = allgatherSizesBytes(3);  // 64
  EXPECT_TRUE(p->gather);
  EXPECT_EQ(p->gather_dim0, 9);
  EXPECT_EQ(p->header.bytes, 3 * sizeof(int64_t));
  EXPECT_EQ(p->header_src, dims);
  EXPECT_EQ(p->result->offset(1024), 1024 + prefix);
  EXPECT_EQ(p->result_bytes, 72u);
  EXPECT_EQ(p->slot_bytes, prefix + 128 + 24);  // 72 padded to 128, then the 24-byte input
  SubmitDesc d = describeSubmit(r, *p, 1024);
  EXPECT_EQ(d.out_offset, 1024u);
  EXPECT_EQ(d.out_bytes, prefix + 72);
  EXPECT_EQ(d.data_offset, 1024 + prefix + 128);
  EXPECT_EQ(d.data_bytes, 24u);
}

TEST(SlotPlan, AlltoallReceivesItsColumnOfTheSplitMatrix) {
  SlotRequest r = request(CollectiveType::kAlltoall, {4}, DataType::kInt32);
  // Rows sent by rank s to rank d at [s * 2 + d]; rank 1 receives 3 + 2.
  const int64_t m[4] = {1, 3, 2, 2};
  r.splits_matrix = m;
  SlotGeometry g;
  g.rank = 1;
  g.size = 2;
  auto p = planSlots(r, g);
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->gather_dim0, 5);
  EXPECT_EQ(p->header.bytes, 4 * sizeof(int64_t));
  EXPECT_EQ(p->result_bytes, 20u);
  EXPECT_EQ(p->out.bytes, alltoallSplitsBytes(2) + 20);
  r.splits_matrix = nullptr;
  EXPECT_EQ(planSlots(r, g).status().code(), Code::kInternal);  // the alltoall needs its matrix
}

TEST(SlotPlan, ReducescatterSlotHoldsInputThenThisRanksRows) {
  SlotRequest r = request(CollectiveType::kReducescatter, {5, 2});  // 40 bytes, rows of 8
  SlotGeometry g;
  g.rank = 1;
  g.size = 2;  // rank 1 gets rows [3, 5): 2 rows
  auto p = planSlots(r, g);
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->slot_bytes, 64u + 16u);
  EXPECT_EQ(p->result_bytes, 16u);
  SubmitDesc d = describeSubmit(r, *p, 4096);
  EXPECT_EQ(d.data_offset, 4096u);
  EXPECT_EQ(d.out_offset, 4096u + 64u);
  EXPECT_EQ(d.out_bytes, 16u);
  r.has_output = false;
  auto bad = planSlots(r, g);
  ASSERT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "reducescatter of tensor 't': output is NULL");
}

TEST(SlotPlan, DescribeTensorCutsLongNames) {
  EXPECT_EQ(describeTensor(CollectiveType::kAlltoall, "x"), "alltoall of tensor 'x'");
  EXPECT_EQ(describeTensor(CollectiveType::kAllgather, std::string(70, 'a')),
            "allgather of tensor '" + std::string(64, 'a') + "...'");
}

TEST(SlotPlan, GroupFieldsReachTheDescriptor) {
  SlotRequest r = request(CollectiveType::kAllreduce, {1});
  r.group_id = 7;
  r.group_hash = 0xabc;
  r.group_size = 3;
  auto p = planSlots(r, SlotGeometry{});
  ASSERT_TRUE(p.isOk());
  SubmitDesc d = describeSubmit(r, *p, 0);
  EXPECT_EQ(d.group_id, 7u);
  EXPECT_EQ(d.group_hash, 0xabcu);
  EXPECT_EQ(d.group_size, 3u);
}

}  // namespace
}  // namespace kolo
