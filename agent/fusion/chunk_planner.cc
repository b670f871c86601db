#include "agent/fusion/chunk_planner.h"

#include <algorithm>
#include <string>

namespace kolo::fusion {

StatusOr<std::vector<Chunk>> planChunks(uint64_t total_bytes, uint64_t max_chunk_bytes,
                                        size_t element_size) {
  if (element_size == 0) return invalidArgument("chunk planner: element size is 0");
  if (total_bytes % element_size != 0) {
    return invalidArgument("chunk planner: " + std::to_string(total_bytes) +
                           " bytes is not a whole number of " + std::to_string(element_size) +
                           "-byte elements");
  }
  std::vector<Chunk> chunks;
  if (total_bytes == 0) return chunks;
  uint64_t chunk = max_chunk_bytes == 0 ? total_bytes : max_chunk_bytes;
  constexpr uint64_t kLine = 64;
  if (chunk >= kLine && kLine % element_size == 0) {
    chunk -= chunk % kLine;
  } else {
    chunk -= chunk % element_size;
  }
  if (chunk == 0) chunk = element_size;  // a limit below one element still moves one element
  chunks.reserve(static_cast<size_t>((total_bytes + chunk - 1) / chunk));
  for (uint64_t off = 0; off < total_bytes; off += chunk) {
    chunks.push_back({off, std::min(chunk, total_bytes - off)});
  }
  return chunks;
}

}  // namespace kolo::fusion
