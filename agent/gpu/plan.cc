#include "agent/gpu/plan.h"

#include <algorithm>
#include <string>

namespace kolo::gpu {

VectorSplit planVectorSplit(const uintptr_t* addrs, int naddrs, size_t count, size_t elem_bytes) {
  VectorSplit s;
  s.head = count;
  if (elem_bytes == 0 || elem_bytes > kVectorBytes || kVectorBytes % elem_bytes != 0 || naddrs < 1)
    return s;
  s.elems_per_vector = kVectorBytes / elem_bytes;
  const uintptr_t mis = addrs[0] % kVectorBytes;
  for (int i = 1; i < naddrs; ++i) {
    if (addrs[i] % kVectorBytes != mis) return s;
  }
  if (mis % elem_bytes != 0) return s;
  const size_t head = std::min(count, ((kVectorBytes - mis) % kVectorBytes) / elem_bytes);
  const size_t rest = count - head;
  s.head = head;
  s.vectors = rest / s.elems_per_vector;
  s.tail = rest - s.vectors * s.elems_per_vector;
  return s;
}

StatusOr<std::vector<CopyLaunch>> planBatchedCopy(const std::vector<CopySegment>& segments,
                                                  size_t chunk_bytes, size_t max_items) {
  if (chunk_bytes < kVectorBytes)
    return invalidArgument("batched copy: chunk_bytes must be >= 16, got " +
                           std::to_string(chunk_bytes));
  if (max_items < 1) return invalidArgument("batched copy: max_items must be >= 1");
  std::vector<CopyLaunch> launches;
  for (size_t i = 0; i < segments.size(); ++i) {
    const CopySegment& seg = segments[i];
    if (seg.bytes == 0) continue;
    if (seg.src == nullptr || seg.dst == nullptr)
      return invalidArgument("batched copy: segment " + std::to_string(i) + " has a null pointer");
    const auto src = reinterpret_cast<uintptr_t>(seg.src);
    const auto dst = reinterpret_cast<uintptr_t>(seg.dst);
    if (src < dst + seg.bytes && dst < src + seg.bytes && src != dst)
      return invalidArgument("batched copy: segment " + std::to_string(i) +
                             " has overlapping source and destination");
    for (size_t off = 0; off < seg.bytes; off += chunk_bytes) {
      if (launches.empty() || launches.back().items.size() == max_items) launches.emplace_back();
      launches.back().items.push_back(
          {src + off, dst + off, static_cast<uint64_t>(std::min(chunk_bytes, seg.bytes - off))});
    }
  }
  return launches;
}

}  // namespace kolo::gpu
