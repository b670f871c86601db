// Elastic jobs on the agent loop (docs/elastic.md).
//
// The coordinator seals generation G+1 when an agent of an elastic job is
// lost, joins, or asks for it (a local trainer restarted). On G+1 the agent
// fails every op of G still in flight with MEMBERSHIP_CHANGED (the text
// names what changed), tears down the job's CrossJob (joining its thread, so
// no buffer is still in use by it), builds the next one over the new agents
// and, once connected, sends the new World to its trainers. The client
// stamps each op with its generation: an op of another generation is
// refused with MEMBERSHIP_CHANGED, so a trainer that has not seen the new
// World yet cannot mix its ops into the new generation.
//
// Between a cross-agent failure (a peer agent died) and the next generation
// the job is suspended: ops fail at once with MEMBERSHIP_CHANGED instead of
// failing the job.
#include <algorithm>
#include <string_view>

#include "agent/agent.h"
#include "common/log.h"

namespace kolo {

namespace {
auto elasticLog() { return log::get("agent.elastic"); }

Status membershipChanged(std::string msg) { return Status(Code::kMembershipChanged, std::move(msg)); }
}  // namespace

void Agent::failInFlightOnLoop(Job& job, const Status& st) {
  for (auto& [local_rank, handle] : job.table().drainAll()) {
    if (ClientConn* c = job.client(local_rank)) completeOnLoop(*c, handle, st);
  }
  for (auto& [gid, ops] : job.held_groups) {
    for (ReadyOp& op : ops) {
      for (size_t r = 0; r < op.descs.size(); ++r) {
        ClientConn* c = job.client(static_cast<int>(r));
        if (c != nullptr && op.descs[r].handle != 0) completeOnLoop(*c, op.descs[r].handle, st);
      }
    }
  }
  job.held_groups.clear();
  job.failed_groups.clear();
  finishJoinOnLoop(job, st, -1);
  stalls_.removeJob(job.id());
}

void Agent::beginGenerationOnLoop(Job& job, uint64_t generation, const std::string& change) {
  const uint64_t old = job.world().generation;
  Status st = membershipChanged("job " + job.id() + ": generation " + std::to_string(generation) + " (" +
                                (change.empty() ? std::string("membership changed") : change) +
                                ") replaced generation " + std::to_string(old) +
                                "; this collective was not completed: submit it again");
  elasticLog()->info("job {}: generation {} -> {}: {}", job.id(), old, generation, change);
  // The CrossJob's destructor joins its thread and fails its backend work:
  // nothing uses the pending buffers after it returns.
  job.cross.reset();
  for (auto& [name, p] : job.cross_pending) {
    if (p.collective != CollectiveType::kJoin) {
      for (size_t r = 0; r < p.handles.size(); ++r) {
        ClientConn* c = job.client(static_cast<int>(r));
        if (c != nullptr && p.handles[r] != 0) completeOnLoop(*c, p.handles[r], st);
      }
    }
    p.handles.clear();
    // Its local step may still be running on the executor: it comes back
    // through onCrossDoneOnLoop with the old generation and is dropped then.
    job.retired.emplace(std::make_pair(job.cross_generation, name), std::move(p));
  }
  job.cross_pending.clear();
  failInFlightOnLoop(job, st);
  job.joins_done = 0;
  job.suspended = okStatus();
}

void Agent::suspendOnLoop(Job& job, const Status& why) {
  if (!job.suspended.isOk()) return;
  Status st = membershipChanged(why.message() + "; waiting for the coordinator to seal the next generation");
  job.suspended = st;
  elasticLog()->warn("job {} generation {} suspended: {}", job.id(), job.world().generation, why.message());
  if (job.cross) job.cross->abort(st);
  failInFlightOnLoop(job, st);
}

bool Agent::retiredDoneOnLoop(Job& job, uint64_t generation, const std::string& name) {
  auto it = job.retired.find({generation, name});
  if (it == job.retired.end()) return false;
  job.retired.erase(it);  // (its InFlight token ends with it)
  maybeRemoveJobOnLoop(job.id());
  return true;
}

Status Agent::elasticAdmitOnLoop(const Job& job, const SubmitDesc& d) const {
  if (!job.elastic.enabled()) return okStatus();
  if (!job.suspended.isOk()) return job.suspended;
  if (d.generation != 0 && job.hasWorld() && d.generation != job.world().generation) {
    return membershipChanged("job " + job.id() + " is at generation " + std::to_string(job.world().generation) +
                             " but this collective was submitted in generation " +
                             std::to_string(d.generation) + ": submit it again with the new world");
  }
  return okStatus();
}

void Agent::maybeAdmitAtCommitOnLoop(Job& job, const SubmitDesc& d) {
  // kolo.torch.elastic's State.commit() (and C programs that follow the
  // convention) submit a collective whose name holds this marker.
  static constexpr std::string_view kCommitMarker = "__kolo.elastic.commit";
  std::string_view name(d.name, std::min<size_t>(d.name_len, kMaxNameBytes));
  if (!job.elastic.enabled() || !job.hasWorld() || job.admit_asked_gen == job.world().generation ||
      name.find(kCommitMarker) == std::string_view::npos) {
    return;
  }
  job.admit_asked_gen = job.world().generation;
  elasticLog()->info("job {}: commit at generation {}; asking to admit the {} agent(s) waiting to join", job.id(),
                     job.world().generation, job.waiting_agents);
  coord_->requestGeneration(job.id(), job.token(), job.localSize(), job.worldSize(), "commit", /*admit=*/true);
}

void Agent::elasticRankLostOnLoop(Job& job, int local_rank, const std::string& reason) {
  Status st = membershipChanged("job " + job.id() + ": " + reason);
  job.markDisconnected(local_rank);
  if (job.cross) job.cross->abort(st);
  job.suspended = st;  // until the next generation
  failInFlightOnLoop(job, st);
  elasticLog()->warn("job {}: {}; asking for the next generation (the rank may connect again)", job.id(), reason);
  coord_->requestGeneration(job.id(), job.token(), job.localSize(), job.worldSize(), reason);
}

}  // namespace kolo
