// Fusion on the GPU: many (src, dst, bytes) device copies in one kernel
// launch (copy-in of small tensors into the fusion buffer and copy-out of the
// results), instead of one cudaMemcpyAsync each. Segments are cut into work
// items of `chunk_bytes` (one thread block each) by planBatchedCopy; up to
// kMaxCopyItemsPerLaunch items ride in the kernel parameters, so a launch
// needs no descriptor upload and no host synchronisation. Within an item the
// copy uses 16-byte vectors when source and destination share their offset
// modulo 16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "agent/gpu/plan.h"
#include "common/status.h"

namespace kolo::gpu {

// Enqueues the copies on `stream`; returns the number of kernel launches.
StatusOr<int> batchedCopy(const std::vector<CopySegment>& segments, cudaStream_t stream,
                          size_t chunk_bytes = kDefaultCopyChunkBytes);

namespace testing {
// The kernel's per-item code run on the CPU over host buffers, block after
// block and thread after thread (tests without a GPU).
StatusOr<int> batchedCopyOnHost(const std::vector<CopySegment>& segments,
                                size_t chunk_bytes = kDefaultCopyChunkBytes);
}  // namespace testing

}  // namespace kolo::gpu
