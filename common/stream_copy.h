// Copies between a process's memory and the shared arena that bypass the
// cache for large sizes.
//
// A tensor copied into the arena is read next by the agent (another core,
// another process), and a result copied out is read by the training step
// much later; neither copy's destination is worth keeping in this core's
// cache. An ordinary memcpy below glibc's non-temporal threshold (about
// three quarters of the last-level cache) first reads every destination
// line it writes (write-allocate): 3 bytes of memory traffic per byte
// copied instead of 2. The gradients of a real model are mostly 1-16 MiB
// tensors, exactly that range: BERT-large's step copied 25% slower than one
// flat buffer of the same bytes (docs/benchmarks.md at commit 9d76b28, "Model step,
// 2026-11-25"). streamCopy writes with non-temporal stores from
// kStreamCopyMinBytes up and ends with a store fence, so the bytes are
// globally visible before the caller publishes them (ring push, doorbell).
#pragma once

#include <cstddef>

namespace kolo {

// Below this, memcpy (the destination is likely read soon, while cached).
inline constexpr size_t kStreamCopyMinBytes = size_t{1} << 20;

// memcpy semantics (no overlap); non-temporal stores from
// kStreamCopyMinBytes up on x86-64, memcpy elsewhere.
void streamCopy(void* dst, const void* src, size_t bytes);

// What libkolo's copies into and out of the arena may leave in the
// last-level cache: a quarter of it (the other ranks' tensors, the agent's
// reads and the results share it), at least kStreamCopyMinBytes (also when
// the size is unknown) and at most kStreamCopyMaxBudget. 8 MiB on a 32 MiB
// L3.
inline constexpr size_t kStreamCopyMaxBudget = size_t{16} << 20;
size_t streamCopyCacheBudget();

// A copy between a trainer's tensor and the arena while `node_bytes` are in
// flight on this node, this copy included (libkolo estimates them as its
// own collectives in flight times the node's ranks, which share the L3):
// non-temporal (as streamCopy) only when the copy is at least
// kStreamCopyMinBytes and `node_bytes` pass streamCopyCacheBudget(). A
// lone 1-4 MiB allreduce then stays in the cache for the agent's reduction
// and the result's reader (1 MiB at N=2 went from 2.2 to ~5 GB/s busbw on
// the AMD VM); a model step's gradients submitted together (hundreds of
// MB) still bypass it.
void arenaCopy(void* dst, const void* src, size_t bytes, size_t node_bytes);

}  // namespace kolo
