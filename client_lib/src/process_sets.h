// Process sets on the client side (pure logic, no I/O).
//
// A process set is run as a job of its own: its members open a second
// connection to their agent, for the job "<job id>.ps<N>", with the set's
// size as world size and their rank among the set's members on this node as
// local rank. The coordinator seals that job over the agents hosting
// members, in the same agent order as the parent job, so the set's ranks
// are its members' global ranks in ascending order. Everything a job has
// (negotiation, response cache, fusion, its own agent ring, mismatch
// checks, timeline, stall reports) comes with it, and two sets never wait
// for each other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client_options.h"
#include "common/status.h"

namespace kolo {

struct WorldView;

namespace process_sets {

// Sorts `ranks` and checks them against the job size: non-empty, each in
// [0, size), no duplicates. Errors name the offending rank.
Status normalize(std::vector<int>* ranks, int world_size);

// "0, 2, 5" (at most 16 ranks, then "... (N in all)").
std::string describe(const std::vector<int>& ranks);

// A 62-bit digest of (id, ranks) that the ranks compare when they agree on
// a new set (so both the list and the order of add calls must match).
uint64_t digest(int32_t id, const std::vector<int>& ranks);

// The job id of set `id` of `job_id`.
std::string subJobId(const std::string& job_id, int32_t id);

// Position of `global_rank` in the (sorted) set, or -1.
int rankInSet(const std::vector<int>& ranks, int global_rank);

// The options of this rank's connection for the set: the parent's, with the
// set's job id and world size and this rank's place among the members on
// its node (the ranks rank - local_rank .. + local_size - 1). Fails if this
// rank is not a member.
StatusOr<ClientOptions> memberOptions(const ClientOptions& parent, const WorldView& w, int32_t id,
                                      const std::vector<int>& ranks);

}  // namespace process_sets
}  // namespace kolo
