#include "process_sets.h"

#include <algorithm>

#include "client.h"

namespace kolo::process_sets {

Status normalize(std::vector<int>* ranks, int world_size) {
  if (ranks->empty()) return invalidArgument("a process set needs at least one rank");
  std::sort(ranks->begin(), ranks->end());
  for (size_t i = 0; i < ranks->size(); ++i) {
    int r = (*ranks)[i];
    if (r < 0 || r >= world_size) {
      return invalidArgument("rank " + std::to_string(r) + " is not a rank of this job (ranks 0.." +
                             std::to_string(world_size - 1) + ")");
    }
    if (i > 0 && (*ranks)[i - 1] == r) return invalidArgument("rank " + std::to_string(r) + " is listed twice");
  }
  return Status();
}

std::string describe(const std::vector<int>& ranks) {
  std::string s;
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  if (shown < ranks.size()) s += ", ... (" + std::to_string(ranks.size()) + " in all)";
  return s;
}

uint64_t digest(int32_t id, const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h = (h ^ ((v >> (8 * i)) & 0xffu)) * 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(static_cast<uint32_t>(id)));
  mix(ranks.size());
  for (int r : ranks) mix(static_cast<uint64_t>(static_cast<uint32_t>(r)));
  return h >> 2;
}

std::string subJobId(const std::string& job_id, int32_t id) { return job_id + ".ps" + std::to_string(id); }

int rankInSet(const std::vector<int>& ranks, int global_rank) {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), global_rank);
  if (it == ranks.end() || *it != global_rank) return -1;
  return static_cast<int>(it - ranks.begin());
}

StatusOr<ClientOptions> memberOptions(const ClientOptions& parent, const WorldView& w, int32_t id,
                                      const std::vector<int>& ranks) {
  if (rankInSet(ranks, w.rank) < 0) {
    return invalidArgument("rank " + std::to_string(w.rank) + " is not in process set " + std::to_string(id) +
                           " (ranks " + describe(ranks) + ")");
  }
  const int first = w.rank - w.local_rank;
  const int last = first + w.local_size - 1;
  int local_rank = -1, local_size = 0;
  for (int r : ranks) {
    if (r < first || r > last) continue;
    if (r == w.rank) local_rank = local_size;
    ++local_size;
  }
  ClientOptions o = parent;
  o.job_id = subJobId(parent.job_id, id);
  o.world_size = static_cast<int>(ranks.size());
  o.local_rank = local_rank;
  o.local_size = local_size;
  // A set is not elastic: it is formed over the ranks of one generation
  // (after a membership change the sets are added again).
  o.min_np = 0;
  o.max_np = 0;
  return o;
}

}  // namespace kolo::process_sets
