// The gRPC glue of `service Coordinator`. Handlers run on gRPC's threads;
// they never touch state: they post the work to the loop (Core ...OnLoop).
// Unary calls wait for the loop's answer with a deadline. Heartbeat, the
// one call every agent makes every interval, is a callback method: the loop
// answers it, no thread waits for the loop. WatchJob and KvGet, which wait
// for changes (a stream open for a job's life, a key that
// appears later), use gRPC's callback API instead: they hold no thread
// while waiting, so thousands of agents can watch (docs/coordinator.md,
// "Scale"). WatchJob is a raw method: it writes each World's bytes,
// serialized once for all watchers (watch_hub.h).
//
// Durability: a mutating call answers only once its journal records are on
// disk (when the coordinator has a state dir). Authentication: with a bearer
// token configured, RegisterAgent, JoinJob, LeaveJob and KvPut need the
// metadata "authorization: Bearer <token>" (UNAUTHENTICATED otherwise).
// Authorization is the Core's: Heartbeat, JoinJob and LeaveJob carry the
// agent's secret from RegisterAgent, JoinJob, LeaveJob, KvPut and the
// job-scoped reads the job's token. TLS and client certificates are the
// server's credentials (server.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/event_loop.h"
#include "coordinator/core.h"
#include "coordinator/ha/leader_gate.h"
#include "kolo/proto/coordinator.grpc.pb.h"

namespace kolo::coordinator {

using CoordinatorServiceBase =
    coord::Coordinator::WithRawCallbackMethod_WatchJob<coord::Coordinator::WithCallbackMethod_KvGet<
        coord::Coordinator::WithCallbackMethod_Heartbeat<coord::Coordinator::Service>>>;

class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // How long a handler waits for the loop to answer.
  static constexpr std::chrono::milliseconds kLoopTimeout{5000};

  CoordinatorService(EventLoop* loop, Core* core, const std::atomic<bool>* shutting_down,
                     std::string auth_token = "", const ha::LeaderGate* gate = nullptr)
      : loop_(loop),
        core_(core),
        sink_(core->sink()),
        shutting_down_(shutting_down),
        auth_token_(std::move(auth_token)),
        gate_(gate) {}

  grpc::Status RegisterAgent(grpc::ServerContext* ctx, const coord::RegisterAgentRequest* req,
                             coord::RegisterAgentReply* reply) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const coord::HeartbeatRequest* req,
                                      coord::HeartbeatReply* reply) override;
  grpc::Status JoinJob(grpc::ServerContext* ctx, const coord::JoinJobRequest* req,
                       coord::JoinJobReply* reply) override;
  grpc::Status LeaveJob(grpc::ServerContext* ctx, const coord::LeaveJobRequest* req,
                        coord::LeaveJobReply* reply) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJob(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::Status KvPut(grpc::ServerContext* ctx, const coord::KvPutRequest* req,
                     coord::KvPutReply* reply) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const coord::KvGetRequest* req,
                                  coord::KvGetReply* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const coord::ListJobsRequest* req,
                        coord::ListJobsReply* reply) override;
  grpc::Status ListAgents(grpc::ServerContext* ctx, const coord::ListAgentsRequest* req,
                          coord::ListAgentsReply* reply) override;

 private:
  // Runs `fn(core)` on the loop and returns its status, filling `reply`.
  // With `durable`, it then waits until the records of the call are on disk.
  template <typename Reply>
  grpc::Status onLoop(std::function<grpc::Status(Core*, Reply*)> fn, Reply* reply,
                      bool durable = false);
  // The standby answer (UNAVAILABLE "standby: ...") unless this coordinator
  // leads or runs without etcd.
  std::optional<grpc::Status> standby() const {
    return gate_ == nullptr ? std::nullopt : gate_->refusal();
  }
  // OK, or UNAUTHENTICATED when a token is required and `ctx` lacks it.
  grpc::Status checkBearer(const grpc::ServerContext* ctx, const char* method) const;

  EventLoop* loop_;
  Core* core_;                 // only dereferenced on the loop
  persist::RecordSink* sink_;  // null: in memory only; waitDurable is thread-safe
  const std::atomic<bool>* shutting_down_;
  const std::string auth_token_;  // empty: no token required
  const ha::LeaderGate* gate_;    // null: always serve (no etcd); else serve only while leading
};

}  // namespace kolo::coordinator
