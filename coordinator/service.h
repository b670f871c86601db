// The gRPC glue of `service Coordinator`. Handlers run on gRPC's threads;
// they never touch state: they post the work to the loop (Core ...OnLoop).
// The calls of agents are callback methods: the loop answers them (a
// mutating one once its records are durable: DurableNotifier), and no
// thread waits meanwhile, so thousands of agents registering or joining at
// once do not queue for gRPC's threads. Heartbeat, the one call every agent
// makes every interval, goes further: HeartbeatStream carries an agent's
// heartbeats on one stream, and the heartbeats that arrive together reach
// the loop in one turn. The listings (ListJobs, ListAgents) wait for the
// loop's answer with a deadline. WatchJob and KvGet, which wait
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
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "common/worker_pool.h"
#include "coordinator/core.h"
#include "coordinator/ha/leader_gate.h"
#include "coordinator/persist/durable_notifier.h"
#include "kolo/proto/coordinator.grpc.pb.h"

namespace kolo::coordinator {

class HeartbeatStreamReactor;

using CoordinatorServiceBase = coord::Coordinator::WithCallbackMethod_HeartbeatStream<
    coord::Coordinator::WithRawCallbackMethod_WatchJob<coord::Coordinator::WithCallbackMethod_KvGet<
        coord::Coordinator::WithCallbackMethod_Heartbeat<
            coord::Coordinator::WithCallbackMethod_RegisterAgent<
                coord::Coordinator::WithCallbackMethod_JoinJob<
                    coord::Coordinator::WithCallbackMethod_LeaveJob<
                        coord::Coordinator::WithCallbackMethod_KvPut<
                            coord::Coordinator::Service>>>>>>>>;

class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // How long a handler waits for the loop to answer.
  static constexpr std::chrono::milliseconds kLoopTimeout{5000};

  // The writers that start WatchJob writes: 0 = min(8, max(2, this
  // machine's cores)).
  static int watchWritersFor(int requested);

  CoordinatorService(EventLoop* loop, Core* core, const std::atomic<bool>* shutting_down,
                     std::string auth_token = "", const ha::LeaderGate* gate = nullptr,
                     int watch_writer_threads = 0)
      : loop_(loop),
        core_(core),
        sink_(core->sink()),
        shutting_down_(shutting_down),
        auth_token_(std::move(auth_token)),
        gate_(gate),
        notifier_(sink_ == nullptr ? nullptr : std::make_unique<persist::DurableNotifier>(sink_)),
        watch_writers_("coord-watch", watchWritersFor(watch_writer_threads)) {}

  grpc::ServerUnaryReactor* RegisterAgent(grpc::CallbackServerContext* ctx,
                                          const coord::RegisterAgentRequest* req,
                                          coord::RegisterAgentReply* reply) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const coord::HeartbeatRequest* req,
                                      coord::HeartbeatReply* reply) override;
  grpc::ServerBidiReactor<coord::HeartbeatRequest, coord::HeartbeatReply>* HeartbeatStream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const coord::JoinJobRequest* req,
                                    coord::JoinJobReply* reply) override;
  grpc::ServerUnaryReactor* LeaveJob(grpc::CallbackServerContext* ctx,
                                     const coord::LeaveJobRequest* req,
                                     coord::LeaveJobReply* reply) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJob(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* KvPut(grpc::CallbackServerContext* ctx, const coord::KvPutRequest* req,
                                  coord::KvPutReply* reply) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const coord::KvGetRequest* req,
                                  coord::KvGetReply* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const coord::ListJobsRequest* req,
                        coord::ListJobsReply* reply) override;
  grpc::Status ListAgents(grpc::ServerContext* ctx, const coord::ListAgentsRequest* req,
                          coord::ListAgentsReply* reply) override;

  // The operator token (empty: none): RegisterAgent carrying it as the
  // metadata "x-kolo-operator-token" may take over a live agent's id.
  void setOperatorToken(std::string token) { operator_token_ = std::move(token); }

  // Ends every HeartbeatStream with `why` (shutdown), and refuses new ones.
  void endHeartbeatStreams(const grpc::Status& why);

 private:
  friend class HeartbeatStreamReactor;
  // A heartbeat read on a stream: the loop answers it in the next batch.
  void queueHeartbeat(HeartbeatStreamReactor* stream);
  void answerHeartbeatsOnLoop();
  // A stream opened (true) or done (false).
  void trackHeartbeatStream(HeartbeatStreamReactor* stream, bool open);

  // Runs `fn(core)` on the loop and returns its status, filling `reply`.
  // With `durable`, it then waits until the records of the call are on disk.
  template <typename Reply>
  grpc::Status onLoop(std::function<grpc::Status(Core*, Reply*)> fn, Reply* reply,
                      bool durable = false);
  // Runs `fn(core, reply)` on the loop, then finishes `reactor` with its
  // status once the call's records are durable (at once without a state
  // dir); UNAVAILABLE when they cannot be made durable within kLoopTimeout.
  template <typename Reply>
  void answerDurably(grpc::ServerUnaryReactor* reactor, Reply* reply,
                     std::function<grpc::Status(Core*, Reply*)> fn);
  // The standby answer (UNAVAILABLE "standby: ...") unless this coordinator
  // leads or runs without etcd.
  std::optional<grpc::Status> standby() const {
    return gate_ == nullptr ? std::nullopt : gate_->refusal();
  }
  // OK, or UNAUTHENTICATED when a token is required and `ctx` lacks it.
  grpc::Status checkBearer(const grpc::ServerContextBase* ctx, const char* method) const;
  // The standby answer, else checkBearer's.
  grpc::Status refusal(const grpc::ServerContextBase* ctx, const char* method) const {
    if (auto st = standby(); st) return *st;
    return checkBearer(ctx, method);
  }

  EventLoop* loop_;
  Core* core_;                 // only dereferenced on the loop
  persist::RecordSink* sink_;  // null: in memory only; waitDurable is thread-safe
  const std::atomic<bool>* shutting_down_;
  const std::string auth_token_;  // empty: no token required
  std::string operator_token_;    // empty: no operator credential; set before serving
  // The call carries the operator token (constant-time compare).
  bool byOperator(const grpc::ServerContextBase* ctx) const;
  const ha::LeaderGate* gate_;    // null: always serve (no etcd); else serve only while leading
  // Finishes the mutating calls once durable (null: in memory only). Last:
  // stopped first, after the server that waits for those calls to finish.
  std::unique_ptr<persist::DurableNotifier> notifier_;

  // How long the heartbeats read on streams gather before the loop answers
  // them together (queueHeartbeat).
  static constexpr std::chrono::milliseconds kHeartbeatBatch{10};
  std::mutex hb_queue_mu_;
  std::vector<HeartbeatStreamReactor*> hb_queue_;  // read, to answer on the loop
  // Recursive: ending a stream under it may run the stream's OnDone inline.
  std::recursive_mutex hb_mu_;
  std::set<HeartbeatStreamReactor*> hb_streams_;  // open
  std::optional<grpc::Status> hb_ended_;          // endHeartbeatStreams was called

  // Start the WatchJob writes a change queues, so that the loop hands a
  // seal's Worlds (one write per agent of the job) to them and goes on
  // (WatchQueue::setWriters). Outlives the server's shutdown, which waits
  // for the streams' last writes.
  WorkerPool watch_writers_;
};

}  // namespace kolo::coordinator
