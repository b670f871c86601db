// The agent's link to kolo-coordinator. Blocking gRPC calls run on this
// class's own threads (a heartbeat thread, one watcher per job, a worker
// for one-shot calls); results are posted to the agent loop. Nothing here
// touches agent state.
//
// Several coordinator addresses (`--coordinator A,B,C`: one leader, the
// others standbys): every call goes to the address in use and, when it
// fails with UNAVAILABLE (refused, a standby, a shutdown), moves on to the
// leader a standby names or the next address (CoordEndpoints) and goes again
// within the call's own deadline. Which calls may go again, and why, is
// written at each call below and in docs/coordinator.md. With one address
// nothing changes: no call is retried that was not retried before.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/coord/elastic_params.h"
#include "common/coord_endpoints.h"
#include "common/config_tls.h"
#include "common/event_loop.h"
#include "common/log.h"
#include "common/status.h"
#include "common/worker_pool.h"
#include "kolo/proto/coordinator.grpc.pb.h"

namespace kolo {

class CoordClient {
 public:
  using WorldCallback = std::function<void(StatusOr<coord::World>)>;

  // `address`: host:port or a comma-separated list of them (checked by
  // parseCoordinatorList; the agent's config validates it first).
  // `security`: TLS and bearer token for the coordinator (plain text and no
  // token by default). The token goes on every call; the coordinator needs it
  // on RegisterAgent, JoinJob, LeaveJob and KvPut.
  CoordClient(std::string address, coord::AgentInfo self, EventLoop& loop,
              GrpcClientSecurity security = {});
  ~CoordClient();

  // As configured ("a:1" or "a:1,b:2").
  const std::string& address() const { return address_; }
  // The address in use now.
  std::string currentAddress() const { return endpoints_.current(); }
  // Call before registerAgent: the address `kolo agents` shows for this agent.
  void setRpcAddress(const std::string& addr) { self_.set_rpc_address(addr); }
  // How long a broken watch is opened again before the job's callback gets
  // the error (30 s by default); with several addresses also the least
  // budget of JoinJob, LeaveJob and KvPut (failoverBudget). Call before
  // joinAndWatch.
  void setWatchRetry(std::chrono::milliseconds d) { watch_retry_ = d; }
  // Registers, retrying until `deadline`. Blocking; call before serving.
  Status registerAgent(std::chrono::steady_clock::time_point deadline);
  // From another thread (SIGTERM while registerAgent waits for an absent
  // coordinator): registerAgent returns Code::kAborted at once.
  void cancelRegistration();
  // Heartbeats every interval the coordinator asked for; re-registers if forgotten.
  // Failures are logged once, then at most every 30 s, and the recovery too.
  void startHeartbeats();

  // Joins the job and watches its World. `cb` runs on the agent loop for the
  // join failure (a Status) or each World received. Stops after a terminal World.
  void joinAndWatch(const std::string& job_id, const std::string& token, int local_size,
                    int world_size, WorldCallback cb, ElasticParams elastic = {});
  // Elastic jobs: asks the coordinator to seal the next generation with the
  // same agents (a local trainer restarted); `reason` says why (async).
  // admit: instead, this agent's trainers reached a commit; the agents
  // waiting to join are admitted now.
  void requestGeneration(const std::string& job_id, const std::string& token, int local_size,
                         int world_size, const std::string& reason, bool admit = false);
  // Tells the coordinator this agent is done with the job (async). It
  // carries the token the job was joined with and this agent's secret.
  void leave(const std::string& job_id, bool failed, const std::string& reason);
  void stopWatch(const std::string& job_id);

  Status kvPut(const std::string& job_id, const std::string& token, const std::string& key,
               const std::string& value);
  StatusOr<std::string> kvGet(const std::string& job_id, const std::string& token,
                              const std::string& key, std::chrono::milliseconds wait);

  // A clean stop: tells the coordinator this agent leaves (a last Heartbeat
  // with leaving set), so that it does not report it lost a lease later.
  // Blocking, bounded by `timeout`; failures are logged only.
  void deregister(std::chrono::milliseconds timeout);
  void shutdown();
  // The secret of this agent's registration (empty before the first); a new
  // one after each registration.
  std::string agentSecret() const;
  // True once heartbeats go as unary calls only (the coordinator has no
  // HeartbeatStream, or several addresses are configured).
  bool heartbeatsUnary() const { return hb_unary_seen_.load(); }

 private:
  std::atomic<bool> hb_unary_seen_{false};
  std::string address_;
  coord::AgentInfo self_;
  EventLoop& loop_;
  // Plain text: whether `address` on this host is served by an allowed
  // user (agent/coord/listener_owner.h); PERMISSION_DENIED otherwise.
  grpc::Status verifyServer(const std::string& address) const;
  mutable log::RateLimiter squat_log_;
  GrpcClientSecurity security_;
  CoordEndpoints endpoints_;
  // One channel and stub per address, made at construction (channels
  // connect lazily): the map is never changed after.
  std::map<std::string, std::unique_ptr<coord::Coordinator::Stub>> stubs_;
  coord::Coordinator::Stub& stub(const std::string& address) { return *stubs_.at(address); }
  std::atomic<bool> stop_{false};
  uint64_t heartbeat_ms_ = 1000;         // unary Heartbeat calls (RegisterAgentReply)
  uint64_t stream_heartbeat_ms_ = 1000;  // quiet heartbeats on the stream
  std::chrono::milliseconds watch_retry_{30000};
  std::thread heartbeat_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_wake_ = false;  // under hb_mu_: the heartbeat stream has news (an answer, its end)

  // Heartbeats on a HeartbeatStream (one address only): quiet heartbeats
  // (no answer unless the coordinator forgot this agent), every
  // kAskEveryBeats-th one asks for an answer; none by the next heartbeat
  // means the coordinator went silent: the stream is cancelled and a unary
  // Heartbeat goes instead. A coordinator without the method (UNIMPLEMENTED)
  // gets unary Heartbeats from then on, as does a list of addresses (their
  // failover is the unary call's, callWithFailover).
  struct HbStream;
  static constexpr uint64_t kAskEveryBeats = 5;
  std::unique_ptr<HbStream> hb_stream_;  // heartbeat thread only
  bool hb_unary_only_ = false;           // heartbeat thread only
  uint64_t hb_beats_ = 0;                // heartbeat thread only
  // Writes one heartbeat on the stream (opened if needed): OK when written;
  // else why not (UNIMPLEMENTED: the coordinator has no HeartbeatStream).
  grpc::Status streamHeartbeat();
  // Ends the stream (cancelled first if `cancel`) and returns its status.
  grpc::Status closeHeartbeatStream(bool cancel);

  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    bool cancelled = false;  // under watch_mu_
    std::thread thread;
  };
  std::mutex watch_mu_;
  std::map<std::string, std::shared_ptr<Watch>> watches_;
  // joinAndWatch's JoinJob (failover within its budget): OK or the refusal.
  coord::JoinJobRequest joinRequest(const std::string& job_id, const std::string& token,
                                    int local_size, int world_size) const;
  Status joinJob(const std::string& job_id, const std::string& token, int local_size,
                 int world_size, const ElasticParams& elastic);
  // Why a job's watch ended for good: `last`, and each address's error.
  Status lostWatch(const std::string& job_id, const grpc::Status& last,
                   const std::map<std::string, std::string>& errors) const;

  // Adds the bearer token (if any) to a call.
  void prepare(grpc::ClientContext& ctx) const;

  using Clock = std::chrono::steady_clock;
  using Rpc = std::function<grpc::Status(coord::Coordinator::Stub&, grpc::ClientContext&)>;
  // The outcome of a call and where it went.
  struct Outcome {
    grpc::Status status;
    std::string address;                        // the last address called
    std::map<std::string, std::string> errors;  // address -> its last UNAVAILABLE text
  };
  // Runs `rpc` at the address in use, each try bounded by `per_try` and all
  // by `deadline`. With several addresses a try that fails with UNAVAILABLE
  // or DEADLINE_EXCEEDED moves the address in use on and, while `deadline`
  // allows, goes again at the next address
  // (CoordEndpoints) after its backoff; `idempotent` false: only when the
  // call never reached a leader (neverReachedLeader). With one address: one
  // try, as before. `track`: where shutdown() finds the call to cancel it
  // (under register_mu_), or null.
  Outcome callWithFailover(Clock::time_point deadline, std::chrono::milliseconds per_try, bool idempotent,
                           const Rpc& rpc, grpc::ClientContext** track = nullptr);
  // The bound of one try of a unary call (JoinJob, KvPut) whose whole
  // budget is `timeout`: 5 s with several addresses, else all of it.
  std::chrono::milliseconds perTry(std::chrono::milliseconds timeout) const;
  // The whole budget of a call that must outlive a failover (JoinJob,
  // LeaveJob, KvPut): `usual` with one address; with several, at least the
  // watch retry (30 s by default), since electing a new leader takes up to
  // the election TTL (the coordinators' --lease-ms by default).
  std::chrono::milliseconds failoverBudget(std::chrono::milliseconds usual) const;
  // After a failure at `from`: where to go next; logs the switch (rate-limited).
  CoordEndpoints::Next failOver(const std::string& from, const std::string& why);
  // A call to `address` worked: tells CoordEndpoints, and logs once when
  // the agent now talks to another coordinator than before.
  void answered(const std::string& address);
  // Waits up to `d` unless stopping; false if stopping.
  bool pause(std::chrono::milliseconds d);
  // "at A" with one address, else "at A, B (A: why; B: why)" for errors.
  std::string triedText(const std::map<std::string, std::string>& errors) const;
  // The token each joined job was given (LeaveJob carries it).
  std::string jobToken(const std::string& job_id) const;

  // What binds this agent's calls to its registration (RegisterAgentReply).
  mutable std::mutex secret_mu_;
  std::string agent_secret_;                   // under secret_mu_
  std::map<std::string, std::string> tokens_;  // job id -> token, under secret_mu_
  bool replaced_logged_ = false;               // heartbeat thread only
  uint64_t heartbeat_failures_ = 0;            // in a row; heartbeat thread only
  log::RateLimiter heartbeat_log_{std::chrono::seconds(30), 1};
  log::RateLimiter switch_log_{std::chrono::seconds(10), 3};
  std::mutex answered_mu_;
  std::string answered_;  // the address that answered last, under answered_mu_
  std::atomic<bool> register_cancelled_{false};
  std::mutex register_mu_;
  grpc::ClientContext* register_ctx_ = nullptr;   // the RegisterAgent in flight, under register_mu_
  grpc::ClientContext* heartbeat_ctx_ = nullptr;  // the Heartbeat in flight, under register_mu_
  grpc::ClientContext* hb_stream_ctx_ = nullptr;  // the HeartbeatStream open, under register_mu_
  // Last, so it is destroyed first: its thread (LeaveJob, elastic requests)
  // reads the members above until it is joined.
  WorkerPool oneshot_{"coord-rpc", 1};
};

// Why a call to the coordinator at `address` failed with UNAVAILABLE or
// DEADLINE_EXCEEDED, for people: "nothing is listening at host:port (is
// kolo-coordinator running there?)" when a TCP connect is refused or times
// out, else the TLS hint (the server answers, so a TLS mismatch is plausible).
std::string coordinatorUnreachableHint(const std::string& address, const GrpcClientSecurity& s);

Status fromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace kolo
