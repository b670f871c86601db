#include <gtest/gtest.h>

#include <cstring>

#include "agent/core/tensor_table.h"
#include "common/dtype.h"

namespace kolo {
namespace {

SubmitDesc makeDesc(const std::string& name, uint64_t handle, DataType dt, std::vector<int64_t> shape,
                    ReduceOp op = ReduceOp::kSum, double pre = 1, double post = 1) {
  SubmitDesc d{};
  d.handle = handle;
  d.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
  d.dtype = static_cast<uint8_t>(dt);
  d.reduce_op = static_cast<uint8_t>(op);
  d.ndim = static_cast<uint8_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.prescale = pre;
  d.postscale = post;
  d.name_len = static_cast<uint32_t>(name.size());
  std::memcpy(d.name, name.data(), name.size());
  return d;
}

const SteadyTime kT0 = SteadyTime() + std::chrono::seconds(100);

TEST(TensorTable, ReadyWhenAllLocalRanksSubmitted) {
  TensorTable t(3);
  t.setRankOffset(4);
  std::optional<ReadyOp> ready;
  ASSERT_TRUE(t.submit(2, makeDesc("w", 10, DataType::kFloat32, {3, 4}), kT0, &ready).isOk());
  EXPECT_FALSE(ready);
  ASSERT_TRUE(t.submit(0, makeDesc("w", 11, DataType::kFloat32, {3, 4}), kT0, &ready).isOk());
  EXPECT_FALSE(ready);
  auto snap = t.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].submitted, (std::vector<int>{0, 2}));
  EXPECT_EQ(snap[0].waiting, (std::vector<int>{1}));
  ASSERT_TRUE(t.submit(1, makeDesc("w", 12, DataType::kFloat32, {3, 4}), kT0, &ready).isOk());
  ASSERT_TRUE(ready);
  EXPECT_TRUE(ready->error.isOk());
  EXPECT_EQ(ready->descs[0].handle, 11u);
  EXPECT_EQ(ready->descs[1].handle, 12u);
  EXPECT_EQ(ready->descs[2].handle, 10u);
  EXPECT_EQ(t.pendingCount(), 0u);
}

TEST(TensorTable, DtypeMismatchNamesBothSidesAndRanks) {
  TensorTable t(2);
  t.setRankOffset(2);
  std::optional<ReadyOp> ready;
  ASSERT_TRUE(t.submit(0, makeDesc("grad", 1, DataType::kFloat32, {5}), kT0, &ready).isOk());
  ASSERT_TRUE(t.submit(1, makeDesc("grad", 2, DataType::kFloat64, {5}), kT0, &ready).isOk());
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->error.code(), Code::kInvalidArgument);
  EXPECT_EQ(ready->error.message(),
            "Mismatched data types for tensor 'grad': rank 2 sent float32, but rank 3 sent float64.");
}

TEST(TensorTable, ShapeOpAndScaleMismatches) {
  std::optional<ReadyOp> ready;
  {
    TensorTable t(2);
    (void)t.submit(0, makeDesc("x", 1, DataType::kInt32, {4, 3}), kT0, &ready);
    (void)t.submit(1, makeDesc("x", 2, DataType::kInt32, {4, 4}), kT0, &ready);
    ASSERT_TRUE(ready);
    EXPECT_EQ(ready->error.message(),
              "Mismatched allreduce tensor shapes for tensor 'x': rank 0 sent shape [4, 3], but rank 1 "
              "sent shape [4, 4].");
  }
  {
    TensorTable t(2);
    (void)t.submit(0, makeDesc("x", 1, DataType::kInt32, {4}, ReduceOp::kSum), kT0, &ready);
    (void)t.submit(1, makeDesc("x", 2, DataType::kInt32, {4}, ReduceOp::kMax), kT0, &ready);
    EXPECT_NE(ready->error.message().find("rank 0 sent sum, but rank 1 sent max"), std::string::npos)
        << ready->error.message();
  }
  {
    TensorTable t(2);
    (void)t.submit(0, makeDesc("x", 1, DataType::kInt32, {4}, ReduceOp::kSum, 1, 2), kT0, &ready);
    (void)t.submit(1, makeDesc("x", 2, DataType::kInt32, {4}, ReduceOp::kSum, 1, 3), kT0, &ready);
    EXPECT_NE(ready->error.message().find("Mismatched prescale and/or postscale factors"), std::string::npos);
    EXPECT_NE(ready->error.message().find("(1, 2)"), std::string::npos) << ready->error.message();
  }
}

TEST(TensorTable, DuplicateNameInFlightIsRejectedForThatSubmissionOnly) {
  TensorTable t(2);
  std::optional<ReadyOp> ready;
  ASSERT_TRUE(t.submit(0, makeDesc("a", 1, DataType::kFloat32, {2}), kT0, &ready).isOk());
  Status s = t.submit(0, makeDesc("a", 2, DataType::kFloat32, {2}), kT0, &ready);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("already has a tensor of that name in flight"), std::string::npos);
  ASSERT_TRUE(t.submit(1, makeDesc("a", 3, DataType::kFloat32, {2}), kT0, &ready).isOk());
  ASSERT_TRUE(ready);
  EXPECT_TRUE(ready->error.isOk());
  EXPECT_EQ(ready->descs[0].handle, 1u);
}

TEST(TensorTable, DrainAllReturnsEveryPendingHandle) {
  TensorTable t(3);
  std::optional<ReadyOp> ready;
  (void)t.submit(0, makeDesc("a", 1, DataType::kFloat32, {2}), kT0, &ready);
  (void)t.submit(2, makeDesc("a", 2, DataType::kFloat32, {2}), kT0, &ready);
  (void)t.submit(1, makeDesc("b", 3, DataType::kFloat32, {2}), kT0, &ready);
  auto drained = t.drainAll();
  EXPECT_EQ(drained.size(), 3u);
  EXPECT_EQ(t.pendingCount(), 0u);
}


// --- join -------------------------------------------------------------------

TEST(TensorTableJoin, PendingNameBecomesReadyWhenTheMissingRankJoins) {
  TensorTable t(3);
  t.setRankOffset(4);
  std::optional<ReadyOp> ready;
  SubmitDesc w0 = makeDesc("w", 10, DataType::kFloat32, {8}), w2 = makeDesc("w", 12, DataType::kFloat32, {8});
  w0.data_bytes = w2.data_bytes = 32;
  w0.data_offset = 4096;
  ASSERT_TRUE(t.submit(0, w0, kT0, &ready).isOk());
  ASSERT_TRUE(t.submit(2, w2, kT0, &ready).isOk());
  EXPECT_FALSE(ready);
  auto out = t.join(1, kT0);
  ASSERT_EQ(out.size(), 1u);
  const ReadyOp& op = out[0];
  EXPECT_TRUE(op.error.isOk());
  EXPECT_EQ(op.absent, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(op.descs[0].handle, 10u);
  EXPECT_EQ(op.descs[1].handle, 0u);  // the joined rank has nothing to complete
  EXPECT_EQ(op.descs[1].data_bytes, 32u);  // the op's size, though the rank has no slot
  EXPECT_EQ(op.descs[1].data_offset, 0u);
  EXPECT_EQ(op.descs[1].shape[0], 8);
  EXPECT_EQ(op.descs[2].handle, 12u);
  EXPECT_EQ(t.pendingCount(), 0u);
  EXPECT_EQ(t.joinedCount(), 1);
}

TEST(TensorTableJoin, AfterJoinNamesNeedOnlyTheOtherRanks) {
  TensorTable t(2);
  std::optional<ReadyOp> ready;
  EXPECT_TRUE(t.join(0, kT0).empty());
  EXPECT_TRUE(t.joined(0));
  ASSERT_TRUE(t.submit(1, makeDesc("g", 7, DataType::kFloat32, {2}), kT0, &ready).isOk());
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->absent, (std::vector<bool>{true, false}));
  EXPECT_TRUE(ready->anyAbsent());
  t.resetJoined();
  EXPECT_FALSE(t.joined(0));
  ASSERT_TRUE(t.submit(1, makeDesc("h", 8, DataType::kFloat32, {2}), kT0, &ready).isOk());
  EXPECT_FALSE(ready);  // rank 0 takes part again
}

TEST(TensorTableJoin, OtherCollectivesFailNamingTheJoinedRanks) {
  TensorTable t(3);
  t.setRankOffset(2);
  std::optional<ReadyOp> ready;
  SubmitDesc b = makeDesc("bc", 5, DataType::kFloat32, {4});
  b.collective = static_cast<uint8_t>(CollectiveType::kBroadcast);
  ASSERT_TRUE(t.submit(1, b, kT0, &ready).isOk());
  EXPECT_TRUE(t.join(0, kT0).empty());
  auto out = t.join(2, kT0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error.code(), Code::kInvalidArgument);
  EXPECT_EQ(out[0].error.message(),
            "broadcast of tensor 'bc' cannot run while ranks 2, 4 have joined (kolo_join): until every rank has "
            "joined, only allreduce goes on (the joined ranks contribute zeros); allgather is not supported with "
            "join, as in Horovod (DistributedOptimizer: sparse_as_dense=True).");
}

TEST(TensorTableJoin, AllgatherFailsWithAbsentRanksAsInHorovod) {
  TensorTable t(2);
  std::optional<ReadyOp> ready;
  SubmitDesc g = makeDesc("ag", 5, DataType::kInt32, {3, 2});
  g.collective = static_cast<uint8_t>(CollectiveType::kAllgather);
  ASSERT_TRUE(t.submit(0, g, kT0, &ready).isOk());
  auto out = t.join(1, kT0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error.code(), Code::kInvalidArgument);
  EXPECT_NE(out[0].error.message().find("allgather of tensor 'ag' cannot run while rank 1 has joined"),
            std::string::npos)
      << out[0].error.message();
}

TEST(TensorTableJoin, JoiningTwiceChangesNothing) {
  TensorTable t(2);
  EXPECT_TRUE(t.join(0, kT0).empty());
  EXPECT_TRUE(t.join(0, kT0).empty());
  EXPECT_EQ(t.joinedCount(), 1);
}

// --- grouped allreduce --------------------------------------------------------

SubmitDesc grouped(const std::string& name, uint64_t handle, uint64_t gid, uint32_t size, uint64_t hash) {
  SubmitDesc d = makeDesc(name, handle, DataType::kFloat32, {4});
  d.group_id = gid;
  d.group_size = size;
  d.group_hash = hash;
  return d;
}

TEST(TensorTableGroup, MembershipMismatchNamesBothSides) {
  EXPECT_EQ(TensorTable::describeMismatch("a", grouped("a", 1, 2, 3, 9), 0, grouped("a", 2, 2, 2, 9), 1),
            "Mismatched group membership for tensor 'a': rank 0 submitted it in grouped allreduce #2 of 3 tensors, "
            "but rank 1 in grouped allreduce #2 of 2 tensors.");
  EXPECT_EQ(TensorTable::describeMismatch("a", grouped("a", 1, 2, 3, 9), 0, makeDesc("a", 2, DataType::kFloat32, {4}), 1),
            "Mismatched group membership for tensor 'a': rank 0 submitted it in grouped allreduce #2 of 3 tensors, "
            "but rank 1 on its own (not in a grouped allreduce).");
  EXPECT_EQ(TensorTable::describeMismatch("a", grouped("a", 1, 2, 2, 9), 4, grouped("a", 2, 2, 2, 8), 5),
            "Mismatched group membership for tensor 'a': ranks 4 and 5 grouped it (grouped allreduce #2 of 2 "
            "tensors) with different tensors.");
  EXPECT_EQ(TensorTable::describeMismatch("a", grouped("a", 1, 2, 2, 9), 4, grouped("a", 2, 2, 2, 9), 5), "");
}

TEST(TensorTableGroup, TakeGroupRemovesThePendingMembersOfThatGroupOnly) {
  TensorTable t(2);
  std::optional<ReadyOp> ready;
  ASSERT_TRUE(t.submit(0, grouped("b", 1, 3, 2, 7), kT0, &ready).isOk());
  ASSERT_TRUE(t.submit(1, grouped("c", 2, 3, 2, 8), kT0, &ready).isOk());
  ASSERT_TRUE(t.submit(0, grouped("d", 3, 4, 2, 7), kT0, &ready).isOk());
  auto out = t.takeGroup(3, kT0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(t.pendingCount(), 1u);
  for (const ReadyOp& op : out) {
    EXPECT_TRUE(op.anyAbsent());  // the rank that never submitted it has nothing to complete
  }
}

}  // namespace
}  // namespace kolo
