// Planning of allgather, reducescatter and alltoall over device tensors of
// the ranks sharing one GPU on one agent (docs/gpu.md, "The device data
// path"): which bytes go where, as batched-copy segments (planBatchedCopy)
// and reduction blocks (launchReduce). Pure logic on addresses, built in
// every configuration (also without CUDA) and unit-tested everywhere
// (tests/gpu/collective_plan_test.cc). The layouts are the host path's
// (common/ipc_layout.h): allgather's output holds every rank's rows in rank
// order; reducescatter gives rank r the rows reducescatterRowOffset/Rows;
// alltoall's output holds the rows received from rank 0 first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/gpu/plan.h"
#include "common/status.h"

namespace kolo::gpu {

// One local rank's slots in the agent's mapping of its device arena: its
// input and its output (the gathered / scattered / received rows, without
// the host path's size prefix).
struct RankSlots {
  uintptr_t in = 0;
  uintptr_t out = 0;
};

// Byte offsets of each rank's block in the gathered output: offsets[r] =
// (dims[0] + ... + dims[r-1]) * row_bytes; world + 1 entries (the last is
// the output's size). InvalidArgument for a negative first dimension or a
// size that overflows 64 bits.
StatusOr<std::vector<uint64_t>> allgatherOffsets(const std::vector<int64_t>& dims,
                                                 uint64_t row_bytes, const std::string& name);

// Allgather: rank s's input (dims[s] rows) into every rank's output at
// offsets[s]. `slots` has one entry per rank (all ranks on this GPU).
// Empty blocks are skipped; a copy whose source is its destination (in
// place: rank s's input already is its block of its own output) too.
StatusOr<std::vector<CopySegment>> planAllgatherCopies(const std::vector<RankSlots>& slots,
                                                       const std::vector<int64_t>& dims,
                                                       uint64_t row_bytes, const std::string& name);

// Reducescatter: rank r's block of the reduced tensor, in elements.
struct ElemBlock {
  uint64_t offset = 0;
  uint64_t count = 0;
};
// dim0 rows of row_elems elements split over `size` ranks as the host path
// does (dim0 / size each, the first dim0 % size ranks one more).
StatusOr<std::vector<ElemBlock>> reducescatterBlocks(int64_t dim0, uint64_t row_elems, int size,
                                                     const std::string& name);

// One launch of the reduction kernel: every rank's input at the block's
// offset, reduced into rank `rank`'s output.
struct ReduceBlock {
  int rank = 0;
  std::vector<uintptr_t> srcs;  // one per rank, in rank order
  uintptr_t dst = 0;
  uint64_t count = 0;  // elements
};
// Empty blocks are skipped. An output that overlaps any rank's input is
// refused (a later block would read what an earlier one wrote).
StatusOr<std::vector<ReduceBlock>> planReducescatter(const std::vector<RankSlots>& slots,
                                                     int64_t dim0, uint64_t row_elems,
                                                     size_t elem_bytes, const std::string& name);

// Alltoall: splits[s * k + d] rows go from rank s to rank d; rank s's input
// holds dims[s] rows in destination order, which must be the sum of its
// row of the matrix. Rank d receives, from rank 0 first, the rows of column
// d: recv_rows[d] rows in all, recv_splits[d * k + s] = splits[s * k + d]
// (what the host path reports to the client as its receive splits).
struct AlltoallPlan {
  std::vector<CopySegment> copies;
  std::vector<int64_t> recv_rows;
  std::vector<int64_t> recv_splits;
};
StatusOr<AlltoallPlan> planAlltoallCopies(const std::vector<RankSlots>& slots,
                                          const std::vector<int64_t>& splits,
                                          const std::vector<int64_t>& dims, uint64_t row_bytes,
                                          const std::string& name);

}  // namespace kolo::gpu
