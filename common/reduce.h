// Local reduction kernels (CPU). For each element i:
//   r = OP over j of (pre * src_j[i]);  result = post * r
// written to every dsts[d] (which may alias any src: each block of elements
// is read completely before it is written). Average is the caller's business:
// pass ReduceOp::kSum and fold 1/size into `post`.
//
// Accumulation: float16/bfloat16 in float32, rounded once at the end;
// float32 in float32; float64 in float64; integers in their own type with
// wrap-around (as NCCL does). Scale factors on integers are applied in
// double and truncated toward zero. Loops are written for the compiler's
// auto-vectorizer (contiguous blocks, no aliasing inside a block).
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace kolo {

void reduceBlocks(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                  void* const* dsts, int ndst, size_t count, double prescale, double postscale);

// Scales a buffer in place (used for Average/prescale when there is a single source).
void scaleBuffer(DataType dtype, void* buf, size_t count, double factor);

}  // namespace kolo
