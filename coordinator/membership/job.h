// One job: who joined with how many ranks, and the sealed generation.
// Plain data plus the pure functions that seal it and describe it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/membership/agent_registry.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator {

struct JobMember {
  std::string agent_id;
  coord::AgentInfo info;  // as registered when it joined (used once the agent is gone)
  int32_t local_size = 0;
  bool left = false;  // left the RUNNING job cleanly (its part is done)
};

struct Job {
  std::string id;
  std::string token;
  int32_t world_size = 0;
  coord::JobState state = coord::FORMING;
  uint64_t generation = 0;              // 0 while FORMING; 1 once sealed
  std::vector<JobMember> members;       // in join order
  std::vector<coord::AgentSlot> slots;  // the sealed order (empty while FORMING)
  std::string reason;                   // why it FAILED
  int64_t created_wall_ms = 0;
  int64_t ended_steady_ms = -1;  // when it became FAILED/FINISHED
  int64_t ended_wall_ms = -1;    // the same on the wall clock (survives a restart)
  // Elastic jobs (min_size > 0): members lost while RUNNING are removed and
  // the remaining ones sealed as the next generation; world_size is then the
  // current generation's size.
  int32_t min_size = 0;
  int32_t max_size = 0;             // 0: no limit
  int64_t elastic_timeout_ms = 0;
  std::string change;               // what sealed the current generation
  int64_t below_min_since_ms = -1;  // steady ms since the job has < min_size ranks (-1: not)
  int64_t below_min_wall_ms = -1;   // the same on the wall clock (journaled)
  // Agents that joined the RUNNING elastic job, admitted at its next commit
  // (or kAdmitWithoutCommitMs after the first one came).
  std::vector<JobMember> waiting;
  int64_t waiting_since_ms = -1;  // steady (not journaled: a restart starts the wait again)

  bool ended() const { return state == coord::FAILED || state == coord::FINISHED; }
  bool active() const { return state == coord::FORMING || state == coord::RUNNING; }
  bool elastic() const { return min_size > 0; }
  int32_t joinedRanks() const;
  JobMember* findMember(const std::string& agent_id);
  const JobMember* findMember(const std::string& agent_id) const;
};

// Orders the members by (hostname, agent_id), assigns cumulative rank
// offsets and cross ranks, and moves the job to RUNNING at generation 1.
// Every member must be in `agents`.
void sealJob(Job& job, const AgentRegistry& agents);
// Elastic: seals the next generation over the current members (world_size
// becomes their ranks), recording `change`.
void resealJob(Job& job, const AgentRegistry& agents, std::string change);

// The slots that describe the job now: the sealed order once sealed; while
// FORMING the joined agents in the same deterministic order with
// rank_offset and cross_rank -1 (not assigned yet).
std::vector<coord::AgentSlot> currentSlots(const Job& job, const AgentRegistry& agents);

// Brief Worlds (what an agent acts on, WatchJobRequest.brief): the slots
// without rpc_address and data_address, listed only while RUNNING, and for
// a job of more than `slots_max` agents not listed at all: the compact form
// carries the agents' local sizes by cross rank (World.local_sizes) and
// each watcher's copy its own slot (World.self). A job of N agents pushes
// its World to N watchers at every change: with slots that is O(N^2) bytes
// (4096 agents: ~750 MB per change), compact O(N) bytes per watcher.
inline constexpr int kBriefWorldSlotsDefault = 256;
struct BriefForm {
  int slots_max = kBriefWorldSlotsDefault;
  std::string self_agent_id;  // whose slot World.self carries (compact form)
  bool runs = false;          // compact: World.local_size_runs, not local_sizes
};
// `brief` non-null: the brief form for that watcher.
coord::World worldOf(const Job& job, const AgentRegistry& agents, const BriefForm* brief = nullptr);
// The brief form of a full World, shared by every brief watcher (no self).
coord::World briefWorld(const coord::World& world, int slots_max = kBriefWorldSlotsDefault,
                        bool runs = false);
// Whether `world` is a compact brief World.
inline bool isCompactWorld(const coord::World& world) {
  return world.agents_size() == 0 &&
         (world.local_sizes_size() > 0 || world.local_size_runs_size() > 0);
}
// The bytes that, appended to a serialized compact World, set its self to
// `slot` (protobuf merges concatenated messages).
std::string selfSuffix(const coord::AgentSlot& slot);
void briefSlot(const coord::AgentSlot& slot, coord::AgentSlot* out);
coord::JobSummary summaryOf(const Job& job, const AgentRegistry& agents);

const char* jobStateName(coord::JobState s);

}  // namespace kolo::coordinator
