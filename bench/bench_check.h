// Data for kolo-bench's check (-c 1): rank r's input element i is a small
// integer chosen so that every partial result of the reduction is exactly
// representable in the dtype, so the expected result is exact and every
// element of the output is compared with it.
//
//   base(i) = (i % m) + 1, m <= 7 chosen so the result fits the dtype
//   sum, min, max: input = (r+1) * base(i)   -> n(n+1)/2 * base, base, n * base
//   average:       input = (2r+1) * base(i)  -> n * base (the sum n^2 * base is exact)
//   product:       input = 2 if (i + r) % 3 == 0 else 1 -> 2^(ranks with a 2)
//
// When n is so large that even m = 1 overflows (e.g. bfloat16 sums beyond
// ~22 ranks), every rank contributes base(i) and, if that does not fit
// either, the check is not feasible (feasible == false).
//
// Average is the one op whose result is not exact by construction: the agent
// multiplies by 1/n, so floating-point results may be off by a couple of
// units in the last place and integer results (truncated toward zero) by 1.
// The check allows exactly that much for average and nothing for the others.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kolo::bench {

struct CheckPattern {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int nranks = 1;
  int modulus = 7;           // m
  bool rank_weights = true;  // false: every rank contributes base(i)
  bool feasible = true;

  static CheckPattern make(DataType dtype, ReduceOp op, int nranks);

  double input(int rank, uint64_t i) const;
  double expected(uint64_t i) const;
  // Largest |result - expected| accepted for this element.
  double tolerance(double expected) const;
};

// Writes rank `rank`'s input into buf (count elements of pattern.dtype).
void fillInput(const CheckPattern& p, int rank, void* buf, uint64_t count);
// Writes `value` into every element (to poison an output before a check).
void fillValue(DataType dtype, void* buf, uint64_t count, double value);
// Number of elements of buf that differ from the expected result, buf[k]
// holding element `first + k` of the result (reducescatter: rank r's block
// starts at r * count).
uint64_t countWrong(const CheckPattern& p, const void* buf, uint64_t count, uint64_t first = 0);

// Allgather, broadcast and alltoall move data without reducing it. Element i
// of the block that rank `src` sends to rank `dst` (dst = 0 for allgather and
// broadcast, whose one block goes to everyone) is
//
//   movedValue(src, dst, i) = ((i + 3 src + 5 dst) % L) + 1,  L = min(251, exact limit)
//
// (L = 127 for int8), exact in every dtype. A block from the wrong rank, for
// the wrong rank, or shifted within the output does not match.
int movedPeriod(DataType dtype);
double movedValue(DataType dtype, int src, int dst, uint64_t i);
void fillMoved(DataType dtype, int src, int dst, void* buf, uint64_t count);
// Number of elements of buf (count of them) that differ from the block src sent to dst.
uint64_t countWrongMoved(DataType dtype, int src, int dst, const void* buf, uint64_t count);

// Largest integer magnitude the dtype holds exactly (and without overflow).
double exactIntegerLimit(DataType dtype);

}  // namespace kolo::bench
