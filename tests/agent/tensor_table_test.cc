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

}  // namespace
}  // namespace kolo
