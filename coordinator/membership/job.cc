#include "coordinator/membership/job.h"

#include <algorithm>
#include <tuple>

namespace kolo::coordinator {

int32_t Job::joinedRanks() const {
  int32_t n = 0;
  for (const JobMember& m : members) n += m.local_size;
  return n;
}

JobMember* Job::findMember(const std::string& agent_id) {
  for (JobMember& m : members) {
    if (m.agent_id == agent_id) return &m;
  }
  return nullptr;
}

const JobMember* Job::findMember(const std::string& agent_id) const {
  return const_cast<Job*>(this)->findMember(agent_id);
}

namespace {

// The members as slots in the deterministic order, offsets not assigned.
std::vector<coord::AgentSlot> orderedSlots(const Job& job, const AgentRegistry& agents) {
  std::vector<coord::AgentSlot> slots;
  slots.reserve(job.members.size());
  for (const JobMember& m : job.members) {
    coord::AgentSlot s;
    const AgentRecord* r = agents.find(m.agent_id);
    *s.mutable_agent() = r != nullptr ? r->info : m.info;
    s.set_local_size(m.local_size);
    s.set_rank_offset(-1);
    s.set_cross_rank(-1);
    slots.push_back(std::move(s));
  }
  std::sort(slots.begin(), slots.end(), [](const coord::AgentSlot& a, const coord::AgentSlot& b) {
    return std::tie(a.agent().hostname(), a.agent().agent_id()) <
           std::tie(b.agent().hostname(), b.agent().agent_id());
  });
  return slots;
}

}  // namespace

void sealJob(Job& job, const AgentRegistry& agents) {
  job.slots = orderedSlots(job, agents);
  int32_t offset = 0;
  for (size_t i = 0; i < job.slots.size(); ++i) {
    job.slots[i].set_rank_offset(offset);
    job.slots[i].set_cross_rank(static_cast<int32_t>(i));
    offset += job.slots[i].local_size();
  }
  job.state = coord::RUNNING;
  job.generation = 1;
}

void resealJob(Job& job, const AgentRegistry& agents, std::string change) {
  uint64_t next = job.generation + 1;
  job.world_size = job.joinedRanks();
  sealJob(job, agents);
  job.generation = next;
  job.change = std::move(change);
  job.below_min_since_ms = -1;
  job.below_min_wall_ms = -1;
}

void briefSlot(const coord::AgentSlot& slot, coord::AgentSlot* out) {
  out->mutable_agent()->set_agent_id(slot.agent().agent_id());
  out->mutable_agent()->set_hostname(slot.agent().hostname());
  out->set_local_size(slot.local_size());
  out->set_rank_offset(slot.rank_offset());
  out->set_cross_rank(slot.cross_rank());
}

namespace {

// The slots of a RUNNING brief World: listed, or compact (local sizes, and
// `self`'s slot when self_agent_id names one of them).
template <typename Slots>
void briefSlots(const Slots& slots, int slots_max, const std::string& self_agent_id, bool runs,
                coord::World* w) {
  if (static_cast<int64_t>(slots.size()) <= slots_max) {
    w->mutable_agents()->Reserve(static_cast<int>(slots.size()));
    for (const coord::AgentSlot& s : slots) briefSlot(s, w->add_agents());
    return;
  }
  if (!runs) w->mutable_local_sizes()->Reserve(static_cast<int>(slots.size()));
  for (const coord::AgentSlot& s : slots) {
    if (!runs) {
      w->add_local_sizes(s.local_size());
    } else if (int n = w->local_size_runs_size();
               n > 0 && w->local_size_runs(n - 1) == s.local_size()) {
      w->set_local_size_runs(n - 2, w->local_size_runs(n - 2) + 1);
    } else {
      w->add_local_size_runs(1);
      w->add_local_size_runs(s.local_size());
    }
    if (!self_agent_id.empty() && s.agent().agent_id() == self_agent_id) {
      briefSlot(s, w->mutable_self());
    }
  }
}

}  // namespace

std::string selfSuffix(const coord::AgentSlot& slot) {
  coord::World w;
  briefSlot(slot, w.mutable_self());
  return w.SerializeAsString();
}

coord::World briefWorld(const coord::World& world, int slots_max, bool runs) {
  coord::World w;
  w.set_job_id(world.job_id());
  w.set_generation(world.generation());
  w.set_state(world.state());
  w.set_world_size(world.world_size());
  if (world.state() == coord::RUNNING) briefSlots(world.agents(), slots_max, "", runs, &w);
  w.set_reason(world.reason());
  w.set_min_size(world.min_size());
  w.set_max_size(world.max_size());
  w.set_change(world.change());
  *w.mutable_waiting_agent_ids() = world.waiting_agent_ids();
  return w;
}

std::vector<coord::AgentSlot> currentSlots(const Job& job, const AgentRegistry& agents) {
  if (job.generation > 0) return job.slots;
  return orderedSlots(job, agents);
}

coord::World worldOf(const Job& job, const AgentRegistry& agents, const BriefForm* brief) {
  coord::World w;
  w.set_job_id(job.id);
  w.set_generation(job.generation);
  w.set_state(job.state);
  w.set_world_size(job.world_size);
  if (brief != nullptr) {
    if (job.state == coord::RUNNING)
      briefSlots(job.slots, brief->slots_max, brief->self_agent_id, brief->runs, &w);
  } else {
    for (auto& s : currentSlots(job, agents)) *w.add_agents() = std::move(s);
  }
  w.set_reason(job.reason);
  w.set_min_size(job.min_size);
  w.set_max_size(job.max_size);
  w.set_change(job.change);
  for (const JobMember& m : job.waiting) w.add_waiting_agent_ids(m.agent_id);
  return w;
}

coord::JobSummary summaryOf(const Job& job, const AgentRegistry& agents) {
  coord::JobSummary s;
  s.set_job_id(job.id);
  s.set_state(job.state);
  s.set_generation(job.generation);
  s.set_world_size(job.world_size);
  s.set_joined_ranks(job.joinedRanks());
  for (auto& slot : currentSlots(job, agents)) *s.add_agents() = std::move(slot);
  s.set_reason(job.reason);
  s.set_created_unix_ms(job.created_wall_ms);
  s.set_min_size(job.min_size);
  s.set_max_size(job.max_size);
  return s;
}

const char* jobStateName(coord::JobState s) {
  switch (s) {
    case coord::FORMING:
      return "FORMING";
    case coord::RUNNING:
      return "RUNNING";
    case coord::FAILED:
      return "FAILED";
    case coord::FINISHED:
      return "FINISHED";
    default:
      return "UNSPECIFIED";
  }
}

}  // namespace kolo::coordinator
