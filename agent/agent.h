// kolo-agent's composition root. The loop thread owns every job, client
// connection and counter; the gRPC status service, the coordinator client
// and the worker pool only post work to it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "agent/agent_config.h"
#include "agent/coord/coord_client.h"
#include "agent/core/job.h"
#include "agent/core/local_executor.h"
#include "agent/ops/op.h"
#include "agent/stall/stall_inspector.h"
#include "agent/timeline/timeline.h"

namespace kolo {
using timeline::Timeline;
}
#include "agent/core/mps_monitor.h"
#include "agent/ipc/client_conn.h"
#include "common/event_loop.h"
#include "common/fd.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/worker_pool.h"
#include "kolo/proto/agent.pb.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

class Agent : private OpHost {
 public:
  explicit Agent(AgentOptions opts);
  ~Agent();

  // Listens on the socket, registers with the coordinator, starts the gRPC
  // service and writes the ready file. Then run() serves until stop().
  Status start();
  void run();
  void stop();  // thread-safe
  // The SIGTERM/SIGINT that ended start() (while it waited for the
  // coordinator), or 0.
  int stopSignal() const { return stop_signal_; }
  EventLoop& loop() { return loop_; }
  const AgentOptions& options() const { return opts_; }

  // Snapshots for the gRPC service (loop thread).
  agentrpc::AgentStatus statusOnLoop() const;
  // Bounded (docs/security.md): at most --status-max-in-flight in-flight
  // entries per job, and none past `budget` bytes (decremented) when given.
  agentrpc::JobInfo jobInfoOnLoop(const Job& job, size_t* budget = nullptr) const;
  agentrpc::ListJobsReply listJobsOnLoop() const;
  const Job* findJobOnLoop(const std::string& id) const;
  std::string metricsText() const { return metrics_.render(); }  // any thread
  void drainOnLoop();
  void undrainOnLoop();
  // The gRPC health service name that reads NOT_SERVING while drained.
  static constexpr const char* kHealthService = "kolo.agentrpc.Agent";
  // Starts (path non-empty) or stops the timeline; returns the path in use.
  StatusOr<std::string> timelineOnLoop(bool start, const std::string& path, bool mark_cycles);

 private:
  // ipc
  void onAcceptOnLoop();
  void onSocketOnLoop(uint64_t conn_id, uint32_t events);
  void onDoorbellOnLoop(uint64_t conn_id);
  // Takes the connection's submissions (bounded batch) and flushes its
  // completions.
  void drainSubmissionsOnLoop(uint64_t conn_id);
  // The loop's hooks with --spin-us > 0 (common/ipc_layout.h, agent_polling):
  // poll every submission ring for up to spin-us, then clear the trainers'
  // agent_polling flags before the loop sleeps; set them again on waking.
  bool beforeSleepOnLoop();
  void afterSleepOnLoop();
  // Drains every connection whose submission ring has work; true if any.
  bool pollRingsOnLoop();
  void handleFrameOnLoop(ClientConn& c, const std::string& payload);
  void handleHelloOnLoop(ClientConn& c, const ipc::Hello& h);
  void grantDirectOnLoop(ClientConn& c, const ipc::Hello& h, ipc::Welcome* w);
  void refuseOnLoop(ClientConn& c, const Status& st);
  // Socket bounds (docs/security.md, "Bounds and quotas on the socket"):
  // a Refusal frame naming `frame`, then (close) the connection is dropped.
  // retry_after_ms > 0 tells libkolo the refusal is momentary (it connects
  // again within KOLO_START_TIMEOUT).
  void refuseFrameOnLoop(ClientConn& c, const Status& st, const std::string& frame, bool close,
                         int retry_after_ms = 0);
  Status trainerTimelineOnLoop(ClientConn& c, const ipc::TimelineControl& t);
  // More device event pairs for a trainer (agent_device_events.cc).
  void deviceEventsOnLoop(ClientConn& c, const ipc::DeviceEvents& e);
  void acceptOverflowOnLoop(int err);
  void pauseAcceptOnLoop();
  void closeLateHandshakesOnLoop();
  // `broke_rings`: the agent closes it (onBrokenRingOnLoop), `why` says what it did.
  void dropClientOnLoop(uint64_t conn_id, const std::string& why, bool broke_rings = false);
  void onBrokenRingOnLoop(uint64_t conn_id);
  void sendWorldOnLoop(Job& job, ClientConn& c);
  // Init is a rendezvous: trainers learn the World once the generation is
  // sealed, the backend (if any) is connected, and every local rank arrived.
  void maybeSendWorldOnLoop(Job& job);
  void maybeSendPeerArenasOnLoop(Job& job);

  // jobs and collectives
  void onWorldOnLoop(const std::string& job_id, StatusOr<coord::World> w);
  void onSubmitOnLoop(ClientConn& c, const SubmitDesc& d);
  void executeOnLoop(Job& job, ReadyOp op);
  // Grouped allreduce (agent_group.cc): holds node-ready members until the
  // whole group is, then executes them together; fails whole groups.
  void dispatchReadyOnLoop(Job& job, ReadyOp op);
  void failGroupOnLoop(Job& job, uint64_t group_id, CollectiveType coll, const Status& why);
  // Join (agent_join.cc).
  void onJoinOnLoop(Job& job, ClientConn& c, const SubmitDesc& d);
  void finishJoinOnLoop(Job& job, const Status& st, int64_t last_joined_rank);
  void onCrossJoinDoneOnLoop(Job& job, const Job::CrossPending& p, const Status& st);
  void finishOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles, uint64_t bytes,
                    const Status& st, DataType dtype = DataType::kFloat32, SteadyTime started = {},
                    CollectiveType collective = CollectiveType::kAllreduce, int64_t aux = 0);
  // OpHost (agent/ops/op.h): what the op types use of the agent.
  timeline::Timeline& opTimeline() override;
  void finishOpOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                      uint64_t bytes, const Status& st, DataType dtype, SteadyTime started,
                      CollectiveType collective) override;
  void finishSplitOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                         uint64_t bytes, int64_t aux, DataType dtype, SteadyTime started) override;
  void reduceOpOnLoop(LocalReduce r, std::function<void()> done) override;
  // Runs every copy (or reduction) on the executor; `done` once all finished.
  void copyOpAllOnLoop(std::vector<LocalReduce> copies, std::function<void()> done) override;
  void handOpToNegotiationOnLoop(const std::string& job_id, uint64_t gen, CrossWork w) override;
  uint64_t crossPipelineBytes() const override { return opts_.cross_pipeline_bytes; }
  metrics::Counter* streamedOutCounter() const override {
    return opts_.stream_copy_out ? op_metrics_.streamed_out_bytes : nullptr;
  }
  void observeNegotiation(double seconds) override;
  void observeDirect(uint64_t bytes) override;
  void observeStreamed(uint64_t bytes) override;
  void failJobForOpOnLoop(Job& job, const Status& st) override { failJobOnLoop(job, st, true); }
  Job* opJobOnLoop(const std::string& job_id) override;
  void stageDeviceThenOnLoop(std::function<Status()> work,
                             std::function<void(Status)> then) override;
  DeviceStaging deviceStaging() const override {
    return {opts_.device_staging_timeout_s * 1000, &staging_cancel_};
  }
  void postOnLoop(std::function<void()> fn) override { loop_.post(std::move(fn)); }
  uint64_t fusionThresholdBytes() const override { return opts_.fusion_threshold_bytes; }
  void updateGaugesOnLoop();
  void failJobOnLoop(Job& job, const Status& st, bool tell_coordinator);
  void endJobForRankOnLoop(Job& job, int local_rank);
  void maybeRemoveJobOnLoop(const std::string& job_id);
  void completeOnLoop(ClientConn& c, uint64_t handle, const Status& st, int64_t aux = 0);
  void startCrossOnLoop(Job& job);
  // After the local step of a cross-agent collective: gives `w` to the job's
  // negotiation thread if the job is still in generation `gen`, else fails it.
  void handToNegotiationOnLoop(const std::string& job_id, uint64_t gen, CrossWork w);
  void executeCrossOnLoop(Job& job, ReadyOp op, LocalReduce r, std::vector<uint64_t> handles);
  void onCrossDoneOnLoop(const std::string& job_id, uint64_t generation, const std::string& name, Status st,
                         const CrossResult& result = {});

  // Elastic jobs (agent_elastic.cc).
  void beginGenerationOnLoop(Job& job, uint64_t generation, const std::string& change);
  void suspendOnLoop(Job& job, const Status& why);
  void failInFlightOnLoop(Job& job, const Status& st);
  bool retiredDoneOnLoop(Job& job, uint64_t generation, const std::string& name);
  Status elasticAdmitOnLoop(const Job& job, const SubmitDesc& d) const;
  void elasticRankLostOnLoop(Job& job, int local_rank, const std::string& reason);
  void maybeAdmitAtCommitOnLoop(Job& job, const SubmitDesc& d);

  void checkStallsOnLoop();
  Status startRpcServer();
  Status writeReadyFile();

  AgentOptions opts_;
  EventLoop loop_;
  WorkerPool pool_;
  LocalExecutor executor_;
  std::unique_ptr<CoordClient> coord_;
  UniqueFd listen_fd_;
  UniqueFd signal_fd_;
  int stop_signal_ = 0;
  // registerAgent, abandoned at once on SIGTERM/SIGINT.
  Status registerWatchingSignals();
  void setDrainingOnLoop(bool draining);
  std::unique_ptr<grpc::Service> rpc_service_;
  std::unique_ptr<grpc::Server> rpc_server_;
  int rpc_port_ = 0;
  std::chrono::steady_clock::time_point started_;

  metrics::Registry metrics_;
  // Handles looked up once (the registry's lookup takes a lock).
  struct OpMetrics {
    static constexpr int kCollectives = 7;  // CollectiveType values 0..6
    metrics::Counter* ok[kCollectives][kNumDataTypes];
    metrics::Counter* failed[kCollectives][kNumDataTypes];
    metrics::Counter* bytes[kCollectives][kNumDataTypes];
    metrics::Histogram* latency[kCollectives];
    metrics::Histogram* negotiation;
    metrics::Counter* direct_bytes;
    metrics::Counter* streamed_bytes;
    metrics::Counter* streamed_out_bytes;
    metrics::Counter* split_bytes;
  } op_metrics_{};
  void initMetrics();
  std::unique_ptr<metrics::MetricsHttpServer> metrics_http_;
  std::unique_ptr<MpsMonitor> mps_;  // after metrics_: stops before it goes
  std::unique_ptr<Timeline> timeline_;
  stall::StallInspector stalls_;
  WorkerPool setup_pool_{"cross-setup", 2};  // blocking backend rendezvous, off the loop
  // Device tensors staged to the host (bounded waits on the GPU), one at a
  // time: they are ordered on the GPU's agent stream anyway.
  std::atomic<bool> staging_cancel_{false};
  WorkerPool device_stage_pool_{"device-stage", 1};
  uint64_t next_conn_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<ClientConn>> conns_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  JobCounters totals_;
  bool draining_ = false;
  bool stopping_ = false;
  // Socket bounds: connections by uid, a spare descriptor that lets accept()
  // refuse a connection when the process is out of them, whether accepting
  // is paused (EMFILE back-off), and the job whose trainer started the
  // timeline (and the file), if a trainer did.
  std::unordered_map<uid_t, int> conns_per_uid_;
  std::unordered_map<uid_t, uint64_t> table_bytes_per_uid_;  // --max-table-mb-per-uid
  void unchargeTableOnLoop(ClientConn& c, uint64_t bytes);
  UniqueFd spare_fd_;
  bool accept_paused_ = false;
  std::string timeline_job_;
  std::string timeline_job_path_;
};

}  // namespace kolo
