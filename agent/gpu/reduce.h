// The local reduction on the GPU: k device buffers (the local ranks' slots,
// IPC-mapped into the agent) reduced into one or more outputs, on a stream.
// Semantics are those of common/reduce.h, bit for bit:
//   r = OP over j of (pre * src_j[i]);  result = post * r  -> every dsts[d]
// float16/bfloat16 accumulate in float32 (rounded once at the end, RNE),
// float32 in float32, float64 in float64, integers in their own type with
// wrap-around; scale factors as common/reduce.cc (Horovod's: float by the
// factor rounded to float, integers in double, truncated; a prescaled
// 16-bit input rounded back to its type).
// Sources are combined in order 0..k-1 with no fused multiply-add, so the
// result equals the CPU path's. Average is the caller's: pass kSum and fold
// 1/size into `postscale`. Outputs may alias sources (same element index).
//
// Loads and stores are 16-byte vectors when every buffer has the same offset
// modulo 16 (agent/gpu/plan.h), with scalar head and tail.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/dtype.h"
#include "common/status.h"

namespace kolo::gpu {

constexpr int kMaxReduceSources = 16;
constexpr int kMaxReduceOutputs = 8;

Status launchReduce(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                    void* const* dsts, int ndst, size_t count, double prescale, double postscale,
                    cudaStream_t stream);

namespace testing {
// The kernel's own code (reduce.cu's __host__ __device__ body), run on the
// CPU over host buffers as `threads` grid-stride threads one after another:
// same arguments, checks and vector split as launchReduce. For tests on
// machines without a GPU; not for production use.
Status reduceOnHost(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                    void* const* dsts, int ndst, size_t count, double prescale, double postscale,
                    int threads);
}  // namespace testing

}  // namespace kolo::gpu
