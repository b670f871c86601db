// Snapshots of agent state for the gRPC status service (loop thread).
#include "agent/agent.h"
#include "common/dtype.h"

namespace kolo {

const Job* Agent::findJobOnLoop(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

std::vector<const Job*> Agent::jobsOnLoop() const {
  std::vector<const Job*> out;
  for (auto& [id, j] : jobs_) out.push_back(j.get());
  return out;
}

static void fillCounters(const JobCounters& c, agentrpc::Counters* out) {
  out->set_ops_done(c.ops_done);
  out->set_bytes_done(c.bytes_done);
  out->set_ops_failed(c.ops_failed);
}

agentrpc::JobInfo Agent::jobInfoOnLoop(const Job& job) const {
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
  auto now = std::chrono::steady_clock::now();
  for (const PendingInfo& p : job.table().snapshot()) {
    auto* f = info.add_in_flight();
    f->set_name(p.name);
    f->set_op(std::string(collectiveName(static_cast<CollectiveType>(p.first.collective))));
    f->set_dtype(std::string(dataTypeName(static_cast<DataType>(p.first.dtype))));
    for (int i = 0; i < p.first.ndim && i < kMaxDims; ++i) f->add_shape(p.first.shape[i]);
    for (int r : p.submitted) f->add_submitted_ranks(job.globalRank(r));
    for (int r : p.waiting) f->add_waiting_ranks(job.globalRank(r));
    f->set_age_ms(std::chrono::duration_cast<std::chrono::milliseconds>(now - p.first_arrival).count());
  }
  return info;
}

agentrpc::AgentStatus Agent::statusOnLoop() const {
  agentrpc::AgentStatus s;
  s.set_agent_id(opts_.agent_id);
  s.set_hostname(opts_.hostname);
  s.set_version("0.1.0");
  s.set_socket_path(opts_.socket_path);
  s.set_coordinator(opts_.coordinator);
  s.set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_).count());
  for (auto& [id, c] : conns_) {
    if (c->job_id.empty()) continue;
    auto* ci = s.add_clients();
    ci->set_job_id(c->job_id);
    ci->set_local_rank(c->local_rank);
    const Job* j = findJobOnLoop(c->job_id);
    ci->set_rank(j != nullptr ? j->globalRank(c->local_rank) : -1);
    ci->set_pid(c->pid());
    ci->set_uid(static_cast<int>(c->uid()));
    ci->set_arena_bytes(c->arenaBytes());
  }
  for (auto& [id, j] : jobs_) *s.add_jobs() = jobInfoOnLoop(*j);
  fillCounters(totals_, s.mutable_counters());
  if (metrics_http_) s.set_metrics_address(metrics_http_->boundAddress());
  return s;
}

}  // namespace kolo
