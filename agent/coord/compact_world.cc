#include "agent/coord/compact_world.h"

#include <cstdint>

namespace kolo {

Status compactJobWorld(const coord::World& world, const std::string& agent_id, JobWorld* jw,
                       bool* found) {
  *found = false;
  const std::string where = "the coordinator's World for job " + world.job_id() + " (generation " +
                            std::to_string(world.generation()) + ")";
  jw->agents.clear();
  jw->rank_offsets.clear();
  jw->local_sizes.clear();
  int64_t offset = 0;
  // One agent of `n` ranks at the next cross rank.
  auto add = [&](int n) -> Status {
    const size_t k = jw->local_sizes.size();
    if (n <= 0) {
      return internalError(where + " gives cross rank " + std::to_string(k) + " " +
                           std::to_string(n) + " ranks");
    }
    // Every agent has a rank: more agents than the world's ranks is a bad World.
    if (offset + n > world.world_size()) {
      return internalError(where + ": its agents' ranks pass its world size " +
                           std::to_string(world.world_size()) + " at cross rank " +
                           std::to_string(k));
    }
    jw->agents.push_back("at cross rank " + std::to_string(k));
    jw->rank_offsets.push_back(static_cast<int>(offset));
    jw->local_sizes.push_back(n);
    offset += n;
    return okStatus();
  };
  if (world.local_size_runs_size() > 0) {
    if (world.local_size_runs_size() % 2 != 0 || world.local_sizes_size() > 0) {
      return internalError(where + " carries " + std::to_string(world.local_size_runs_size()) +
                           " local-size run numbers" +
                           (world.local_sizes_size() > 0 ? " and local sizes" : "") +
                           " (expected (count, local size) pairs alone)");
    }
    for (int r = 0; r < world.local_size_runs_size(); r += 2) {
      const int count = world.local_size_runs(r);
      if (count <= 0) {
        return internalError(where + " repeats a local size " + std::to_string(count) + " times");
      }
      for (int i = 0; i < count; ++i) {
        if (Status st = add(world.local_size_runs(r + 1)); !st.isOk()) return st;
      }
    }
  } else {
    for (int k = 0; k < world.local_sizes_size(); ++k) {
      if (Status st = add(world.local_sizes(k)); !st.isOk()) return st;
    }
  }
  jw->cross_size = static_cast<int>(jw->local_sizes.size());
  if (offset != world.world_size()) {
    return internalError(where + ": its agents' ranks add up to " + std::to_string(offset) +
                         ", not its world size " + std::to_string(world.world_size()));
  }
  if (!world.has_self() || world.self().agent().agent_id() != agent_id) return okStatus();
  const coord::AgentSlot& self = world.self();
  const int k = self.cross_rank();
  if (k < 0 || k >= jw->cross_size) {
    return internalError(where + " puts this agent at cross rank " + std::to_string(k) + " of " +
                         std::to_string(jw->cross_size));
  }
  if (self.rank_offset() != jw->rank_offsets[k] || self.local_size() != jw->local_sizes[k]) {
    return internalError(where + " gives this agent ranks " + std::to_string(self.rank_offset()) +
                         " + " + std::to_string(self.local_size()) + " at cross rank " +
                         std::to_string(k) + ", but its sizes say " +
                         std::to_string(jw->rank_offsets[k]) + " + " +
                         std::to_string(jw->local_sizes[k]));
  }
  jw->agents[k] = self.agent().agent_id() + " (host " + self.agent().hostname() + ")";
  jw->rank_offset = self.rank_offset();
  jw->cross_rank = k;
  *found = true;
  return okStatus();
}

}  // namespace kolo
