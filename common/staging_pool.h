// Staging buffers for the agent's collectives (the locally reduced tensor
// before it crosses agents, fused buffers, gather/scatter staging): 64-byte
// aligned, reused across operations.
//
// Why a pool: glibc serves blocks of 32 MiB and more with a fresh mmap and
// unmaps them on free, so a new buffer per operation page-faults every 4 KiB
// of it again, each time (measured: ~16,600 faults per 64 MiB allreduce
// across agents, 40% of the agent's reduction time in fault and unmap code).
// The pool keeps released buffers of 1 MiB and up, by size class (four
// classes per power of two, so at most 25% slack), up to a cap on the
// bytes it holds (KOLO_STAGING_CACHE_MB, default 1024); smaller buffers go
// straight to malloc. Thread-safe: buffers are taken on the agent loop and
// often released from a backend's thread.
#pragma once

#include <cstddef>
#include <memory>

namespace kolo::staging {

using Buffer = std::unique_ptr<char[], void (*)(char*)>;

// At least `bytes` (rounded up to 64), 64-byte aligned, contents undefined.
// Aborts with a message when memory is exhausted (as operator new would).
Buffer acquire(size_t bytes);
// The same, owned by a shared_ptr (for buffers several callbacks hold).
std::shared_ptr<char> acquireShared(size_t bytes);

struct Stats {
  size_t cached_bytes = 0;  // held for reuse
  size_t hits = 0, misses = 0;
};
Stats stats();
// Frees everything held for reuse (tests; memory pressure).
void trim();

}  // namespace kolo::staging
