// Collectives on the agent loop: draining submission rings, the tensor
// table, execution, completions and job failure.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <unordered_set>
#include <vector>

#include "agent/agent.h"
#include "agent/coord/compact_world.h"
#include "agent/ipc/limits.h"
#include "agent/ops/memory.h"
#include "agent/ops/op.h"
#include "common/log.h"

namespace kolo {

namespace {
auto opsLog() { return log::get("agent.ops"); }
log::RateLimiter g_bad_desc_log;
log::RateLimiter g_quota_log;
log::RateLimiter g_backlog_log;
}  // namespace

void Agent::unchargeTableOnLoop(ClientConn& c, uint64_t bytes) {
  auto u = table_bytes_per_uid_.find(c.uid());
  if (u == table_bytes_per_uid_.end()) return;
  u->second -= std::min(bytes, u->second);
  if (u->second == 0) table_bytes_per_uid_.erase(u);
}

void Agent::completeOnLoop(ClientConn& c, uint64_t handle, const Status& st, int64_t aux) {
  if (auto it = c.in_flight.find(handle); it != c.in_flight.end()) {
    c.bytes_in_flight -= it->second;
    c.in_flight.erase(it);
    unchargeTableOnLoop(c, c.table_cost);
  }
  c.complete(handle, st, aux);
  c.flushCompletions();
  c.signalClient();
}

void Agent::onDoorbellOnLoop(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  it->second->clearDoorbell();
  drainSubmissionsOnLoop(conn_id);
}

bool Agent::pollRingsOnLoop() {
  std::vector<uint64_t> ready;
  for (auto& [id, c] : conns_) {
    if (c->hasArena() && c->hasSubmissions() && !c->backlogFull()) ready.push_back(id);
  }
  for (uint64_t id : ready) drainSubmissionsOnLoop(id);  // may close connections
  return !ready.empty();
}

bool Agent::beforeSleepOnLoop() {
  // Poll the submission rings briefly before sleeping: the next small
  // collective usually arrives within microseconds, and a sleep + wake-up
  // costs more than that. Work posted by other threads (the backends'
  // completions: a small cross-agent collective's answer) is caught the
  // same way. While this runs the trainers skip the doorbell.
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(opts_.spin_us);
  do {
    if (loop_.hasPosted() || pollRingsOnLoop()) return true;
    ::sched_yield();
  } while (std::chrono::steady_clock::now() < end);
  // About to sleep: from now on a submission rings the doorbell; one pushed
  // before a trainer saw the flag is caught by this last look.
  for (auto& [id, c] : conns_) c->setAgentPolling(false);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (loop_.hasPosted() || pollRingsOnLoop()) {
    afterSleepOnLoop();
    return true;
  }
  return false;
}

void Agent::afterSleepOnLoop() {
  for (auto& [id, c] : conns_) c->setAgentPolling(true);
}

void Agent::drainSubmissionsOnLoop(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  ClientConn& c = *it->second;
  const size_t backlog = c.completionBacklog();
  c.flushCompletions();
  if (c.completionBacklog() < backlog) c.signalClient();
  SubmitDesc d;
  // Bounded batch so one busy client cannot starve the loop; no new
  // submission from a client that leaves its completions unread.
  for (int i = 0; i < 4096 && !c.backlogFull() && c.popSubmission(&d); ++i) {
    ++c.submitted;
    onSubmitOnLoop(c, d);
    if (conns_.find(conn_id) == conns_.end()) return;
  }
  if (c.backlogFull()) {
    log::rateLimited(g_backlog_log, *opsLog(), spdlog::level::warn,
                     "job {}: pid {} left {} completions unread; taking no more of its "
                     "submissions until it reads them",
                     c.job_id, c.pid(), c.completionBacklog());
  }
  if (c.completionBacklog() > 0 && !c.backlog_retry_armed) {
    // The trainer reads its completions without ringing the doorbell: look
    // again shortly, until every completion is in its ring.
    c.backlog_retry_armed = true;
    loop_.addTimer(std::chrono::milliseconds(10), [this, conn_id] {
      auto it = conns_.find(conn_id);
      if (it == conns_.end()) return;
      it->second->backlog_retry_armed = false;
      drainSubmissionsOnLoop(conn_id);
    });
  }
}

void Agent::onSubmitOnLoop(ClientConn& c, const SubmitDesc& d) {
  auto jit = jobs_.find(c.job_id);
  if (jit == jobs_.end()) return completeOnLoop(c, d.handle, internalError("client has no job"));
  Job& job = *jit->second;
  Status v = c.validate(d);
  if (!v.isOk()) {
    log::rateLimited(g_bad_desc_log, *opsLog(), spdlog::level::warn,
                     "job {}: rank {} sent a bad descriptor: {}", job.id(),
                     job.globalRank(c.local_rank), v.message());
    return completeOnLoop(c, d.handle, v);
  }
  auto coll = static_cast<CollectiveType>(d.collective);
  // The collective's op type (agent/ops/op.h); join has its own path.
  const CollectiveOp* kind = collectiveOp(coll);
  if (kind == nullptr && coll != CollectiveType::kJoin) {
    return completeOnLoop(c, d.handle,
                          invalidArgument(std::string(collectiveName(coll)) + " is not supported by this agent yet"));
  }
  if (job.state() == JobState::kFailed || job.state() == JobState::kEnding) {
    return completeOnLoop(c, d.handle, job.refusal());
  }
  if (Status e = elasticAdmitOnLoop(job, d); !e.isOk()) return completeOnLoop(c, d.handle, e);
  if (job.waiting_agents > 0) maybeAdmitAtCommitOnLoop(job, d);
  if (!job.ready()) {
    return completeOnLoop(c, d.handle, invalidArgument("job " + job.id() + " has not formed yet: wait for kolo_init"));
  }
  if (coll == CollectiveType::kJoin) return onJoinOnLoop(job, c, d);
  if (job.table().joined(c.local_rank)) {
    return completeOnLoop(c, d.handle,
                          invalidArgument(std::string(collectiveName(coll)) + " of tensor '" +
                                          std::string(d.name, std::min<size_t>(d.name_len, kMaxNameBytes)) +
                                          "': rank " + std::to_string(job.globalRank(c.local_rank)) +
                                          " has joined (kolo_join) and takes no part in collectives until every "
                                          "rank has joined"));
  }
  if (d.group_id != 0) {
    auto f = job.failed_groups.find(d.group_id);
    if (f != job.failed_groups.end()) return completeOnLoop(c, d.handle, f->second);
  }
  // The private copy of what the trainer left in shared memory, if anything.
  std::vector<int64_t> meta;
  if (Status g = kind->validateOnLoop(job, c, d, &meta); !g.isOk())
    return completeOnLoop(c, d.handle, g);
  // Quotas (agent/ipc/limits.h): what one rank may hold in flight here.
  if (c.in_flight.count(d.handle) != 0) {
    c.complete(d.handle,
               invalidArgument("handle " + std::to_string(d.handle) + " is already in flight"));
    c.flushCompletions();
    c.signalClient();
    return;
  }
  const uint64_t bytes = submitDescBytes(d);
  const uint64_t arenas = c.allArenasBytes();
  Status q =
      checkSubmitQuota(RankQuota{static_cast<int64_t>(c.in_flight.size()), c.bytes_in_flight},
                       bytes, arenas, opts_.limits, job.globalRank(c.local_rank), job.id());
  const uint64_t table_cost = tableBytesPerName(job.localSize());
  if (q.isOk()) {
    auto u = table_bytes_per_uid_.find(c.uid());
    q = checkUidTableQuota(u == table_bytes_per_uid_.end() ? 0 : u->second, table_cost,
                           opts_.limits, c.uid());
  }
  if (!q.isOk()) {
    log::rateLimited(g_quota_log, *opsLog(), spdlog::level::warn, "{}", q.message());
    return completeOnLoop(c, d.handle, q);
  }
  // Counted before the table sees it: a name that is ready at once may
  // complete inside submit's dispatch (completeOnLoop uncounts it).
  c.in_flight.emplace(d.handle, bytes);
  c.bytes_in_flight += bytes;
  c.table_cost = table_cost;  // the same for every name of this connection's job
  table_bytes_per_uid_[c.uid()] += table_cost;
  std::optional<ReadyOp> ready;
  auto now = std::chrono::steady_clock::now();
  size_t before = job.table().pendingCount();
  Status st = job.table().submit(c.local_rank, d, now, &ready, std::move(meta));
  if (!st.isOk()) return completeOnLoop(c, d.handle, st);
  std::string_view name(d.name, std::min<size_t>(d.name_len, kMaxNameBytes));
  bool first = ready ? job.localSize() == 1 : job.table().pendingCount() > before;
  if (first) timeline_->negotiateStart(name, static_cast<CollectiveType>(d.collective));
  timeline_->negotiateRankReady(name, job.globalRank(c.local_rank));
  if (ready) {
    stalls_.recordDone(job.id(), ready->name);
    timeline_->negotiateEnd(ready->name);
    dispatchReadyOnLoop(job, std::move(*ready));
  } else {
    stalls_.recordSubmit(job.id(), std::string(name), job.globalRank(c.local_rank), now);
  }
}

void Agent::executeOnLoop(Job& job, ReadyOp op) {
  std::vector<uint64_t> handles;
  handles.reserve(op.descs.size());
  for (auto& d : op.descs) handles.push_back(d.handle);
  // Where the op's tensors live, chosen once (agent/ops/memory.h), given the
  // collective's op type (agent/ops/<collective>.cc; onSubmitOnLoop admitted
  // only collectives that have one).
  const CollectiveOp* kind = collectiveOp(static_cast<CollectiveType>(op.descs[0].collective));
  memoryOf(op).runOnLoop(*this, job, kind, std::move(op), std::move(handles));
}

void Agent::copyOpAllOnLoop(std::vector<LocalReduce> copies, std::function<void()> done) {
  auto left = std::make_shared<size_t>(copies.size());
  if (copies.empty()) {
    done();
    return;
  }
  auto shared_done = std::make_shared<std::function<void()>>(std::move(done));
  for (LocalReduce& c : copies) {
    // Callbacks run on the loop thread: a plain counter suffices.
    executor_.reduceOnLoop(std::move(c), [left, shared_done] {
      if (--*left == 0) (*shared_done)();
    });
  }
}

// OpHost (agent/ops/op.h): what the op types use of the agent.
timeline::Timeline& Agent::opTimeline() { return *timeline_; }

void Agent::finishOpOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                           uint64_t bytes, const Status& st, DataType dtype, SteadyTime started,
                           CollectiveType collective) {
  finishOnLoop(job_id, handles, bytes, st, dtype, started, collective);
}

void Agent::reduceOpOnLoop(LocalReduce r, std::function<void()> done) {
  executor_.reduceOnLoop(std::move(r), std::move(done));
}

void Agent::handOpToNegotiationOnLoop(const std::string& job_id, uint64_t gen, CrossWork w) {
  handToNegotiationOnLoop(job_id, gen, std::move(w));
}

Job* Agent::opJobOnLoop(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void Agent::stageDeviceThenOnLoop(std::function<Status()> work, std::function<void(Status)> then) {
  device_stage_pool_.submit([this, work = std::move(work), then = std::move(then)]() {
    Status st = work();
    loop_.post([then, st]() { then(st); });
  });
}

void Agent::observeNegotiation(double seconds) { op_metrics_.negotiation->observe(seconds); }
void Agent::observeDirect(uint64_t bytes) { op_metrics_.direct_bytes->inc(bytes); }
void Agent::observeStreamed(uint64_t bytes) { op_metrics_.streamed_bytes->inc(bytes); }

void Agent::finishSplitOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                              uint64_t bytes, int64_t aux, DataType dtype, SteadyTime started) {
  if (aux == kSplitGo) op_metrics_.split_bytes->inc(bytes);
  finishOnLoop(job_id, handles, bytes, okStatus(), dtype, started, CollectiveType::kAllreduce, aux);
}

void Agent::finishOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                         uint64_t bytes, const Status& st, DataType dtype, SteadyTime started,
                         CollectiveType collective, int64_t aux) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  // A job that failed while we worked reports the failure, not a result.
  Status final_st = st;
  if (st.isOk() && job.state() == JobState::kFailed) final_st = job.failure();
  for (size_t r = 0; r < handles.size(); ++r) {
    ClientConn* c = job.client(static_cast<int>(r));
    if (c != nullptr && handles[r] != 0)
      completeOnLoop(*c, handles[r], final_st, final_st.isOk() ? aux : 0);  // 0: a joined rank
  }
  if (final_st.isOk() && aux == kSplitRetry) {  // not done: it comes back whole
    maybeRemoveJobOnLoop(job_id);
    return;
  }
  const int dti = static_cast<int>(dtype);
  const int ci = static_cast<int>(collective);
  if (final_st.isOk()) {
    op_metrics_.ok[ci][dti]->inc();
    op_metrics_.bytes[ci][dti]->inc(bytes);
    if (started != SteadyTime{}) {
      op_metrics_.latency[ci]->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
  } else {
    op_metrics_.failed[ci][dti]->inc();
    metrics_.counter("kolo_errors_total", "Failed collectives by error kind", {{"kind", codeName(final_st.code())}})
        .inc();
  }
  if (final_st.isOk()) {
    job.counters().ops_done++;
    job.counters().bytes_done += bytes;
    totals_.ops_done++;
    totals_.bytes_done += bytes;
  } else {
    job.counters().ops_failed++;
    totals_.ops_failed++;
  }
  maybeRemoveJobOnLoop(job_id);
}

void Agent::failJobOnLoop(Job& job, const Status& st, bool tell_coordinator) {
  if (job.state() == JobState::kFailed) return;
  job.fail(st);
  if (job.cross) job.cross->abort(st);
  auto pending = job.table().drainAll();
  for (auto& [local_rank, handle] : pending) {
    if (ClientConn* c = job.client(local_rank)) completeOnLoop(*c, handle, st);
  }
  finishJoinOnLoop(job, st, -1);
  ipc::AgentFrame f;
  f.mutable_job_failed()->set_code(static_cast<int>(st.code()));
  f.mutable_job_failed()->set_message(st.message());
  for (ClientConn* c : job.clients()) {
    if (c != nullptr) (void)c->send(f);
  }
  if (tell_coordinator && !job.coordinator_left) {
    coord_->leave(job.id(), true, st.message());
    job.coordinator_left = true;
  }
}

void Agent::endJobForRankOnLoop(Job& job, int local_rank) {
  // Everything still pending needs the departed rank: fail it with the refusal.
  auto pending = job.table().drainAll();
  for (auto& [r, handle] : pending) {
    if (ClientConn* c = job.client(r)) completeOnLoop(*c, handle, job.refusal());
  }
  finishJoinOnLoop(job, job.refusal(), -1);
}

// (Stall tracking needs the job's global ranks.)
void Agent::onWorldOnLoop(const std::string& job_id, StatusOr<coord::World> w) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  if (!w.isOk()) {
    opsLog()->warn("job {}: {}", job_id, w.status().message());
    Status st = w.status();
    Code code = st.code() == Code::kPermissionDenied || st.code() == Code::kInvalidArgument ? st.code()
                                                                                            : Code::kUnavailable;
    failJobOnLoop(job, Status(code, st.message()), false);
    job.coordinator_left = true;
    return;
  }
  const coord::World& world = *w;
  if (world.state() == coord::FAILED) {
    std::string reason = "job " + job_id + " failed: " + world.reason();
    failJobOnLoop(job, peerFailure(reason), false);
    job.coordinator_left = true;
    return;
  }
  if (world.state() != coord::RUNNING) return;
  job.waiting_agents = world.waiting_agent_ids_size();
  for (const std::string& id : world.waiting_agent_ids()) {
    if (id == opts_.agent_id) return;  // this agent joins at the job's next commit
  }
  if (job.hasWorld() && job.world().generation >= world.generation()) return;
  if (job.hasWorld()) beginGenerationOnLoop(job, world.generation(), world.change());
  JobWorld jw;
  jw.generation = world.generation();
  jw.world_size = world.world_size();
  bool found = false;
  if (world.agents_size() == 0 &&
      (world.local_sizes_size() > 0 || world.local_size_runs_size() > 0)) {
    // A compact World (a job of more agents than the coordinator's
    // --brief-world-slots): local sizes by cross rank, and this agent's slot.
    Status st = compactJobWorld(world, opts_.agent_id, &jw, &found);
    if (!st.isOk()) {
      failJobOnLoop(job, st, true);
      return;
    }
  } else {
    jw.cross_size = world.agents_size();
    for (const auto& slot : world.agents()) {
      jw.agents.push_back(slot.agent().agent_id() + " (host " + slot.agent().hostname() + ")");
      jw.rank_offsets.push_back(slot.rank_offset());
      jw.local_sizes.push_back(slot.local_size());
      if (slot.agent().agent_id() == opts_.agent_id) {
        jw.rank_offset = slot.rank_offset();
        jw.cross_rank = slot.cross_rank();
        found = true;
      }
    }
  }
  if (!found) {
    if (job.elastic.enabled()) {  // dropped (its lease ran out while it was stopped, say)
      failJobOnLoop(job, peerFailure("job " + job_id + " went on to generation " + std::to_string(jw.generation) +
                                     " without this agent (" + world.change() + ")"), false);
      job.coordinator_left = true;
      return;
    }
    failJobOnLoop(job, internalError("the coordinator's World for job " + job_id + " does not list this agent"), true);
    return;
  }
  job.setWorld(jw);
  {
    std::vector<int> ranks;
    for (int r = 0; r < job.localSize(); ++r) ranks.push_back(job.globalRank(r));
    stalls_.setJobRanks(job_id, ranks, opts_.hostname);
  }
  opsLog()->info("job {} generation {}: {} ranks on {} agents; local ranks start at {}", job_id, jw.generation,
                 jw.world_size, jw.cross_size, jw.rank_offset);
  if (jw.cross_size > 1) {
    startCrossOnLoop(job);  // clients learn the World once the backend is connected
    return;
  }
  maybeSendWorldOnLoop(job);
}

void Agent::drainOnLoop() { setDrainingOnLoop(true); }

void Agent::undrainOnLoop() { setDrainingOnLoop(false); }

void Agent::setDrainingOnLoop(bool draining) {
  if (draining_ != draining) {
    log::get("agent")->info(draining ? "draining: no new trainers are admitted; running jobs go on"
                                     : "undrained: new trainers are admitted again");
  }
  draining_ = draining;
  metrics_
      .gauge("kolo_agent_draining",
             "1 while the agent is drained (kolo drain): it admits no new trainers")
      .set(draining ? 1 : 0);
  // Liveness (service "") stays SERVING; the agent's own service reads
  // NOT_SERVING while drained, for readiness probes that name it.
  if (rpc_server_)
    rpc_server_->GetHealthCheckService()->SetServingStatus(kHealthService, !draining);
}

}  // namespace kolo
