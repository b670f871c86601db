// Snapshots of agent state for the gRPC status service (loop thread).
#include "agent/agent.h"
#include "common/dtype.h"

namespace kolo {

namespace {
// Bytes of in-flight entries and clients one status reply may carry (gRPC's
// default limit is 4 MiB; the jobs' own lines take the rest).
constexpr size_t kStatusReplyBudget = 1 << 20;
}  // namespace

const Job* Agent::findJobOnLoop(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

static void fillMps(const gpu::MpsProbe& p, agentrpc::MpsInfo* out) {
  out->set_state(gpu::mpsStateName(p.state));
  out->set_reason(p.reason);
  out->set_pipe_dir(p.pipe_dir);
}

static void fillGpus(const MpsMonitor* mon, agentrpc::AgentStatus* s) {
  if (mon == nullptr) return;
  const MpsMonitor::Snapshot snap = mon->snapshot();
  fillMps(snap.mps, s->mutable_mps());
  if (!snap.probed) return;
  if (snap.gpus.count == 0)
    s->set_no_gpu(snap.gpus.none_reason.empty() ? "no GPU" : snap.gpus.none_reason);
  for (int i = 0; i < snap.gpus.count; ++i) {
    auto* g = s->add_gpus();
    g->set_index(i);
    fillMps(snap.mps, g->mutable_mps());
    const int client =
        i < static_cast<int>(snap.gpus.mps_client.size()) ? snap.gpus.mps_client[i] : -1;
    g->set_mps_client(client > 0 ? "yes" : client == 0 ? "no" : "unknown");
  }
}

static void fillCounters(const JobCounters& c, agentrpc::Counters* out) {
  out->set_ops_done(c.ops_done);
  out->set_bytes_done(c.bytes_done);
  out->set_ops_failed(c.ops_failed);
}

agentrpc::JobInfo Agent::jobInfoOnLoop(const Job& job, size_t* budget) const {
  agentrpc::JobInfo info;
  info.set_job_id(job.id());
  info.set_state(jobStateName(job.state()));
  info.set_generation(job.world().generation);
  info.set_rank_offset(job.world().rank_offset);
  info.set_local_size(job.localSize());
  info.set_world_size(job.worldSize());
  info.set_connected_clients(job.connectedClients());
  fillCounters(job.counters(), info.mutable_counters());
  if (!job.failure().isOk()) info.set_reason(job.failure().message());
  info.set_backend(job.cross_backend);
  info.set_backend_reason(job.cross_backend_reason);
  auto now = std::chrono::steady_clock::now();
  size_t omitted = 0;
  size_t local_budget = kStatusReplyBudget;
  if (budget == nullptr) budget = &local_budget;
  const auto pending =
      job.table().snapshot(static_cast<size_t>(opts_.limits.status_max_in_flight), &omitted);
  info.set_in_flight_total(static_cast<uint32_t>(job.table().pendingCount()));
  for (size_t i = 0; i < pending.size(); ++i) {
    const PendingInfo& p = pending[i];
    if (*budget == 0) {
      omitted += pending.size() - i;
      break;
    }
    auto* f = info.add_in_flight();
    f->set_name(p.name);
    f->set_op(std::string(collectiveName(static_cast<CollectiveType>(p.first.collective))));
    f->set_dtype(std::string(dataTypeName(static_cast<DataType>(p.first.dtype))));
    for (int i = 0; i < p.first.ndim && i < kMaxDims; ++i) f->add_shape(p.first.shape[i]);
    for (int r : p.submitted) f->add_submitted_ranks(job.globalRank(r));
    for (int r : p.waiting) f->add_waiting_ranks(job.globalRank(r));
    f->set_age_ms(std::chrono::duration_cast<std::chrono::milliseconds>(now - p.first_arrival).count());
    *budget -= std::min(*budget, f->ByteSizeLong());
  }
  info.set_in_flight_omitted(static_cast<uint32_t>(omitted));
  return info;
}

agentrpc::ListJobsReply Agent::listJobsOnLoop() const {
  agentrpc::ListJobsReply rep;
  size_t budget = kStatusReplyBudget;
  for (auto& [id, j] : jobs_) *rep.add_jobs() = jobInfoOnLoop(*j, &budget);
  return rep;
}

agentrpc::AgentStatus Agent::statusOnLoop() const {
  agentrpc::AgentStatus s;
  s.set_agent_id(opts_.agent_id);
  s.set_hostname(opts_.hostname);
  s.set_version("0.1.0");
  s.set_socket_path(opts_.socket_path);
  s.set_coordinator(opts_.coordinator);
  s.set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_).count());
  size_t budget = kStatusReplyBudget;
  uint32_t clients_omitted = 0;
  for (auto& [id, c] : conns_) {
    if (c->job_id.empty()) continue;
    if (budget == 0) {
      ++clients_omitted;
      continue;
    }
    auto* ci = s.add_clients();
    ci->set_job_id(c->job_id);
    ci->set_local_rank(c->local_rank);
    const Job* j = findJobOnLoop(c->job_id);
    ci->set_rank(j != nullptr ? j->globalRank(c->local_rank) : -1);
    ci->set_pid(c->pid());
    ci->set_own_pid(c->own_pid);
    ci->set_uid(static_cast<int>(c->uid()));
    ci->set_arena_bytes(c->arenaBytes());
    budget -= std::min(budget, ci->ByteSizeLong());
  }
  s.set_clients_omitted(clients_omitted);
  for (auto& [id, j] : jobs_) *s.add_jobs() = jobInfoOnLoop(*j, &budget);
  fillCounters(totals_, s.mutable_counters());
  if (metrics_http_) s.set_metrics_address(metrics_http_->boundAddress());
  s.set_draining(draining_);
  fillGpus(mps_.get(), &s);
  return s;
}

}  // namespace kolo
