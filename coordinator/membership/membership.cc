#include "coordinator/membership/membership.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "common/log.h"
#include "coordinator/membership/secrets.h"

namespace kolo::coordinator {

namespace {

grpc::Status error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

}  // namespace

Membership::Membership(MembershipOptions options, const Clock* clock)
    : options_(options), clock_(clock), agents_(clock, options.lease_ms) {}

grpc::Status Membership::refuseTakeover(const coord::RegisterAgentRequest& req,
                                        const AgentRecord& old) const {
  int64_t age = clock_->steadyMs() - old.last_heartbeat_ms;
  int64_t left = options_.lease_ms - age;
  log::get("coord")->warn(
      "RegisterAgent for agent {} refused: its lease is live ({} ms since its last heartbeat) "
      "and the call presents no matching secret (claimed host {})",
      old.info.agent_id(), age, req.agent().hostname());
  return error(
      grpc::StatusCode::ALREADY_EXISTS,
      fmt::format("RegisterAgent for agent {} refused: the id is registered by a live agent "
                  "(host {}, last heartbeat {} ms ago) and this call does not present that "
                  "registration's secret (previous_secret); only that agent process, or an "
                  "operator (--operator-token-file), may register the id again. A restarted "
                  "agent with the same id is accepted once the old lease runs out (in {} ms)",
                  old.info.agent_id(), old.info.hostname(), age, std::max<int64_t>(left, 0)));
}

grpc::Status Membership::registerAgent(const coord::RegisterAgentRequest& req,
                                       coord::RegisterAgentReply* reply, Changes* changes,
                                       bool by_operator) {
  const coord::AgentInfo& info = req.agent();
  if (info.agent_id().empty()) {
    return error(grpc::StatusCode::INVALID_ARGUMENT, "RegisterAgent: agent_id must not be empty");
  }
  auto logger = log::get("coord");
  const AgentRecord* old = agents_.find(info.agent_id());
  std::string secret;
  if (old == nullptr) {
    secret = newAgentSecret();
    logger->info("agent {} (host {}, rpc {}) registered", info.agent_id(), info.hostname(),
                 info.rpc_address());
  } else if (old->secret.empty() || (!req.previous_secret().empty() &&
                                     matchesStored(req.previous_secret(), old->secret))) {
    // The same incarnation again (or one restored without a secret, which
    // cannot be told apart): it keeps its jobs.
    // (Only the hash is held: the secret is the one the caller presented.)
    secret = old->secret.empty() ? newAgentSecret() : req.previous_secret();
    logger->info("agent {} (host {}, rpc {}) registered again", info.agent_id(), info.hostname(),
                 info.rpc_address());
  } else if (!by_operator && clock_->steadyMs() - old->last_heartbeat_ms < options_.lease_ms) {
    // Issue 47: without the secret, a live agent's id is not taken over
    // (that ended the real agent's jobs and locked it out of its own id).
    return refuseTakeover(req, *old);
  } else {
    // A new incarnation (the old lease ran out, or an operator says so):
    // whatever the old one was part of is gone with it. Its jobs are
    // reconciled now, not when the lease check removes the old record.
    coord::AgentInfo was = old->info;
    secret = newAgentSecret();
    std::string why =
        fmt::format("agent {} (host {}) restarted: it registered again as a new incarnation",
                    was.agent_id(), was.hostname());
    logger->warn("{}; ending the jobs of the old one", why);
    dropAgentFromJobs(was, why, changes);
  }
  agents_.upsert(info, hashSecret(secret));
  reply->set_lease_ms(static_cast<uint64_t>(options_.lease_ms));
  reply->set_heartbeat_interval_ms(static_cast<uint64_t>(options_.heartbeat_interval_ms));
  reply->set_stream_heartbeat_interval_ms(
      static_cast<uint64_t>(options_.streamHeartbeatIntervalMs()));
  reply->set_agent_secret(std::move(secret));
  return grpc::Status::OK;
}

grpc::Status Membership::heartbeat(const coord::HeartbeatRequest& req, coord::HeartbeatReply* reply,
                                   Changes* changes) {
  const AgentRecord* agent = agents_.find(req.agent_id());
  if (agent == nullptr || agent->secret.empty()) {
    log::get("coord")->debug("heartbeat from unknown agent {}: told to register again",
                             req.agent_id());
    reply->set_known(false);
    return grpc::Status::OK;
  }
  if (!matchesStored(req.agent_secret(), agent->secret)) {
    log::get("coord")->warn("heartbeat for agent {} refused: wrong agent secret", req.agent_id());
    return error(grpc::StatusCode::PERMISSION_DENIED,
                 fmt::format("Heartbeat for agent {} refused: the agent secret does not match its "
                             "registration; only the agent process that registered may renew "
                             "its lease (a restarted agent calls RegisterAgent)",
                             req.agent_id()));
  }
  if (req.leaving() && changes != nullptr) {
    coord::AgentInfo info = agent->info;
    agents_.remove(req.agent_id());
    changes->lost_agents.push_back(info.agent_id());
    log::get("coord")->info("agent {} (host {}) stopped and deregistered", info.agent_id(),
                            info.hostname());
    dropAgentFromJobs(
        info, fmt::format("agent {} (host {}) stopped", info.agent_id(), info.hostname()), changes);
    reply->set_known(false);
    return grpc::Status::OK;
  }
  agents_.heartbeat(req.agent_id());
  reply->set_known(true);
  return grpc::Status::OK;
}

grpc::Status Membership::checkAgent(const char* method, const std::string& agent_id,
                                    const std::string& secret) const {
  const AgentRecord* agent = agents_.find(agent_id);
  if (agent == nullptr || agent->secret.empty()) {
    return error(grpc::StatusCode::FAILED_PRECONDITION,
                 fmt::format("{}: agent not registered: agent '{}' must call RegisterAgent first",
                             method, agent_id));
  }
  if (!matchesStored(secret, agent->secret)) {
    return error(grpc::StatusCode::PERMISSION_DENIED,
                 fmt::format("{} for agent {} refused: the agent secret does not match its "
                             "registration",
                             method, agent_id));
  }
  return grpc::Status::OK;
}

void Membership::dropAgentFromJobs(const coord::AgentInfo& agent, const std::string& why,
                                   Changes* changes) {
  for (auto& [id, job] : jobs_) {
    if (dropWaiting(job, agent.agent_id(), why)) {
      changes->touched_jobs.push_back(id);
      changes->worlds.push_back(worldOf(job, agents_));
      continue;
    }
    const JobMember* m = job.findMember(agent.agent_id());
    if (m == nullptr || m->left || !job.active()) continue;
    if (job.state == coord::RUNNING && job.elastic()) {
      dropElasticMember(job, agent.agent_id(), why, changes);
      continue;
    }
    failJob(job, why, changes);
  }
}

grpc::Status Membership::joinJob(const coord::JoinJobRequest& req, Changes* changes) {
  const std::string& job_id = req.job_id();
  const std::string& agent_id = req.agent_id();
  if (job_id.empty())
    return error(grpc::StatusCode::INVALID_ARGUMENT, "JoinJob: job_id must not be empty");
  const AgentRecord* agent = agents_.find(agent_id);
  if (agent == nullptr) {
    return error(grpc::StatusCode::FAILED_PRECONDITION,
                 fmt::format("agent not registered: agent '{}' must call RegisterAgent before "
                             "joining job {}",
                             agent_id, job_id));
  }
  if (auto st = checkAgent("JoinJob", agent_id, req.agent_secret()); !st.ok()) return st;
  if (req.local_size() <= 0) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 fmt::format("job {}: agent {} asked for local_size {}; it must be at least 1",
                             job_id, agent_id, req.local_size()));
  }
  if (req.world_size() <= 0) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 fmt::format("job {}: agent {} asked for world_size {}; it must be at least 1",
                             job_id, agent_id, req.world_size()));
  }

  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    if (req.local_size() > req.world_size()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   fmt::format("job {}: agent {} brings local_size {}, more than world_size {}",
                               job_id, agent_id, req.local_size(), req.world_size()));
    }
    if (req.min_size() < 0 || req.max_size() < 0 || req.elastic_timeout_ms() < 0 ||
        (req.min_size() > 0 && req.min_size() > req.world_size()) ||
        (req.max_size() > 0 && req.max_size() < std::max(req.world_size(), req.min_size()))) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   fmt::format("job {}: agent {} asked for an elastic job with min_size {}, "
                               "world_size {}, max_size {}; it needs 0 < min <= world <= max "
                               "(max 0: no limit) and a timeout >= 0",
                               job_id, agent_id, req.min_size(), req.world_size(),
                               req.max_size()));
    }
    Job job;
    job.id = job_id;
    job.token = hashSecret(req.token());  // only its hash is held and journaled
    job.world_size = req.world_size();
    job.created_wall_ms = clock_->wallMs();
    if (req.min_size() > 0) {
      job.min_size = req.min_size();
      job.max_size = req.max_size();
      job.elastic_timeout_ms =
          req.elastic_timeout_ms() > 0 ? req.elastic_timeout_ms() : kDefaultElasticTimeoutMs;
    }
    it = jobs_.emplace(job_id, std::move(job)).first;
    log::get("coord")->info("job {} created by agent {}: world_size {}", job_id, agent_id,
                            req.world_size());
  } else {
    Job& job = it->second;
    if (!matchesStored(req.token(), job.token)) {
      return error(grpc::StatusCode::PERMISSION_DENIED,
                   fmt::format("wrong token for job {} (agent {})", job_id, agent_id));
    }
    if (job.state == coord::RUNNING && job.elastic()) return joinElastic(job, req, *agent, changes);
    if (job.state != coord::FORMING) {
      // A retried join of a member of the sealed job is not an error.
      const JobMember* m = job.findMember(agent_id);
      if (job.state == coord::RUNNING && m != nullptr && !m->left &&
          m->local_size == req.local_size() && job.world_size == req.world_size()) {
        return grpc::Status::OK;
      }
      std::string why = job.state == coord::FAILED ? fmt::format(" ({})", job.reason) : "";
      return error(grpc::StatusCode::FAILED_PRECONDITION,
                   fmt::format("job {} is already {}{} (generation {}); agent {} cannot join it",
                               job_id, jobStateName(job.state), why, job.generation, agent_id));
    }
    // An elastic job forms with its first world_size ranks; an agent added
    // meanwhile (its trainers expect more) is taken in up to max_size.
    const int32_t limit = job.elastic() ? (job.max_size > 0 ? job.max_size : INT32_MAX) : job.world_size;
    if (!job.elastic() && job.world_size != req.world_size()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   fmt::format("job {} has world_size {} but agent {} asked for world_size {}",
                               job_id, job.world_size, agent_id, req.world_size()));
    }
    const JobMember* m = job.findMember(agent_id);
    int32_t others = job.joinedRanks() - (m != nullptr ? m->local_size : 0);
    if (others + req.local_size() > limit) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   fmt::format("job {}: agent {} with local_size {} would bring the job to {} "
                               "ranks, more than its {} {}",
                               job_id, agent_id, req.local_size(), others + req.local_size(),
                               job.elastic() ? "--max-np" : "world_size", limit));
    }
  }

  Job& job = it->second;
  if (JobMember* m = job.findMember(agent_id)) {
    m->local_size = req.local_size();
    m->info = agent->info;
  } else {
    job.members.push_back({agent_id, agent->info, req.local_size(), false});
  }
  changes->touched_jobs.push_back(job_id);
  log::get("coord")->info("job {}: agent {} joined with {} ranks ({}/{})", job_id, agent_id,
                          req.local_size(), job.joinedRanks(), job.world_size);
  if (job.joinedRanks() >= job.world_size) {
    job.world_size = job.joinedRanks();  // (more only for an elastic job)
    sealJob(job, agents_);
    log::get("coord")->info("job {}: generation {} sealed, {} agents, {} ranks", job_id,
                            job.generation, job.slots.size(), job.world_size);
    changes->worlds.push_back(worldOf(job, agents_));
  }
  return grpc::Status::OK;
}

grpc::Status Membership::leaveJob(const coord::LeaveJobRequest& req, Changes* changes) {
  auto it = jobs_.find(req.job_id());
  if (it == jobs_.end()) {
    return error(grpc::StatusCode::NOT_FOUND, fmt::format("LeaveJob: job {} not found (agent {})",
                                                          req.job_id(), req.agent_id()));
  }
  Job& job = it->second;
  // Only the job's own agents change it: the job's token, and the agent's
  // secret while it is registered (one whose lease ran out may still leave).
  if (!matchesStored(req.token(), job.token)) {
    log::get("coord")->warn("LeaveJob of job {} for agent {} refused: wrong job token", job.id,
                            req.agent_id());
    return error(grpc::StatusCode::PERMISSION_DENIED,
                 fmt::format("LeaveJob refused: wrong token for job {} (agent {}); only the "
                             "job's own agents may leave or fail it",
                             job.id, req.agent_id()));
  }
  if (const AgentRecord* agent = agents_.find(req.agent_id());
      agent != nullptr && !agent->secret.empty()) {
    if (auto st = checkAgent("LeaveJob", req.agent_id(), req.agent_secret()); !st.ok()) {
      log::get("coord")->warn("LeaveJob of job {} for agent {} refused: wrong agent secret", job.id,
                              req.agent_id());
      return st;
    }
  }
  JobMember* m = job.findMember(req.agent_id());
  if (m == nullptr && dropWaiting(job, req.agent_id(), "it left" + (req.reason().empty() ? "" : ": " + req.reason()))) {
    changes->worlds.push_back(worldOf(job, agents_));
    return grpc::Status::OK;
  }
  if (m == nullptr) {
    return error(
        grpc::StatusCode::NOT_FOUND,
        fmt::format("LeaveJob: agent {} is not a member of job {}", req.agent_id(), job.id));
  }
  changes->touched_jobs.push_back(job.id);
  if (req.failed() && job.state == coord::RUNNING && job.elastic()) {
    std::string reason = req.reason().empty()
                             ? fmt::format("agent {} reported a failure", req.agent_id())
                             : req.reason();
    dropElasticMember(job, req.agent_id(),
                      fmt::format("agent {} left: {}", req.agent_id(), reason), changes);
    return grpc::Status::OK;
  }
  if (req.failed()) {
    m->left = true;
    if (job.active()) {
      std::string reason = req.reason().empty()
                               ? fmt::format("agent {} reported a failure", req.agent_id())
                               : req.reason();
      failJob(job, std::move(reason), changes);
    }
    return grpc::Status::OK;
  }
  if (job.state == coord::FORMING) {
    std::erase_if(job.members, [&](const JobMember& x) { return x.agent_id == req.agent_id(); });
    log::get("coord")->info("job {}: agent {} left before the job formed ({}/{} ranks)", job.id,
                            req.agent_id(), job.joinedRanks(), job.world_size);
    if (job.members.empty()) {
      removeJob(job.id, fmt::format("every agent left job {} before it formed", job.id), changes);
    }
    return grpc::Status::OK;
  }
  m->left = true;
  if (job.state == coord::RUNNING) {
    bool all_left = true;
    for (const JobMember& x : job.members) all_left = all_left && x.left;
    if (all_left) finishJob(job, changes);
  }
  return grpc::Status::OK;
}

void Membership::expireLeases(Changes* changes) {
  for (const ExpiredAgent& lost : agents_.expire()) {
    const coord::AgentInfo& info = lost.info;
    changes->lost_agents.push_back(info.agent_id());
    log::get("coord")->warn("agent {} (host {}) lost: no heartbeat for {} ms (lease {} ms)",
                            info.agent_id(), info.hostname(), lost.silent_ms, options_.lease_ms);
    dropAgentFromJobs(info,
                      fmt::format("agent {} (host {}) lost: no heartbeat for {} ms",
                                  info.agent_id(), info.hostname(), lost.silent_ms),
                      changes);
  }
}

grpc::Status Membership::joinElastic(Job& job, const coord::JoinJobRequest& req,
                                     const AgentRecord& agent, Changes* changes) {
  const std::string& agent_id = req.agent_id();
  JobMember* m = job.findMember(agent_id);
  auto waiting = std::find_if(job.waiting.begin(), job.waiting.end(),
                              [&](const JobMember& x) { return x.agent_id == agent_id; });
  if (req.admit()) {
    if (m == nullptr || m->left) {
      return error(grpc::StatusCode::FAILED_PRECONDITION,
                   fmt::format("job {}: agent {} reported a commit but is not a member", job.id,
                               agent_id));
    }
    if (!job.waiting.empty()) {
      changes->touched_jobs.push_back(job.id);
      resealOrWait(job, "admitted at a commit", changes);
    }
    return grpc::Status::OK;
  }
  if (waiting != job.waiting.end() && !req.reset()) {
    if (waiting->local_size == req.local_size()) return grpc::Status::OK;  // a retried join
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 fmt::format("job {}: agent {} joined with {} ranks and now asks for {}", job.id,
                             agent_id, waiting->local_size, req.local_size()));
  }
  if (req.reset()) {
    if (m == nullptr || m->left) {
      return error(grpc::StatusCode::FAILED_PRECONDITION,
                   fmt::format("job {}: agent {} asked for a new generation but is not a member",
                               job.id, agent_id));
    }
    if (job.below_min_since_ms >= 0) return grpc::Status::OK;  // no generation to redo
    changes->touched_jobs.push_back(job.id);
    resealOrWait(job,
                 fmt::format("agent {} (host {}): {}", agent_id, agent.info.hostname(),
                             req.reason().empty() ? "asked for a new generation" : req.reason()),
                 changes);
    return grpc::Status::OK;
  }
  if (m != nullptr && !m->left) {
    if (m->local_size == req.local_size()) return grpc::Status::OK;  // a retried join
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 fmt::format("job {}: agent {} joined with {} ranks and now asks for {}", job.id,
                             agent_id, m->local_size, req.local_size()));
  }
  int32_t others = 0;
  for (const JobMember& x : job.members) {
    if (x.agent_id != agent_id) others += x.local_size;
  }
  for (const JobMember& x : job.waiting) others += x.local_size;
  if (job.max_size > 0 && others + req.local_size() > job.max_size) {
    return error(grpc::StatusCode::FAILED_PRECONDITION,
                 fmt::format("job {}: agent {} with {} ranks would bring the elastic job to {} "
                             "ranks, more than its --max-np {}",
                             job.id, agent_id, req.local_size(), others + req.local_size(),
                             job.max_size));
  }
  std::erase_if(job.members, [&](const JobMember& x) { return x.agent_id == agent_id; });
  changes->touched_jobs.push_back(job.id);
  if (job.below_min_since_ms >= 0) {  // the job is waiting for ranks: no commit to wait for
    job.members.push_back({agent_id, agent.info, req.local_size(), false});
    log::get("coord")->info("job {}: agent {} joined the elastic job below --min-np with {} ranks",
                            job.id, agent_id, req.local_size());
    resealOrWait(job,
                 fmt::format("agent {} (host {}) joined with {} ranks", agent_id,
                             agent.info.hostname(), req.local_size()),
                 changes);
    return grpc::Status::OK;
  }
  // Admitted at the job's next commit (or kAdmitWithoutCommitMs): the
  // running step is not interrupted (Horovod's "hosts updated at commit").
  job.waiting.push_back({agent_id, agent.info, req.local_size(), false});
  if (job.waiting_since_ms < 0) job.waiting_since_ms = clock_->steadyMs();
  log::get("coord")->info("job {}: agent {} waits with {} ranks to join at the next commit",
                          job.id, agent_id, req.local_size());
  changes->worlds.push_back(worldOf(job, agents_));  // tells the agents someone waits
  return grpc::Status::OK;
}

bool Membership::dropWaiting(Job& job, const std::string& agent_id, const std::string& why) {
  auto it = std::find_if(job.waiting.begin(), job.waiting.end(),
                         [&](const JobMember& x) { return x.agent_id == agent_id; });
  if (it == job.waiting.end()) return false;
  job.waiting.erase(it);
  if (job.waiting.empty()) job.waiting_since_ms = -1;
  log::get("coord")->warn("job {}: agent {} no longer waits to join: {}", job.id, agent_id, why);
  return true;
}

void Membership::dropElasticMember(Job& job, const std::string& agent_id, std::string why,
                                   Changes* changes) {
  std::erase_if(job.members, [&](const JobMember& x) { return x.agent_id == agent_id; });
  changes->touched_jobs.push_back(job.id);
  log::get("coord")->warn("job {}: {}; {} ranks remain (--min-np {})", job.id, why,
                          job.joinedRanks(), job.min_size);
  resealOrWait(job, std::move(why), changes);
}

void Membership::resealOrWait(Job& job, std::string change, Changes* changes) {
  // Whatever seals the next generation admits the agents waiting to join.
  for (JobMember& w : job.waiting) {
    change += fmt::format("; agent {} (host {}) joined with {} ranks", w.agent_id,
                          w.info.hostname(), w.local_size);
    job.members.push_back(std::move(w));
  }
  job.waiting.clear();
  job.waiting_since_ms = -1;
  if (change.rfind("admitted at a commit; ", 0) == 0) change = change.substr(22) + " (at a commit)";
  if (job.joinedRanks() >= job.min_size) {
    resealJob(job, agents_, std::move(change));
    log::get("coord")->info("job {}: generation {} sealed, {} agents, {} ranks ({})", job.id,
                            job.generation, job.slots.size(), job.world_size, job.change);
    changes->worlds.push_back(worldOf(job, agents_));
    return;
  }
  if (job.below_min_since_ms < 0) {
    job.below_min_since_ms = clock_->steadyMs();
    job.below_min_wall_ms = clock_->wallMs();
    log::get("coord")->warn("job {}: {} ranks left, below --min-np {}; waiting up to {} s for "
                            "agents to join",
                            job.id, job.joinedRanks(), job.min_size,
                            job.elastic_timeout_ms / 1000.0);
  }
}

void Membership::checkElasticTimeouts(Changes* changes) {
  int64_t now = clock_->steadyMs();
  for (auto& [id, job] : jobs_) {
    if (job.state == coord::RUNNING && !job.waiting.empty() && job.waiting_since_ms >= 0 &&
        now - job.waiting_since_ms >= kAdmitWithoutCommitMs) {
      changes->touched_jobs.push_back(id);
      resealOrWait(job, fmt::format("no commit within {} s", kAdmitWithoutCommitMs / 1000), changes);
    }
    if (job.state != coord::RUNNING || !job.elastic() || job.below_min_since_ms < 0) continue;
    if (now - job.below_min_since_ms < job.elastic_timeout_ms) continue;
    int32_t left = job.joinedRanks();
    failJob(job,
            fmt::format("job {}: {} rank{} left, below --min-np {}, for {} s", id, left,
                        left == 1 ? "" : "s", job.min_size,
                        fmt::format("{:g}", job.elastic_timeout_ms / 1000.0)),
            changes);
  }
}

void Membership::collectEndedJobs(Changes* changes) {
  int64_t now = clock_->steadyMs();
  std::vector<std::string> expired;
  for (const auto& [id, job] : jobs_) {
    if (job.ended() && now - job.ended_steady_ms >= options_.finished_job_retention_ms) {
      expired.push_back(id);
    }
  }
  for (const std::string& id : expired) {
    removeJob(id,
              fmt::format("job {} ended more than {} s ago and was forgotten", id,
                          options_.finished_job_retention_ms / 1000),
              changes);
  }
}

grpc::Status Membership::checkAccess(const std::string& job_id, const std::string& token) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return error(grpc::StatusCode::NOT_FOUND, fmt::format("job {} not found", job_id));
  }
  if (!matchesStored(token, it->second.token)) {
    return error(grpc::StatusCode::PERMISSION_DENIED,
                 fmt::format("wrong token for job {}", job_id));
  }
  return grpc::Status::OK;
}

grpc::Status Membership::world(const std::string& job_id, const std::string& token,
                               coord::World* out, const BriefForm* brief) const {
  grpc::Status st = checkAccess(job_id, token);
  if (!st.ok()) return st;
  *out = worldOf(jobs_.at(job_id), agents_, brief);
  return grpc::Status::OK;
}

coord::ListJobsReply Membership::listJobs() const {
  coord::ListJobsReply reply;
  for (const auto& [id, job] : jobs_) *reply.add_jobs() = summaryOf(job, agents_);
  return reply;
}

coord::ListAgentsReply Membership::listAgents() const {
  coord::ListAgentsReply reply;
  int64_t now = clock_->steadyMs();
  for (const auto& [id, rec] : agents_.all()) {
    coord::AgentSummary* s = reply.add_agents();
    *s->mutable_agent() = rec.info;
    s->set_last_heartbeat_age_ms(now - rec.last_heartbeat_ms);
    for (const auto& [job_id, job] : jobs_) {
      const JobMember* m = job.findMember(id);
      if (m != nullptr && !m->left && job.active()) s->add_job_ids(job_id);
    }
  }
  return reply;
}

void Membership::restoreAgent(const coord::AgentInfo& info, std::string secret) {
  if (info.agent_id().empty()) return;
  agents_.upsert(info, secret.empty() ? std::string() : storedSecret(secret));
}

void Membership::restoreJob(Job job) {
  if (job.id.empty()) return;
  job.token = storedSecret(job.token);  // a state from before issue 47 held it in clear
  if (job.ended()) {
    // Age it by the wall clock: the steady clock of the old process is gone.
    int64_t age =
        job.ended_wall_ms >= 0 ? std::max<int64_t>(0, clock_->wallMs() - job.ended_wall_ms) : 0;
    job.ended_steady_ms = clock_->steadyMs() - age;
    if (job.ended_wall_ms < 0) job.ended_wall_ms = clock_->wallMs();
  } else {
    job.ended_steady_ms = -1;
    job.ended_wall_ms = -1;
    if (job.below_min_wall_ms >= 0) {
      int64_t waited = std::max<int64_t>(0, clock_->wallMs() - job.below_min_wall_ms);
      job.below_min_since_ms = clock_->steadyMs() - waited;
    } else {
      job.below_min_since_ms = -1;
    }
    job.waiting_since_ms = job.waiting.empty() ? -1 : clock_->steadyMs();
    for (const JobMember& m : job.waiting) {
      if (agents_.find(m.agent_id) == nullptr) {
        coord::AgentInfo info = m.info;
        info.set_agent_id(m.agent_id);
        agents_.upsert(info, "");
      }
    }
    for (const JobMember& m : job.members) {
      if (!m.left && agents_.find(m.agent_id) == nullptr) {
        coord::AgentInfo info = m.info;
        info.set_agent_id(m.agent_id);
        agents_.upsert(info, "");
      }
    }
  }
  std::string id = job.id;
  jobs_.insert_or_assign(std::move(id), std::move(job));
}

const Job* Membership::findJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void Membership::failJob(Job& job, std::string reason, Changes* changes) {
  if (!job.active()) return;  // the first failure wins
  job.state = coord::FAILED;
  job.reason = std::move(reason);
  job.ended_steady_ms = clock_->steadyMs();
  job.ended_wall_ms = clock_->wallMs();
  changes->touched_jobs.push_back(job.id);
  log::get("coord")->warn("job {} FAILED (generation {}): {}", job.id, job.generation, job.reason);
  changes->worlds.push_back(worldOf(job, agents_));
}

void Membership::finishJob(Job& job, Changes* changes) {
  job.state = coord::FINISHED;
  job.ended_steady_ms = clock_->steadyMs();
  job.ended_wall_ms = clock_->wallMs();
  changes->touched_jobs.push_back(job.id);
  log::get("coord")->info("job {} FINISHED (generation {}): every agent left cleanly", job.id,
                          job.generation);
  changes->worlds.push_back(worldOf(job, agents_));
}

void Membership::removeJob(const std::string& job_id, std::string reason, Changes* changes) {
  // `job_id` may be the erased job's own id (job.id): copy it first.
  std::string id = job_id;
  jobs_.erase(id);
  log::get("coord")->info("job {} removed: {}", id, reason);
  changes->removed.push_back({std::move(id), std::move(reason)});
}

}  // namespace kolo::coordinator
