// The device plans of allgather, reducescatter and alltoall
// (agent/gpu/collective_plan.h) executed by the kernels' own code on the
// CPU (testing::batchedCopyOnHost, testing::reduceOnHost; CUDA builds, no
// GPU needed), against the CPU reduction and the host path's layouts: what
// the agent's stream will run for ranks sharing one GPU. Not run on a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "agent/gpu/batched_copy.h"
#include "agent/gpu/collective_plan.h"
#include "agent/gpu/reduce.h"
#include "common/ipc_layout.h"
#include "common/reduce.h"

namespace kolo::gpu {
namespace {

using Bytes = std::vector<unsigned char>;

uintptr_t addr(Bytes& b) { return reinterpret_cast<uintptr_t>(b.data()); }

Bytes randomBytes(size_t n, std::mt19937_64& rng) {
  Bytes b(n);
  for (auto& x : b)
    x = static_cast<unsigned char>(rng() & 0x3F);  // small: no NaN/Inf patterns, no int overflow
  return b;
}

TEST(DeviceCollectiveKernels, ReducescatterEveryDtypeAndOpMatchesTheCpuReduction) {
  std::mt19937_64 rng(5);
  const DataType kTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                             DataType::kFloat64, DataType::kInt8,     DataType::kUint8,
                             DataType::kInt32,   DataType::kInt64};
  const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax};
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (int k : {2, 3, 4}) {
        for (int64_t dim0 : {1, 5, 64}) {
          SCOPED_TRACE("dtype=" + std::to_string(static_cast<int>(t)) +
                       " op=" + std::to_string(static_cast<int>(op)) + " k=" + std::to_string(k) +
                       " dim0=" + std::to_string(dim0));
          const size_t es = dataTypeSize(t);
          const uint64_t cols = 3;
          const size_t n = static_cast<size_t>(dim0) * cols;
          std::vector<Bytes> in, out;
          std::vector<RankSlots> slots;
          for (int r = 0; r < k; ++r) {
            in.push_back(randomBytes(n * es, rng));
            out.emplace_back(static_cast<size_t>(reducescatterRows(dim0, k, r)) * cols * es + es,
                             0xA5);
          }
          for (int r = 0; r < k; ++r) slots.push_back({addr(in[r]), addr(out[r])});
          auto plan = planReducescatter(slots, dim0, cols, es, "t");
          ASSERT_TRUE(plan.isOk()) << plan.status().message();
          // Average as Sum with 1/size, as the agent runs allreduce.
          const ReduceOp kop = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
          const double post = op == ReduceOp::kAverage ? 1.0 / k : 1.0;
          for (const ReduceBlock& b : *plan) {
            std::vector<const void*> srcs;
            for (uintptr_t s : b.srcs) srcs.push_back(reinterpret_cast<const void*>(s));
            void* dst[1] = {reinterpret_cast<void*>(b.dst)};
            ASSERT_TRUE(
                testing::reduceOnHost(t, kop, srcs.data(), k, dst, 1, b.count, 1.0, post, 37)
                    .isOk());
          }
          for (int r = 0; r < k; ++r) {
            const size_t first = static_cast<size_t>(reducescatterRowOffset(dim0, k, r)) * cols;
            const size_t count = static_cast<size_t>(reducescatterRows(dim0, k, r)) * cols;
            std::vector<const void*> hsrc;
            for (int s = 0; s < k; ++s) hsrc.push_back(in[s].data() + first * es);
            Bytes want(count * es);
            void* hdst[1] = {want.data()};
            reduceBlocks(t, kop, hsrc.data(), k, hdst, 1, count, 1.0, post);
            ASSERT_EQ(0, std::memcmp(out[r].data(), want.data(), count * es)) << "rank " << r;
            EXPECT_EQ(out[r][count * es], 0xA5) << "rank " << r << ": written past its block";
          }
        }
      }
    }
  }
}

TEST(DeviceCollectiveKernels, AllgatherAndAlltoallCopiesThroughTheCopyKernelCode) {
  std::mt19937_64 rng(9);
  const uint64_t row = 12;
  // Allgather, uneven with an empty block.
  const std::vector<int64_t> dims{3, 0, 5, 1};
  const int k = static_cast<int>(dims.size());
  std::vector<Bytes> in, out;
  for (int r = 0; r < k; ++r) in.push_back(randomBytes(static_cast<size_t>(dims[r]) * row, rng));
  for (int r = 0; r < k; ++r) out.emplace_back(9 * row, 0);
  std::vector<RankSlots> slots;
  for (int r = 0; r < k; ++r) slots.push_back({addr(in[r]), addr(out[r])});
  auto copies = planAllgatherCopies(slots, dims, row, "g");
  ASSERT_TRUE(copies.isOk()) << copies.status().message();
  ASSERT_TRUE(testing::batchedCopyOnHost(*copies, 16).isOk());
  Bytes want;
  for (int r = 0; r < k; ++r) want.insert(want.end(), in[r].begin(), in[r].end());
  for (int r = 0; r < k; ++r) EXPECT_EQ(out[r], want) << "rank " << r;

  // Alltoall, 3 ranks, uneven splits with empty ones.
  const std::vector<int64_t> splits{1, 0, 2, 0, 0, 0, 4, 1, 0};
  const std::vector<int64_t> adims{3, 0, 5};
  std::vector<Bytes> ain, aout;
  for (int r = 0; r < 3; ++r) ain.push_back(randomBytes(static_cast<size_t>(adims[r]) * row, rng));
  for (int r = 0; r < 3; ++r) aout.emplace_back(8 * row, 0);
  std::vector<RankSlots> aslots;
  for (int r = 0; r < 3; ++r) aslots.push_back({addr(ain[r]), addr(aout[r])});
  auto plan = planAlltoallCopies(aslots, splits, adims, row, "a");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  ASSERT_TRUE(testing::batchedCopyOnHost(plan->copies, 16).isOk());
  for (int d = 0; d < 3; ++d) {
    Bytes w;
    for (int s = 0; s < 3; ++s) {
      int64_t first = 0;
      for (int j = 0; j < d; ++j) first += splits[s * 3 + j];
      w.insert(w.end(), ain[s].begin() + first * row,
               ain[s].begin() + (first + splits[s * 3 + d]) * row);
    }
    EXPECT_EQ(plan->recv_rows[d] * static_cast<int64_t>(row), static_cast<int64_t>(w.size()));
    EXPECT_EQ(0, std::memcmp(aout[d].data(), w.data(), w.size())) << "rank " << d;
  }
}

}  // namespace
}  // namespace kolo::gpu
