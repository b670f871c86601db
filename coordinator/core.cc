#include "coordinator/core.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "coordinator/membership/secrets.h"

namespace kolo::coordinator {

namespace {

// How often leases are checked: a tenth of the lease, between 10 and 250 ms,
// so an agent is declared lost at most ~10% after its lease ran out.
std::chrono::milliseconds leaseCheckPeriod(int64_t lease_ms) {
  return std::chrono::milliseconds(std::clamp<int64_t>(lease_ms / 10, 10, 250));
}

}  // namespace

Core::Core(EventLoop* loop, MembershipOptions options, const Clock* clock,
           persist::RecordSink* sink, WatchLimits watch_limits)
    : loop_(loop),
      sink_(sink),
      membership_(options, clock),
      watches_(watch_limits.brief_world_slots),
      watch_limits_(watch_limits) {
  // A quarter of the streams for the jobs' agents, unless setQuotas says.
  quotas_.reserved_watch_streams = watch_limits.total / 4;
}

Core::~Core() = default;

void Core::startOnLoop() {
  auto lease_period = leaseCheckPeriod(membership_.options().lease_ms);
  lease_timer_ = loop_->addTimer(
      lease_period, [this] { expireLeasesOnLoop(); }, lease_period);
  auto gc_period = std::chrono::seconds(1);
  retention_timer_ = loop_->addTimer(
      gc_period, [this] { collectEndedJobsOnLoop(); }, gc_period);
}

void Core::expireLeasesOnLoop() {
  Changes changes;
  membership_.expireLeases(&changes);
  membership_.checkElasticTimeouts(&changes);
  applyOnLoop(changes);
}

void Core::collectEndedJobsOnLoop() {
  Changes changes;
  membership_.collectEndedJobs(&changes);
  applyOnLoop(changes);
}

void Core::restoreOnLoop(const persist::PersistedState& state) {
  for (const auto& [id, info] : state.agents) {
    auto secret = state.agent_secrets.find(id);
    membership_.restoreAgent(info,
                             secret == state.agent_secrets.end() ? std::string() : secret->second);
  }
  for (const auto& [id, job] : state.jobs) membership_.restoreJob(job);
  for (const auto& [slot, value] : state.kv) {
    if (membership_.findJob(slot.first) != nullptr) kv_.put(slot.first, slot.second, value);
  }
}

persist::PersistedState Core::persistedStateOnLoop() const {
  persist::PersistedState state;
  for (const auto& [id, rec] : membership_.agents().all()) {
    state.agents.emplace(id, rec.info);
    if (!rec.secret.empty()) state.agent_secrets.emplace(id, rec.secret);
  }
  state.jobs = membership_.jobs();
  state.kv = kv_.values();
  return state;
}

void Core::recordOnLoop(persist::Record record) {
  if (sink_ == nullptr) return;
  last_seq_ = sink_->append(std::move(record));
  if (sink_->wantsCompaction()) {
    sink_->compact(persistedStateOnLoop());
    journaled_jobs_.clear();
  }
}

void Core::recordJobOnLoop(const Job& job) {
  if (sink_ == nullptr) return;
  persist::Record r = persist::Record::jobState(job);
  auto it = journaled_jobs_.find(job.id);
  if (it == journaled_jobs_.end()) {
    journaled_jobs_.emplace(job.id, Journaled{job.members, job.slots});
  } else {
    // Members are appended (joins) and marked (leaves) in place; a reseal
    // that reorders or drops them writes the job whole.
    std::vector<JobMember>& was = it->second.members;
    std::vector<uint32_t> changed;
    const size_t limit = std::max<size_t>(16, was.size() / 8);
    bool delta = !was.empty() && job.members.size() >= was.size();
    for (size_t i = 0; delta && i < was.size(); ++i) {
      if (persist::sameMember(was[i], job.members[i])) continue;
      if (was[i].agent_id != job.members[i].agent_id || changed.size() >= limit) delta = false;
      changed.push_back(static_cast<uint32_t>(i));
    }
    if (delta) {
      r.members_from = static_cast<int64_t>(was.size());  // only the new ones, and the marked
      for (uint32_t i : changed) {
        r.members_changed.emplace_back(i, job.members[i]);
        was[i] = job.members[i];
      }
      was.insert(was.end(), job.members.begin() + static_cast<std::ptrdiff_t>(was.size()),
                 job.members.end());
      r.same_slots = persist::sameSlots(it->second.slots, job.slots);
    } else {
      was = job.members;
    }
    if (!r.same_slots) it->second.slots = job.slots;
  }
  recordOnLoop(std::move(r));
}

void Core::flushJobRecordsOnLoop() {
  flush_posted_ = false;
  std::set<std::string> dirty;
  dirty.swap(dirty_jobs_);
  // A job removed meanwhile was journaled by its removal.
  for (const std::string& id : dirty) {
    if (const Job* job = membership_.findJob(id)) recordJobOnLoop(*job);
  }
}

void Core::shutdownOnLoop() {
  if (shutting_down_) return;
  flushJobRecordsOnLoop();
  shutting_down_ = true;
  if (lease_timer_ != 0) loop_->cancelTimer(lease_timer_);
  if (retention_timer_ != 0) loop_->cancelTimer(retention_timer_);
  lease_timer_ = retention_timer_ = 0;
  watches_.closeAll(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
  kv_.failAllWaiters();
}

void Core::applyOnLoop(const Changes& changes) {
  for (const std::string& id : changes.lost_agents) recordOnLoop(persist::Record::agentLost(id));
  std::vector<std::string> journaled;
  for (const std::string& id : changes.touched_jobs) {
    if (std::find(journaled.begin(), journaled.end(), id) != journaled.end()) continue;
    journaled.push_back(id);
    if (coalesce_job_records_ && sink_ != nullptr) {
      dirty_jobs_.insert(id);
      continue;
    }
    // A job removed by the same change is journaled by its removal below.
    if (const Job* job = membership_.findJob(id)) recordJobOnLoop(*job);
  }
  for (const Changes::Removed& r : changes.removed) {
    dirty_jobs_.erase(r.job_id);
    journaled_jobs_.erase(r.job_id);
    recordOnLoop(persist::Record::jobRemoved(r.job_id));
  }
  if (!dirty_jobs_.empty() && !flush_posted_) {
    flush_posted_ = true;
    loop_->post([this] { flushJobRecordsOnLoop(); });
  }
  for (const coord::World& w : changes.worlds) watches_.publish(w);
  for (const Changes::Removed& r : changes.removed) {
    kv_.eraseJob(r.job_id);
    watches_.closeJob(r.job_id, grpc::Status(grpc::StatusCode::ABORTED, r.reason));
  }
}

grpc::Status Core::refuseIfShuttingDown() const {
  if (!shutting_down_) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
}

grpc::Status Core::registerAgentOnLoop(const coord::RegisterAgentRequest& req,
                                       coord::RegisterAgentReply* reply, bool by_operator) {
  Changes changes;
  grpc::Status st = membership_.registerAgent(req, reply, &changes, by_operator);
  applyOnLoop(changes);  // the jobs of a restarted agent's old incarnation
  if (st.ok()) {
    // The hash the registry holds, never the secret itself (issue 47).
    const AgentRecord* rec = membership_.agents().find(req.agent().agent_id());
    recordOnLoop(persist::Record::agentRegistered(req.agent(), rec ? rec->secret : ""));
  }
  return st;
}

grpc::Status Core::heartbeatOnLoop(const coord::HeartbeatRequest& req,
                                   coord::HeartbeatReply* reply) {
  if (!req.leaving()) return membership_.heartbeat(req, reply);
  Changes changes;
  grpc::Status st = membership_.heartbeat(req, reply, &changes);
  applyOnLoop(changes);
  return st;
}

grpc::Status Core::checkJobQuotas(const coord::JoinJobRequest& req) const {
  const Job* job = membership_.findJob(req.job_id());
  if (job == nullptr && membership_.jobs().size() >= quotas_.max_jobs) {
    return quotaRefusal(fmt::format("JoinJob of job {} (agent {})", req.job_id(), req.agent_id()),
                        fmt::format("the coordinator already holds {} jobs (active and retained)",
                                    membership_.jobs().size()),
                        "max-jobs", quotas_.max_jobs);
  }
  if (job != nullptr && (job->findMember(req.agent_id()) != nullptr)) return grpc::Status::OK;
  size_t in = 0;
  for (const auto& [id, j] : membership_.jobs()) {
    if (!j.active()) continue;
    const JobMember* m = j.findMember(req.agent_id());
    bool waiting = std::any_of(j.waiting.begin(), j.waiting.end(),
                               [&](const JobMember& w) { return w.agent_id == req.agent_id(); });
    if ((m != nullptr && !m->left) || waiting) ++in;
  }
  if (in >= quotas_.jobs_per_agent) {
    return quotaRefusal(fmt::format("JoinJob of job {} (agent {})", req.job_id(), req.agent_id()),
                        fmt::format("agent {} is already in {} active jobs", req.agent_id(), in),
                        "max-jobs-per-agent", quotas_.jobs_per_agent);
  }
  return grpc::Status::OK;
}

grpc::Status Core::joinJobOnLoop(const coord::JoinJobRequest& req) {
  // The agent's secret first: a stranger learns nothing from the quotas.
  if (auto st = membership_.checkAgent("JoinJob", req.agent_id(), req.agent_secret()); !st.ok()) {
    return st;
  }
  if (auto st = checkJobQuotas(req); !st.ok()) return st;
  Changes changes;
  grpc::Status st = membership_.joinJob(req, &changes);
  applyOnLoop(changes);
  return st;
}

grpc::Status Core::leaveJobOnLoop(const coord::LeaveJobRequest& req) {
  Changes changes;
  grpc::Status st = membership_.leaveJob(req, &changes);
  applyOnLoop(changes);
  return st;
}

WatchAccounting::Ticket Core::watchTicket(const coord::WatchJobRequest& req,
                                          const std::string& peer) const {
  WatchAccounting::Ticket t;
  t.job_id = req.job_id();
  t.token = req.token();
  t.peer = peerHost(peer);
  const Job* job = membership_.findJob(req.job_id());
  if (job == nullptr || req.agent_secret().empty() ||
      !membership_.checkAgent("WatchJob", req.agent_id(), req.agent_secret()).ok()) {
    return t;
  }
  const JobMember* m = job->findMember(req.agent_id());
  bool waiting = std::any_of(job->waiting.begin(), job->waiting.end(),
                             [&](const JobMember& w) { return w.agent_id == req.agent_id(); });
  if (m != nullptr || waiting) {
    t.member = true;
    t.agent_id = req.agent_id();
  }
  return t;
}

grpc::Status Core::watchOnLoop(const coord::WatchJobRequest& req, std::shared_ptr<WatchQueue> queue,
                               const std::string& peer) {
  if (auto st = refuseIfShuttingDown(); !st.ok()) return st;
  coord::World world;
  BriefForm brief{watch_limits_.brief_world_slots, req.agent_id(), req.local_size_runs()};
  grpc::Status st =
      membership_.world(req.job_id(), req.token(), &world, req.brief() ? &brief : nullptr);
  if (!st.ok()) return st;
  if (watches_.totalCount() >= watch_limits_.total) {
    log::get("coord")->warn("job {}: watch of agent {} refused: {} watch streams open (limit {})",
                            req.job_id(), req.agent_id(), watches_.totalCount(),
                            watch_limits_.total);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        fmt::format("WatchJob of job {} refused: the coordinator already serves "
                                    "{} watch streams (--max-watch-streams {})",
                                    req.job_id(), watches_.totalCount(), watch_limits_.total));
  }
  if (watches_.watcherCount(req.job_id()) >= watch_limits_.per_job) {
    log::get("coord")->warn(
        "job {}: watch of agent {} refused: {} watch streams open on the job (limit {})",
        req.job_id(), req.agent_id(), watches_.watcherCount(req.job_id()), watch_limits_.per_job);
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        fmt::format("WatchJob of job {} refused: the job already has {} watch streams "
                    "(--max-watch-streams-per-job {})",
                    req.job_id(), watches_.watcherCount(req.job_id()), watch_limits_.per_job));
  }
  if (auto st = watch_accounting_.admit(quotas_, watch_limits_, watches_.totalCount(),
                                        watchTicket(req, peer), queue.get());
      !st.ok()) {
    return st;
  }
  bool terminal = isTerminal(world);
  queue->push(std::move(world));
  if (!terminal) watches_.add(req.job_id(), std::move(queue), req.brief(), req.local_size_runs());
  log::get("coord")->debug("job {}: agent {} watches ({} watchers)", req.job_id(), req.agent_id(),
                           watches_.watcherCount(req.job_id()));
  return grpc::Status::OK;
}

void Core::unwatchOnLoop(const std::string& job_id, const WatchQueue* queue) {
  watches_.remove(job_id, queue);
  watch_accounting_.release(queue);
}

grpc::Status Core::kvPutOnLoop(const coord::KvPutRequest& req) {
  grpc::Status st = membership_.checkAccess(req.job_id(), req.token());
  if (!st.ok()) return st;
  if (req.key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        fmt::format("KvPut: empty key for job {}", req.job_id()));
  }
  if (auto quota = checkKvQuotas(req); !quota.ok()) return quota;
  kv_.put(req.job_id(), req.key(), req.value());
  recordOnLoop(persist::Record::kvPut(req.job_id(), req.key(), req.value()));
  return grpc::Status::OK;
}

grpc::Status Core::kvGetOnLoop(const coord::KvGetRequest& req, KvDone done) {
  grpc::Status st = membership_.checkAccess(req.job_id(), req.token());
  if (!st.ok()) return st;
  if (auto value = kv_.get(req.job_id(), req.key())) {
    done(std::move(value));
    return grpc::Status::OK;
  }
  if (req.wait_ms() == 0) {
    done(std::nullopt);
    return grpc::Status::OK;
  }
  if (auto refuse = refuseIfShuttingDown(); !refuse.ok()) return refuse;
  if (kv_.usage(req.job_id()).waiters >= quotas_.kv_waiters_per_job) {
    return quotaRefusal(
        fmt::format("KvGet of key '{}' of job {}", req.key(), req.job_id()),
        fmt::format("the job already has {} KvGet calls waiting", kv_.usage(req.job_id()).waiters),
        "max-kv-waiters-per-job", quotas_.kv_waiters_per_job);
  }
  if (kv_.waiterCount() >= quotas_.kv_waiters_total) {
    return quotaRefusal(
        fmt::format("KvGet of key '{}' of job {}", req.key(), req.job_id()),
        fmt::format("{} KvGet calls are waiting on the keys of all jobs", kv_.waiterCount()),
        "max-kv-waiters", quotas_.kv_waiters_total);
  }
  uint64_t wait_ms = std::min(req.wait_ms(), kMaxKvWaitMs);
  KvStore::WaiterId id = kv_.addWaiter(req.job_id(), req.key(), std::move(done));
  loop_->addTimer(std::chrono::milliseconds(wait_ms), [this, id] { kv_.expireWaiter(id); });
  return grpc::Status::OK;
}

grpc::Status Core::checkKvQuotas(const coord::KvPutRequest& req) const {
  KvStore::Usage u = kv_.usage(req.job_id());
  std::optional<std::string> old = kv_.get(req.job_id(), req.key());
  const size_t old_bytes = old ? req.key().size() + old->size() : 0;
  const size_t new_bytes = req.key().size() + req.value().size();
  const std::string what = fmt::format("KvPut of key '{}' of job {}", req.key(), req.job_id());
  if (!old && u.keys >= quotas_.kv_keys_per_job) {
    return quotaRefusal(what, fmt::format("the job already has {} keys", u.keys),
                        "max-kv-keys-per-job", quotas_.kv_keys_per_job);
  }
  if (u.bytes - old_bytes + new_bytes > quotas_.kv_bytes_per_job) {
    return quotaRefusal(what,
                        fmt::format("the job's keys and values would take {} bytes",
                                    u.bytes - old_bytes + new_bytes),
                        "max-kv-bytes-per-job", quotas_.kv_bytes_per_job);
  }
  if (kv_.totalBytes() - old_bytes + new_bytes > quotas_.kv_bytes_total) {
    return quotaRefusal(what,
                        fmt::format("the keys of all jobs would take {} bytes",
                                    kv_.totalBytes() - old_bytes + new_bytes),
                        "max-kv-bytes", quotas_.kv_bytes_total);
  }
  return grpc::Status::OK;
}

namespace {
// Keeps the first entries of `items` whose encoded size stays within
// `limit` bytes, so a listing always fits a gRPC message (4 MiB by default).
template <typename Repeated>
bool truncateTo(Repeated* items, size_t limit) {
  size_t bytes = 0;
  int keep = 0;
  for (; keep < items->size(); ++keep) {
    bytes += items->Get(keep).ByteSizeLong() + 8;  // + tag and length
    if (bytes > limit) break;
  }
  if (keep == items->size()) return false;
  items->DeleteSubrange(keep, items->size() - keep);
  return true;
}
}  // namespace

coord::ListJobsReply Core::listJobsOnLoop() const {
  coord::ListJobsReply reply = membership_.listJobs();
  const int total = reply.jobs_size();
  if (truncateTo(reply.mutable_jobs(), quotas_.list_reply_bytes)) {
    reply.set_truncated(true);
    reply.set_total(static_cast<uint64_t>(total));
    log::get("coord")->warn("ListJobs: {} of {} jobs listed (--max-list-reply-bytes {})",
                            reply.jobs_size(), total, quotas_.list_reply_bytes);
  }
  return reply;
}

coord::ListAgentsReply Core::listAgentsOnLoop() const {
  coord::ListAgentsReply reply = membership_.listAgents();
  const int total = reply.agents_size();
  if (truncateTo(reply.mutable_agents(), quotas_.list_reply_bytes)) {
    reply.set_truncated(true);
    reply.set_total(static_cast<uint64_t>(total));
  }
  return reply;
}

}  // namespace kolo::coordinator
