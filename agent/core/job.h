// One job as seen by one agent: its local ranks' connections, its tensor
// table, the World the coordinator sealed, and its counters. Loop-owned.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/coord/elastic_params.h"
#include "agent/core/in_flight.h"
#include "agent/core/local_executor.h"
#include "agent/core/tensor_table.h"
#include "common/job_settings.h"
#include "agent/cross/cross_job.h"
#include "agent/ops/cross_plan.h"
#include "common/dtype.h"
#include "common/shm.h"
#include "common/status.h"

namespace kolo {

class ClientConn;

// A collective's own state across agents, kept in its Job::CrossPending: each
// op type derives its own (agent/ops/<collective>.cc) and reads it back in
// its finishCrossOnLoop.
struct OpState {
  virtual ~OpState() = default;
};

enum class JobState { kForming, kRunning, kFailed, kEnding };
const char* jobStateName(JobState s);

struct JobWorld {
  uint64_t generation = 0;
  int rank_offset = 0;
  int world_size = 0;
  int cross_rank = 0;
  int cross_size = 1;
  std::vector<std::string> agents;  // "agent_id (host h)" by cross rank
  std::vector<int> rank_offsets;     // first global rank of each agent, by cross rank
  std::vector<int> local_sizes;      // ranks on each agent, by cross rank

  // The cross rank of the agent hosting `global_rank`, or -1.
  int crossRankOf(int global_rank) const {
    for (size_t i = 0; i < rank_offsets.size(); ++i) {
      if (global_rank >= rank_offsets[i] && global_rank < rank_offsets[i] + local_sizes[i]) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
};

struct JobCounters {
  uint64_t ops_done = 0;
  uint64_t bytes_done = 0;
  uint64_t ops_failed = 0;
};

class Job {
 public:
  Job(std::string id, std::string token, int world_size, int local_size);

  const std::string& id() const { return id_; }
  const std::string& token() const { return token_; }
  // The current generation's size once sealed (an elastic job's changes).
  int worldSize() const { return hasWorld() ? world_.world_size : world_size_; }
  int localSize() const { return local_size_; }
  JobState state() const { return state_; }
  const Status& failure() const { return failure_; }
  const JobWorld& world() const { return world_; }
  bool hasWorld() const { return world_.generation > 0; }
  int globalRank(int local_rank) const { return world_.rank_offset + local_rank; }

  TensorTable& table() { return table_; }
  const TensorTable& table() const { return table_; }
  JobCounters& counters() { return counters_; }
  const JobCounters& counters() const { return counters_; }

  ClientConn* client(int local_rank) const { return clients_[local_rank]; }
  const std::vector<ClientConn*>& clients() const { return clients_; }
  void attach(int local_rank, ClientConn* c) { clients_[local_rank] = c; }
  void detach(int local_rank) { clients_[local_rank] = nullptr; }
  int connectedClients() const;
  bool everConnected(int local_rank) const { return ever_connected_[local_rank]; }
  bool allLocalRanksArrived() const {
    for (bool b : ever_connected_) {
      if (!b) return false;
    }
    return true;
  }
  void markConnected(int local_rank) { ever_connected_[local_rank] = true; }
  // Elastic: the local rank may connect again (its trainer restarts).
  void markDisconnected(int local_rank) { ever_connected_[local_rank] = false; }

  void setWorld(const JobWorld& w);
  // Moves to kFailed (first failure wins) / kEnding.
  void fail(Status st);
  void setEnding(Status st);
  // The status later submissions get (failed or ending jobs).
  Status refusal() const { return failure_; }

  // Ready to run collectives: the World is known and, for a job on several
  // agents, the cross-agent backend is connected.
  bool ready() const { return hasWorld() && (world_.cross_size == 1 || cross != nullptr); }

  // Split reduction (Agent::maybeSendPeerArenasOnLoop): the connections
  // whose arenas the last PeerArenas frame carried, and its epoch (0: none
  // sent). A split op of another epoch is resubmitted whole.
  std::vector<uint64_t> split_conns;
  uint64_t split_epoch = 0;
  uint64_t split_seq = 0;  // the last split op's SplitHeader::seq

  // Cross-agent state (jobs on several agents).
  struct CrossPending {
    std::vector<uint64_t> handles;
    std::vector<void*> slots;
    // Direct user memory: where the result goes in a rank's own process
    // (parallel to slots; empty: all slots), and the first failed transfer.
    std::vector<RemoteSpan> remote_slots;
    std::shared_ptr<FirstError> error;
    // Direct and pipelined: a rank's tensor could not be read while the
    // agents' ring already ran (the other agents may have used the chunk),
    // so the whole job fails (CollectiveOp::finishedInSlotsOnLoop).
    std::shared_ptr<FirstError> read_error;
    // Streamed copy-in: a rank was still copying its tensor into the arena
    // when the op began (read_error then says if its copy stopped).
    bool streamed = false;
    std::vector<std::shared_ptr<SharedRegion>> keepalive;
    std::unique_ptr<char[], void (*)(char*)> staging{nullptr, [](char*) {}};
    // A pipelined allreduce's staging buffer (shared with the negotiation
    // and drain threads, which fill and drain it chunk by chunk).
    std::shared_ptr<char> shared_staging;
    char* stagingData() const { return staging ? staging.get() : shared_staging.get(); }
    // Allreduce and broadcast: in place (no staging buffer: the agents
    // reduce the one local rank's host slot) or staged, pipelined or not;
    // decided once by executeCrossOnLoop (agent/ops/cross_plan.h).
    CrossLegPlan leg;
    DataType dtype = DataType::kFloat32;
    size_t count = 0;
    uint64_t bytes = 0;
    double postscale = 1.0;
    SteadyTime started;
    // The collective's own state, of its op's type (agent/ops/<collective>.cc:
    // reducescatter's blocks, alltoall's send buffer and copies); null for
    // the collectives that have none, or an op that failed before it made it.
    std::unique_ptr<OpState> op_state;
    // From LocalReduce (allreduce/broadcast): kept alive with the op, and
    // run before the completions of a successful one (device staging).
    std::shared_ptr<void> scratch;
    std::function<Status()> before_finish;
    // Device tensors over NCCL (agent/ops/device_cross_nccl.cc): once the
    // agents' collective is done (`ok`) or failed, the result into the
    // ranks' device slots and their out_ready events; the op then completes
    // with its status (Agent::onCrossDoneOnLoop).
    std::function<Status(bool ok)> device_finish;
    CollectiveType collective = CollectiveType::kAllreduce;  // for metrics
    DataType report_dtype = DataType::kFloat32;               // the tensor's dtype, for metrics
    InFlight in_flight;  // counts the op in Job::executing() until it comes back
  };
  std::unique_ptr<CrossJob> cross;
  uint64_t cross_generation = 0;  // generation whose backend is being built or runs
  // The host backend the agents agreed on for cross_generation, and why
  // (agent/backends/backend_choice.h); empty until agreed.
  std::string cross_backend, cross_backend_reason;
  std::unordered_map<std::string, CrossPending> cross_pending;

  // Join (kolo_join): each local rank's pending join handle (0: none), when
  // it joined (system clock, microseconds since the epoch), the local rank
  // that joined last, and how many joins the job has completed (names the
  // next cross-agent join "__kolo.join.<n>").
  std::vector<uint64_t> join_handles;
  std::vector<int64_t> join_time_us;
  int last_joined_local = -1;
  uint64_t joins_done = 0;

  // Grouped allreduce: node-ready members waiting for the rest of their
  // group, and the groups that failed (id -> why; the newest 256).
  std::map<uint64_t, std::vector<ReadyOp>> held_groups;
  std::map<uint64_t, Status> failed_groups;

  // Elastic jobs (docs/elastic.md): the bounds given by the first trainer;
  // `suspended` is set (MEMBERSHIP_CHANGED) while the generation is broken
  // (an agent was lost) until the coordinator seals the next one; `retired`
  // holds cross-agent ops of ended generations whose buffers may still be in
  // use (by (generation, name)), dropped when they come back.
  ElasticParams elastic;
  // The job's own tuning from its trainers' environment (fusion threshold,
  // cache capacity, autotune): over the agent's configuration.
  JobSettings settings;
  Status suspended;
  std::map<std::pair<uint64_t, std::string>, CrossPending> retired;
  int waiting_agents = 0;         // agents waiting to join at the next commit
  uint64_t admit_asked_gen = 0;   // the generation whose commit already asked to admit them

  // Collectives handed to executors, the negotiation thread or a worker,
  // not yet complete (agent/core/in_flight.h): each holds a token from
  // beginExecuting() until it ends.
  int executing() const { return executing_.value(); }
  [[nodiscard]] InFlight beginExecuting() { return executing_.begin(); }
  bool coordinator_joined = false;
  bool coordinator_left = false;
  int64_t created_ms = 0;

 private:
  std::string id_;
  std::string token_;
  int world_size_;
  int local_size_;
  JobState state_ = JobState::kForming;
  Status failure_;
  JobWorld world_;
  TensorTable table_;
  JobCounters counters_;
  InFlightCount executing_;
  std::vector<ClientConn*> clients_;
  std::vector<bool> ever_connected_;
};

}  // namespace kolo
