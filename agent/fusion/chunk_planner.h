// Chunk planner: splits a buffer into pieces for pipelining (copy-in,
// local reduce, cross-agent transfer and copy-out of successive chunks
// overlap). Every chunk but the last has the same size, a multiple of the
// element size and, when the chunk is at least 64 bytes, of 64 bytes, so
// vectorized reduction of each chunk stays aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kolo::fusion {

struct Chunk {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// total_bytes must be a multiple of element_size (1, 2, 4 or 8 in practice).
// max_chunk_bytes == 0 means "no limit" (one chunk). A zero-byte buffer
// gives no chunks.
StatusOr<std::vector<Chunk>> planChunks(uint64_t total_bytes, uint64_t max_chunk_bytes,
                                        size_t element_size);

}  // namespace kolo::fusion
