// Fusion planner (pure logic, loop thread): packs consecutive compatible
// ready entries into fusion buffers, as Horovod's Tensor Fusion does.
//
// Rules (Horovod's FuseResponses, in our words):
//  - allreduce and reducescatter entries fuse when collective, dtype, reduce
//    op, prescale, postscale, device and process set all match; allgather
//    entries fuse on collective, dtype, device and process set (op and
//    scale factors mean nothing there). Nothing else ever fuses.
//  - Each entry's offset in the buffer is aligned to `alignment` bytes, and
//    the aligned total stays <= the threshold. An entry larger than the
//    threshold goes alone; threshold 0 disables fusion (every entry alone).
//  - Look-ahead: while building a group, entries that cannot join it are
//    skipped as long as fused + skipped bytes <= threshold, so that mixed
//    dtypes (mixed precision) do not break fusion up. Skipped entries start
//    the following groups, in their original order.
// Groups come out ordered by their first entry; entries inside a group keep
// their input order. The plan is a pure function of its input, so every
// agent that sees the same ordered list makes the same plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace kolo::fusion {

constexpr uint64_t kDefaultFusionThresholdBytes = 128ull << 20;  // 128 MiB (Horovod's default)
constexpr uint64_t kFusionAlignment = 64;                       // one cache line / AVX-512 vector

struct FusionEntry {
  std::string name;
  CollectiveType collective = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int device = -1;          // CUDA device ordinal, -1 = host memory
  int32_t process_set = 0;
  // Bytes the entry occupies in the fusion buffer: the tensor for allreduce
  // and reducescatter, the gathered output (all ranks) for allgather.
  uint64_t bytes = 0;
};

struct FusionOptions {
  uint64_t threshold_bytes = kDefaultFusionThresholdBytes;  // 0 disables fusion
  uint64_t alignment = kFusionAlignment;                    // power of two
  // Entries of at least this many bytes are never fused (0: no limit): for
  // them the copies into and out of the buffer cost more than the
  // per-collective latency fusion saves.
  uint64_t max_entry_bytes = 0;
};

struct FusedSlot {
  size_t index = 0;     // position in the planner's input
  uint64_t offset = 0;  // byte offset inside the fusion buffer (aligned)
  uint64_t bytes = 0;
};

struct FusedGroup {
  std::vector<FusedSlot> slots;
  uint64_t buffer_bytes = 0;  // end of the last slot (= bytes needed in the fusion buffer)
  // A single entry needs no fusion buffer: it is reduced in place.
  bool fused() const { return slots.size() > 1; }
};

// True for the collectives that may share a fusion buffer.
bool isFusable(CollectiveType c);
// True when b may join a group that a started.
bool compatible(const FusionEntry& a, const FusionEntry& b);
// Rounds v up to a multiple of `alignment` (a power of two).
constexpr uint64_t alignUp(uint64_t v, uint64_t alignment) {
  return (v + alignment - 1) & ~(alignment - 1);
}

std::vector<FusedGroup> planFusion(std::span<const FusionEntry> entries,
                                   const FusionOptions& options = {});

}  // namespace kolo::fusion
