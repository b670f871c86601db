// Host-side planning for the GPU kernels: pure logic, built in every
// configuration (also without CUDA) so that it is unit-tested everywhere.
//
//  - planVectorSplit: how a reduction over k buffers splits into a scalar
//    head (up to the first 16-byte boundary), a body of 16-byte vectors and a
//    scalar tail. Vector loads need every buffer at the same offset modulo 16.
//  - planBatchedCopy: many (src, dst, bytes) segments cut into work items of
//    at most `chunk_bytes` (one thread block each), packed into launches of at
//    most `max_items` items (the items travel as kernel parameters, so no
//    descriptor upload and no host synchronisation is needed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kolo::gpu {

constexpr size_t kVectorBytes = 16;
// The batched copy kernel's launch geometry (batched_copy.h): work items per
// launch (they travel in the kernel parameters) and bytes per item.
constexpr size_t kMaxCopyItemsPerLaunch = 128;
constexpr size_t kDefaultCopyChunkBytes = 64 * 1024;

struct VectorSplit {
  size_t head = 0;     // scalar elements before the first aligned vector
  size_t vectors = 0;  // 16-byte vectors after the head
  size_t tail = 0;     // scalar elements after the vectors
  size_t elems_per_vector = 1;
  bool vectorized() const { return vectors > 0; }
};

// `addrs`: the addresses of every source and destination buffer. When they
// do not all share the same offset modulo 16 (or that offset is not a whole
// number of elements), everything is scalar: head = count.
VectorSplit planVectorSplit(const uintptr_t* addrs, int naddrs, size_t count, size_t elem_bytes);

struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
};

// One thread block's share: a piece of one segment (device addresses).
struct CopyItem {
  uintptr_t src = 0;
  uintptr_t dst = 0;
  uint64_t bytes = 0;
};

struct CopyLaunch {
  std::vector<CopyItem> items;  // 1..max_items items, each 1..chunk_bytes bytes
};

// Empty segments are skipped; an empty result means nothing to launch.
// InvalidArgument for chunk_bytes < 16, max_items < 1, a null pointer with
// bytes > 0, or overlapping source and destination within a segment.
StatusOr<std::vector<CopyLaunch>> planBatchedCopy(const std::vector<CopySegment>& segments,
                                                  size_t chunk_bytes, size_t max_items);

}  // namespace kolo::gpu
