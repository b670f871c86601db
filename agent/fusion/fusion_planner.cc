#include "agent/fusion/fusion_planner.h"

#include <cassert>

namespace kolo::fusion {

bool isFusable(CollectiveType c) {
  return c == CollectiveType::kAllreduce || c == CollectiveType::kReducescatter ||
         c == CollectiveType::kAllgather;
}

bool compatible(const FusionEntry& a, const FusionEntry& b) {
  if (!isFusable(a.collective) || a.collective != b.collective) return false;
  if (a.dtype != b.dtype || a.device != b.device || a.process_set != b.process_set) return false;
  if (a.collective == CollectiveType::kAllgather) return true;
  return a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale;
}

std::vector<FusedGroup> planFusion(std::span<const FusionEntry> entries,
                                   const FusionOptions& options) {
  assert(options.alignment != 0 && (options.alignment & (options.alignment - 1)) == 0);
  const uint64_t threshold = options.threshold_bytes;
  std::vector<FusedGroup> groups;
  std::vector<bool> taken(entries.size(), false);

  for (size_t first = 0; first < entries.size(); ++first) {
    if (taken[first]) continue;
    taken[first] = true;
    const FusionEntry& head = entries[first];
    FusedGroup group;
    group.slots.push_back({first, 0, head.bytes});
    uint64_t end = head.bytes;

    auto small = [&](const FusionEntry& e) {
      return options.max_entry_bytes == 0 || e.bytes < options.max_entry_bytes;
    };
    if (threshold > 0 && isFusable(head.collective) && head.bytes <= threshold && small(head)) {
      uint64_t skipped = 0;
      for (size_t j = first + 1; j < entries.size(); ++j) {
        if (taken[j]) continue;
        const FusionEntry& e = entries[j];
        uint64_t offset = alignUp(end, options.alignment);
        if (compatible(head, e) && small(e) && offset + e.bytes <= threshold) {
          group.slots.push_back({j, offset, e.bytes});
          taken[j] = true;
          end = offset + e.bytes;
          continue;
        }
        // Look ahead past entries that do not fit while fused + skipped
        // bytes stay within the threshold.
        skipped += e.bytes;
        if (end + skipped > threshold) break;
      }
    }
    group.buffer_bytes = end;
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace kolo::fusion
