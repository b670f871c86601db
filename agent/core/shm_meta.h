// Metadata a trainer leaves for the agent in its shared arena, ahead of an
// op's output region (common/ipc_layout.h): allgather's list of every
// rank's first dimension, alltoall's split matrix. The trainer can rewrite
// that memory at any time, so the agent copies it once, at submission, into
// memory of its own (held with the op in the tensor table), checks the copy,
// and from then on uses only the copy (docs/security.md, "Shared memory the
// trainer can write"). Pure logic, fuzzed by kolo_fuzz_shm.
#pragma once

#include <cstdint>
#include <vector>

#include "common/ipc_layout.h"
#include "common/status.h"

namespace kolo {

// Copies `count` int64 values from shared memory into agent memory.
std::vector<int64_t> copyShmMeta(const char* src, size_t count);

// Bytes of one first-dimension row of `d` (dtype size times the other
// dimensions; the descriptor was validated, so this does not overflow).
uint64_t rowBytesOf(const SubmitDesc& d);

// Global rank `me`'s allgather: `dims` (world entries, the private copy)
// lists its own first dimension, no negative one, and sums (without
// overflow) to the rows its output region holds after the prefix.
Status checkAllgatherSizes(const SubmitDesc& d, int world, int me,
                           const std::vector<int64_t>& dims);

// Global rank `me`'s alltoall: in `m` (world x world, the private copy) its
// row sums to its first dimension and its column, times the row size, to its
// output region after the prefix; no split is negative; no sum overflows.
Status checkAlltoallSplits(const SubmitDesc& d, int world, int me, const std::vector<int64_t>& m);

// The byte ranges one node's execution of an alltoall derives from the
// (checked, identical) split matrix `m`: local rank i (global base + i)
// sends bytes [src_off, +bytes) of its input to local rank j's output at
// dst_off (after the prefix). Every range lies inside what ranks i and j
// checked with checkAlltoallSplits.
struct AlltoallCopy {
  int src_local;
  int dst_local;
  uint64_t src_off;
  uint64_t dst_off;
  uint64_t bytes;
};
std::vector<AlltoallCopy> alltoallLocalCopies(const std::vector<int64_t>& m, int world, int base,
                                              int k, uint64_t row);

}  // namespace kolo
