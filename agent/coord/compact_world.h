// The agent's view of a compact brief World. For a job of more agents than
// the coordinator's --brief-world-slots, the World an agent watches lists
// no slots (coordinator/membership/job.h): only the agents' local sizes by
// cross rank and, in this agent's copy, its own slot (World.self).
#pragma once

#include <string>

#include "agent/core/job.h"
#include "common/status.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo {

// Fills `jw` (cross_size, local_sizes, read from World.local_sizes or its
// run-length form World.local_size_runs, rank_offsets as their prefix sums,
// and this agent's rank_offset and cross_rank) from a compact World. `found`
// is false when the World has no self or another agent's (this agent is not
// in the generation). INTERNAL, naming the job, when the self contradicts
// the sizes (cross rank out of range, rank offset or local size that differ)
// or the sizes do not add up to world_size (or runs that are not (count >
// 0, size) pairs). The agents' names are not sent:
// jw.agents holds "at cross rank k" for each but this agent ("lost node at
// cross rank 3: ...").
Status compactJobWorld(const coord::World& world, const std::string& agent_id, JobWorld* jw,
                       bool* found);

}  // namespace kolo
