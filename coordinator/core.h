// The coordinator's state, composed of focused managers: Membership (agents,
// leases, jobs, generations), KvStore (job-scoped keys) and WatchHub (World
// streams). Everything here runs on the one loop thread (...OnLoop); the
// gRPC handlers (service.cc) reach it only through EventLoop::post/call.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/event_loop.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership/membership.h"
#include "coordinator/persist/record_sink.h"
#include "coordinator/quotas.h"
#include "coordinator/watch_hub.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator {

// KvGet waits at most this long, whatever the client asks.
inline constexpr uint64_t kMaxKvWaitMs = 60 * 1000;

class Core {
 public:
  // `sink` (may be null: in memory only) receives a Record for every change
  // of the durable state; it must outlive the Core.
  Core(EventLoop* loop, MembershipOptions options, const Clock* clock,
       persist::RecordSink* sink = nullptr, WatchLimits watch_limits = {});
  ~Core();

  // Puts back a recovered state (before startOnLoop): agents with a fresh
  // lease, jobs with their state and generation, keys of known jobs.
  void restoreOnLoop(const persist::PersistedState& state);
  // The durable state now (what a snapshot holds).
  persist::PersistedState persistedStateOnLoop() const;
  // The seq of the last record handed to the sink (0: none).
  uint64_t lastRecordSeqOnLoop() const { return last_seq_; }
  persist::RecordSink* sink() const { return sink_; }

  // Group commit of job records. A "job" record holds the whole job (every
  // member), so journaling it at each join or leave costs O(members) and a
  // job of N agents forming costs O(N^2) bytes of journal. With coalescing
  // on (the server turns it on), the touched jobs are journaled once, by a
  // closure posted to the loop behind the calls already queued: a burst of
  // joins to one job writes it once. Until then jobRecordsPendingOnLoop()
  // is true, and a durable answer must take its seq from a later loop turn
  // (service.cc). Off (tests, fuzzers driving the Core by hand): each change
  // is journaled at once.
  void setCoalesceJobRecords(bool on) { coalesce_job_records_ = on; }
  bool jobRecordsPendingOnLoop() const { return !dirty_jobs_.empty(); }
  void flushJobRecordsOnLoop();

  // The tenant quotas (before serving; defaults otherwise).
  void setQuotas(const Quotas& quotas) { quotas_ = quotas; }
  const Quotas& quotas() const { return quotas_; }

  // Arms the lease-expiry and retention timers.
  void startOnLoop();
  // What those timers run (public so tests and fuzzers step them by hand).
  void expireLeasesOnLoop();
  void collectEndedJobsOnLoop();
  // Ends every watch stream and KV wait, refuses new ones, stops the timers.
  void shutdownOnLoop();

  // `by_operator`: the caller presented the operator token, which may
  // register a live agent's id without its secret (Membership::registerAgent).
  grpc::Status registerAgentOnLoop(const coord::RegisterAgentRequest& req,
                                   coord::RegisterAgentReply* reply, bool by_operator = false);
  grpc::Status heartbeatOnLoop(const coord::HeartbeatRequest& req, coord::HeartbeatReply* reply);
  grpc::Status joinJobOnLoop(const coord::JoinJobRequest& req);
  grpc::Status leaveJobOnLoop(const coord::LeaveJobRequest& req);

  // Checks the token, queues the current World on `queue` and subscribes it
  // to every later change of the job. RESOURCE_EXHAUSTED past the watch
  // limits (in total, per job).
  // `peer`: the caller's address (ServerContext::peer()), for the per-peer
  // quota of streams that are not a member agent's.
  grpc::Status watchOnLoop(const coord::WatchJobRequest& req, std::shared_ptr<WatchQueue> queue,
                           const std::string& peer = "");
  void unwatchOnLoop(const std::string& job_id, const WatchQueue* queue);

  grpc::Status kvPutOnLoop(const coord::KvPutRequest& req);
  // Calls `done` (on the loop, maybe at once) with the value, or with nullopt
  // when the key did not appear within min(wait_ms, kMaxKvWaitMs). `done` is
  // not called when an error is returned.
  using KvDone = std::function<void(std::optional<std::string>)>;
  grpc::Status kvGetOnLoop(const coord::KvGetRequest& req, KvDone done);

  coord::ListJobsReply listJobsOnLoop() const;
  coord::ListAgentsReply listAgentsOnLoop() const;

  const Membership& membership() const { return membership_; }
  const WatchAccounting& watchAccounting() const { return watch_accounting_; }

 private:
  // Journals the changes, pushes new Worlds to watchers, drops the keys and
  // watchers of removed jobs.
  void applyOnLoop(const Changes& changes);
  void recordOnLoop(persist::Record record);
  // A job's record: only the members after those its last record (since the
  // last compaction) already holds unchanged (Record::members_from), so a
  // job forming writes each member once.
  void recordJobOnLoop(const Job& job);
  grpc::Status refuseIfShuttingDown() const;
  // RESOURCE_EXHAUSTED when the join would create a job past --max-jobs or
  // put the agent in more active jobs than --max-jobs-per-agent.
  grpc::Status checkJobQuotas(const coord::JoinJobRequest& req) const;
  grpc::Status checkKvQuotas(const coord::KvPutRequest& req) const;
  // The watch ticket of `req`: a member's when its secret is the agent's
  // and the agent is in the job (or waits to join it).
  WatchAccounting::Ticket watchTicket(const coord::WatchJobRequest& req,
                                      const std::string& peer) const;

  EventLoop* loop_;
  persist::RecordSink* sink_;
  uint64_t last_seq_ = 0;
  Membership membership_;
  KvStore kv_;
  WatchHub watches_;
  WatchLimits watch_limits_;
  Quotas quotas_;
  WatchAccounting watch_accounting_;
  EventLoop::TimerId lease_timer_ = 0;
  EventLoop::TimerId retention_timer_ = 0;
  bool shutting_down_ = false;
  bool coalesce_job_records_ = false;
  std::set<std::string> dirty_jobs_;  // touched, not yet journaled
  // Each job's members and slots as its last record left them
  // (recordJobOnLoop); cleared by a compaction, whose snapshot holds every
  // job whole.
  struct Journaled {
    std::vector<JobMember> members;
    std::vector<coord::AgentSlot> slots;
  };
  std::unordered_map<std::string, Journaled> journaled_jobs_;
  bool flush_posted_ = false;
};

}  // namespace kolo::coordinator
