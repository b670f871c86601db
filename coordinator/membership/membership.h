// The coordinator's membership logic: agents and their leases, jobs and
// their generations. Pure logic owned by the coordinator's loop thread (no
// locking, no I/O); time comes from the injected Clock, so tests step it.
// Results are gRPC statuses because they are exactly the RPCs' answers
// (kolo::Status has no NOT_FOUND / FAILED_PRECONDITION).
#pragma once

#include <grpcpp/support/status.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/membership/agent_registry.h"
#include "coordinator/membership/clock.h"
#include "coordinator/membership/job.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator {

constexpr int64_t kDefaultElasticTimeoutMs = 600 * 1000;
// An agent that joins a RUNNING elastic job is admitted at the job's next
// commit, or this long after it came when no commit is reported.
constexpr int64_t kAdmitWithoutCommitMs = 10 * 1000;

struct MembershipOptions {
  int64_t lease_ms = 5000;
  int64_t heartbeat_interval_ms = 1000;
  int64_t finished_job_retention_ms = 300 * 1000;
  // Heartbeats on a HeartbeatStream; 0: max(heartbeat_interval_ms, lease_ms / 3).
  int64_t stream_heartbeat_interval_ms = 0;
  int64_t streamHeartbeatIntervalMs() const {
    return stream_heartbeat_interval_ms > 0 ? stream_heartbeat_interval_ms
                                            : std::max(heartbeat_interval_ms, lease_ms / 3);
  }
};

// What a call changed that the rest of the coordinator must act on.
struct Changes {
  struct Removed {
    std::string job_id;
    std::string reason;
  };
  std::vector<coord::World> worlds;  // new Worlds, in order: push to the job's watchers
  std::vector<Removed> removed;      // forgotten jobs: drop their keys, end their watchers
  // For the journal: jobs whose stored state changed (joined, sealed,
  // failed, finished, a member left) and agents removed for a lost lease.
  std::vector<std::string> touched_jobs;
  std::vector<std::string> lost_agents;
  // Nothing to push to watchers (the journal fields are not counted).
  bool empty() const { return worlds.empty() && removed.empty(); }
};

class Membership {
 public:
  Membership(MembershipOptions options, const Clock* clock);

  // Registers the agent and mints its secret. An agent_id that is already
  // registered and does not present that registration's secret
  // (previous_secret) is a new incarnation (the agent restarted): the jobs
  // of the old one fail at once, or lose it (elastic), as on lease loss.
  // A live agent's id (its lease not run out) is registered again only with
  // that registration's secret or `by_operator` (the caller presented the
  // operator token): ALREADY_EXISTS otherwise, and nothing changes.
  grpc::Status registerAgent(const coord::RegisterAgentRequest& req,
                             coord::RegisterAgentReply* reply, Changes* changes,
                             bool by_operator = false);
  // Renews the lease. known=false for an unknown agent (or one restored
  // without a secret): it must register again. PERMISSION_DENIED when the
  // secret is not the registration's.
  // req.leaving(): the agent stops; it is forgotten and dropped from its jobs
  // (into `changes`).
  grpc::Status heartbeat(const coord::HeartbeatRequest& req, coord::HeartbeatReply* reply,
                         Changes* changes = nullptr);
  grpc::Status joinJob(const coord::JoinJobRequest& req, Changes* changes);
  grpc::Status leaveJob(const coord::LeaveJobRequest& req, Changes* changes);

  // Removes agents whose lease ran out; each active job they belong to FAILS
  // (an elastic RUNNING job loses the member instead: see dropElasticMember).
  void expireLeases(Changes* changes);
  // Fails the elastic jobs that stayed below min_size for their timeout.
  void checkElasticTimeouts(Changes* changes);
  // Forgets FAILED/FINISHED jobs older than the retention.
  void collectEndedJobs(Changes* changes);

  // OK when `agent_id` is registered and `secret` is its registration's;
  // FAILED_PRECONDITION when it is not registered (or has no secret: restored
  // from an older journal), PERMISSION_DENIED for a wrong secret.
  grpc::Status checkAgent(const char* method, const std::string& agent_id,
                          const std::string& secret) const;
  // NOT_FOUND for an unknown job, PERMISSION_DENIED for a wrong token.
  grpc::Status checkAccess(const std::string& job_id, const std::string& token) const;
  // The job's World now (after checkAccess); `brief`: as worldOf.
  grpc::Status world(const std::string& job_id, const std::string& token, coord::World* out,
                     const BriefForm* brief = nullptr) const;

  coord::ListJobsReply listJobs() const;
  coord::ListAgentsReply listAgents() const;

  const Job* findJob(const std::string& job_id) const;
  const std::map<std::string, Job>& jobs() const { return jobs_; }
  const AgentRegistry& agents() const { return agents_; }

  // Recovery (coordinator/persist): puts back an agent with a fresh lease, or
  // a job as it was journaled (replacing one of the same id). A restored job
  // keeps its state, generation and slots; its retention counts from
  // job.ended_wall_ms. Every member of an active job that is not registered
  // is put back from its JobMember info, so a dead one is found by its lease.
  void restoreAgent(const coord::AgentInfo& info, std::string secret);
  void restoreJob(Job job);
  const MembershipOptions& options() const { return options_; }

 private:
  grpc::Status refuseTakeover(const coord::RegisterAgentRequest& req, const AgentRecord& old) const;
  // FORMING/RUNNING -> FAILED with `reason` (the first failure wins).
  void failJob(Job& job, std::string reason, Changes* changes);
  void finishJob(Job& job, Changes* changes);
  void removeJob(const std::string& job_id, std::string reason, Changes* changes);
  // Elastic jobs (docs/elastic.md).
  grpc::Status joinElastic(Job& job, const coord::JoinJobRequest& req, const AgentRecord& agent,
                           Changes* changes);
  void dropElasticMember(Job& job, const std::string& agent_id, std::string why,
                         Changes* changes);
  // Seals the next generation when the members have at least min_size
  // ranks, else starts (or keeps) the wait for agents to join.
  void resealOrWait(Job& job, std::string change, Changes* changes);
  // Every active job `agent` is a member of (or waits to join) loses it as
  // if it had been lost with `why`.
  void dropAgentFromJobs(const coord::AgentInfo& agent, const std::string& why, Changes* changes);
  // Removes a waiting agent; false if it was not waiting.
  bool dropWaiting(Job& job, const std::string& agent_id, const std::string& why);

  MembershipOptions options_;
  const Clock* clock_;
  AgentRegistry agents_;
  std::map<std::string, Job> jobs_;  // by job_id
};

}  // namespace kolo::coordinator
