// The cross-agent side of one job generation: a negotiation thread that runs
// cycles over the Backend (see negotiation_state.h) and posts the data
// collectives in the agreed order. Every collective this job puts on the
// backend is posted from this one thread, so every agent posts the same
// sequence. Results are posted to the agent loop.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "agent/backends/backend.h"
#include "agent/cross/negotiation_state.h"
#include "common/event_loop.h"
#include "common/metrics.h"

namespace kolo {

struct CrossWork {
  CrossRequest req;
  void* staging = nullptr;  // locally reduced data, reduced in place across agents
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  CollectiveType collective = CollectiveType::kAllreduce;
  int root = 0;  // broadcast: the cross rank of the agent hosting the root rank
  // Allgather: bytes each agent contributes, by cross rank; `staging` holds
  // the whole output (count bytes), this agent's block already in place.
  std::vector<size_t> block_bytes;
  // Reducescatter: elements of each agent's block, by cross rank; `staging`
  // holds the locally reduced tensor (count elements).
  std::vector<size_t> block_counts;
  // Alltoall: bytes sent to / received from each agent (blocks of `send` and
  // `staging` in cross-rank order).
  const void* send = nullptr;
  std::vector<size_t> send_bytes, recv_bytes;
  std::shared_ptr<void> keep;  // owns `staging` when the negotiation thread made it (join stand-in)
};

namespace timeline {
class Timeline;
}
using timeline::Timeline;

struct CrossJobOptions {
  size_t cache_capacity = 1024;
  std::chrono::milliseconds idle_cycle{100};
  std::chrono::milliseconds collective_timeout{30000};
  uint64_t fusion_threshold_bytes = 128ull << 20;  // 0 disables fusion
  Timeline* timeline = nullptr;                    // optional; thread-safe recorder
  metrics::Gauge* fusion_fill = nullptr;           // optional
  // The job's layout (by cross rank): first global rank and rank count of
  // each agent. A node standing in for joined ranks needs it to take part in
  // an allgather with zero rows.
  std::vector<int> rank_offsets, local_sizes;
};

class CrossJob {
 public:
  // on_done(name, status) runs on the agent loop.
  using DoneOnLoop = std::function<void(const std::string& name, Status st)>;

  CrossJob(std::string label, std::unique_ptr<Backend> backend, CrossJobOptions options, EventLoop& loop,
           DoneOnLoop on_done);
  ~CrossJob();

  void submit(CrossWork work);  // thread-safe (called from the loop)
  // Every local rank has joined (kolo_join): from now until `join` (the
  // "__kolo.join.<n>" allreduce) completes, this agent stands in for them
  // and contributes zeros to every allreduce the others negotiate.
  void submitJoin(CrossWork join);
  void abort(Status why);       // thread-safe; fails everything in flight
  Backend& backend() { return *backend_; }

 private:
  void run();
  Status cycle();
  Status syncCollective(const std::function<void(Backend::Done)>& post);
  // Posts the agreed data collectives in the agreed order, fusing
  // consecutive compatible allreduces.
  void postData(std::vector<CrossWork> works);
  void postAllreduces(std::vector<CrossWork> works);
  void postOther(CrossWork work);
  // A joined agent's part in a collective it never submitted: zeros for an
  // allreduce, zero rows for an allgather (sized from the "<name>.__sizes"
  // allreduce it stood in for before). An empty status or an error.
  StatusOr<CrossWork> zeroContribution(const CrossResponse& r);

  std::string label_;
  std::unique_ptr<Backend> backend_;
  NegotiationState state_;
  CrossJobOptions options_;
  EventLoop& loop_;
  DoneOnLoop on_done_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CrossWork> incoming_;
  bool stop_ = false;
  bool joined_ = false;     // standing in for joined ranks (mu_)
  std::string join_name_;   // (mu_)
  Status aborted_;
  std::unordered_map<std::string, CrossWork> waiting_;  // negotiating, thread-owned
  // Grouped allreduce (thread-owned): agreed members waiting for the rest of
  // their group (with whether this agent submitted them), and failed groups.
  struct HeldGroup {
    std::vector<std::pair<CrossWork, bool>> works;
  };
  std::map<uint64_t, HeldGroup> held_groups_;
  std::map<uint64_t, Status> failed_groups_;
  // While standing in: results of the "<name>.__sizes" allreduces (every
  // rank's first dimension of the allgather that follows), thread-owned.
  std::map<std::string, std::shared_ptr<void>> stand_in_sizes_;
  std::thread thread_;
};

}  // namespace kolo
