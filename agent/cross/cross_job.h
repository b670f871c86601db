// The cross-agent side of one job generation: a negotiation thread that runs
// cycles over the Backend (see negotiation_state.h) and posts the data
// collectives in the agreed order. Every collective this job puts on the
// backend is posted from this one thread, so every agent posts the same
// sequence. Results are posted to the agent loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>

#include "agent/autotune/autotuner.h"
#include "agent/backends/backend.h"
#include "agent/cross/cycle_message.h"
#include "agent/cross/negotiation_state.h"
#include "agent/gpu/device_cross.h"
#include "common/event_loop.h"
#include "common/metrics.h"
#include "common/worker_pool.h"

namespace kolo {

// Allgather: bytes each agent contributes, by cross rank; CrossWork::staging
// holds the whole output (count bytes), this agent's block already in place.
struct AllgatherBlocks {
  std::vector<size_t> bytes;
};
// Reducescatter: elements of each agent's block, by cross rank;
// CrossWork::staging holds the locally reduced tensor (count elements).
struct ReducescatterBlocks {
  std::vector<size_t> counts;
};
// Alltoall: bytes sent to / received from each agent (blocks of `send` and
// of CrossWork::staging in cross-rank order).
struct AlltoallBlocks {
  const void* send = nullptr;
  std::vector<size_t> send_bytes, recv_bytes;
};

struct CrossWork {
  CrossRequest req;
  void* staging = nullptr;  // locally reduced data, reduced in place across agents
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  CollectiveType collective = CollectiveType::kAllreduce;
  int root = 0;  // broadcast: the cross rank of the agent hosting the root rank
  // The collective's own layout across agents (the one `collective` names;
  // none for allreduce and broadcast).
  std::variant<std::monostate, AllgatherBlocks, ReducescatterBlocks, AlltoallBlocks> blocks;
  std::shared_ptr<void> keep;  // owns `staging` when the negotiation thread made it (join stand-in)
  // A large allreduce, pipelined (Agent::executeCrossOnLoop): `fill(b, e)`
  // reduces the local ranks' elements [b, e) into `staging`, and `drain(b,
  // e)` writes the agents' result for [b, e) into the ranks' slots. Either
  // may be empty (nothing to do). Unfused, the work is posted in chunks:
  // the negotiation thread fills each chunk just before posting it, so
  // filling chunk k+1 overlaps the transfer of chunk k, and the job's drain
  // thread drains each chunk as soon as it is reduced; the result then says
  // `drained`. Whether an allreduce goes in chunks is the agents' agreed
  // choice (AgreedParams::pipeline_bytes), not the agent's: when it does
  // not (too small, fused or inline), it is filled whole first and the
  // agent copies the result out as for any other work.
  std::function<void(size_t, size_t)> fill, drain;
  // Posted in chunks: called on the drain thread, in order, once elements
  // [0, end) of the result are final in the ranks' slots (each chunk
  // reduced by the agents and drained), so the trainers can copy them out
  // while later chunks still move (streamed copy-out). Empty: nobody reads
  // the result before the op completes.
  std::function<void(size_t end)> published;
  // Out of place with one local rank (the rank's input slot, `staging` being
  // its output slot): posted in chunks, each chunk is reduced by the backend
  // from `input` into `staging` and `fill` is skipped; otherwise `fill`
  // copies it in first.
  const void* input = nullptr;
  // Streamed copy-in (agent/core/streamed_input.h): blocks until the local
  // ranks' inputs hold elements [0, end), the job stops, or no byte came for
  // `stall` (the op then fails the job). Called before anything reads
  // elements below `end` (fill, the backend on the slot, packing); empty:
  // the inputs are complete.
  std::function<void(size_t end, const std::atomic<bool>& stop, std::chrono::milliseconds stall)>
      await_input;
  // Device tensors over NCCL (agent/ops/device_cross_nccl.cc): posts the
  // collective on the job's NCCL backend instead of the host one, in the
  // agreed order (never fused, inline or pipelined: every agent of the
  // generation made the same device-cross choice).
  std::function<void(Backend& nccl, Backend::Done done)> device_post;
};

namespace timeline {
class Timeline;
}
using timeline::Timeline;

struct CrossJobOptions {
  size_t cache_capacity = 1024;
  std::chrono::milliseconds idle_cycle{100};
  std::chrono::milliseconds collective_timeout{30000};
  // After a cycle, and while a cycle's collective runs, the negotiation
  // thread polls (yielding) this long before it sleeps on its condition
  // variable or future: a small collective's next name, or the answer of
  // its one round trip, usually comes sooner than a wake-up would
  // (the agent's --spin-us; 0 = sleep at once).
  std::chrono::microseconds spin{0};
  uint64_t fusion_threshold_bytes = 128ull << 20;  // 0 disables fusion
  uint64_t small_message_bytes = 64 * 1024;        // the backend's configured switch point
  // A fused buffer larger than this goes to the backend as several
  // collectives of at most this many bytes: packing chunk i+1 overlaps the
  // transfer of chunk i, and each chunk is unpacked as soon as it is
  // reduced. 0 = one collective per fused buffer.
  uint64_t fusion_chunk_bytes = 8ull << 20;
  // Tensors of at least this size cross agents on their own, unfused (0: no limit).
  uint64_t fusion_max_tensor_bytes = 1024 * 1024;
  // Cached allreduces of up to this many bytes travel inside the cycle's
  // negotiation message (at most kInlineRegionBytes of them per cycle):
  // agreed and reduced in one round trip. 0: never.
  uint64_t inline_bytes = 256;
  // Unfused allreduces of at least this many bytes are posted in chunks
  // (postPipelined), their fill/drain overlapping the transfers. The
  // leader's value holds for every agent (each must post the same
  // collectives). 0: never.
  uint64_t pipeline_bytes = 8ull << 20;
  Timeline* timeline = nullptr;                    // optional; thread-safe recorder
  metrics::Gauge* fusion_fill = nullptr;           // optional
  // Set: the job's leader agent (cross rank 0) tunes the fusion threshold and
  // the backend's small/large switch point online (see docs/fusion-and-timeline.md).
  std::optional<autotune::AutotuneOptions> autotune;
  // The job's layout (by cross rank): first global rank and rank count of
  // each agent. A node standing in for joined ranks needs it to take part in
  // an allgather with zero rows.
  std::vector<int> rank_offsets, local_sizes;
};

// Where a completed collective's result is, when it is not in the work's
// own staging buffer: `data` (a fused allreduce's bytes of this tensor, in
// the fused buffer) stays valid while `keep` is held.
struct CrossResult {
  const void* data = nullptr;
  std::shared_ptr<void> keep;
  bool drained = false;  // the work's `drain` has put the whole result into the ranks' slots
};

class CrossJob {
 public:
  // on_done(name, status, result) runs on the agent loop; result.data is
  // null when the result is in the work's staging buffer.
  using DoneOnLoop = std::function<void(const std::string& name, Status st, const CrossResult& result)>;

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
  // How the generation's device tensors cross agents (agent/core/nccl_comm.h)
  // and, with NCCL, its communicator, aborted with the host backend and
  // destroyed before it. Set on the loop before any device op is submitted.
  void setDeviceCross(gpu::DeviceCrossChoice choice, std::unique_ptr<Backend> nccl);
  const gpu::DeviceCrossChoice& deviceCross() const { return device_cross_; }

 private:
  void run();
  Status cycle();
  // The cycle's message across agents: Min-reduced, or (with inline
  // allreduces) this agent's payloads filled in and the whole allgathered.
  Status exchangeCycleMessage(CycleMessage& msg);
  // Every agent's announcements of new names, by cross rank.
  Status gatherAnnouncements(std::vector<std::string>& gathered);
  // One agreed response: its work (or a joined agent's stand-in) goes to
  // `data`, is held with its group, or completes at once.
  Status takeAgreed(CrossResponse& r, std::vector<CrossWork>& data);
  // A grouped allreduce's member: held until its whole group is agreed
  // (then all go to `data`, next to each other), or failed with the group.
  void holdGroupMember(const CrossResponse& r, CrossWork w, bool mine,
                       std::vector<CrossWork>& data);
  // Fails group r.params.group_id because of member r's `err`: the held and
  // still-negotiating members complete with the group's error.
  void failGroup(const CrossResponse& r, const Status& err);
  // Posts on_done_ to the loop (any thread).
  void postDone(const std::string& name, const Status& st, CrossResult result = {});
  Status syncCollective(const std::function<void(Backend::Done)>& post);
  // Polls `ready` (yielding) for up to options_.spin.
  void spinUntil(const std::function<bool()>& ready) const;
  // Posts the agreed data collectives in the agreed order, fusing
  // consecutive compatible allreduces.
  void postData(std::vector<CrossWork> works);
  void postAllreduces(std::vector<CrossWork> works);
  void postOther(CrossWork work);
  // A device tensor over NCCL (CrossWork::device_post).
  void postDevice(CrossWork work);
  // An unfused allreduce of at least the agreed pipeline_bytes: in chunks
  // (see CrossWork).
  void postPipelined(CrossWork work);
  // Runs a work's whole `fill` (once) before anything reads its staging
  // buffer, after its whole input is there (awaitInput).
  void fillWhole(CrossWork& w);
  // Streamed copy-in: waits until elements [0, end) of the work's input are
  // in the arena (CrossWork::await_input; at once without one).
  void awaitInput(const CrossWork& w, size_t end) const;
  // Consecutive allgathers, or reducescatters of one dtype and op: fused
  // while they fit the fusion threshold (cross_fuse_blocks.cc).
  void postBlocks(std::vector<CrossWork> works);
  static bool fusesWith(const CrossWork& a, const CrossWork& b);
  // Leader only: feeds the allreduce throughput measured since the last call
  // to the autotuner.
  void measureForAutotune();
  void applyAgreed(const AgreedParams& p);
  // A joined agent's part in a collective it never submitted: zeros for an
  // allreduce, zero rows for an allgather (sized from the "<name>.__sizes"
  // allreduce it stood in for before). An empty status or an error.
  StatusOr<CrossWork> zeroContribution(const CrossResponse& r);
  // An inline allreduce agreed in this cycle: reduces every agent's payload
  // of `slot` in the gathered `msg` into this agent's staging buffer and
  // completes it.
  void completeInline(const std::string& name, const CycleMessage::InlineSlot& slot,
                      const CycleMessage& msg);

  std::string label_;
  std::unique_ptr<Backend> backend_;
  gpu::DeviceCrossChoice device_cross_;
  std::unique_ptr<Backend> device_backend_;  // NCCL, with device_cross_ kNccl
  bool device_logged_ = false;               // negotiation thread
  NegotiationState state_;
  CrossJobOptions options_;
  EventLoop& loop_;
  DoneOnLoop on_done_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CrossWork> incoming_;
  std::atomic<bool> has_incoming_{false};  // !incoming_.empty(), for the spin without mu_
  bool stop_ = false;
  // stop_ or an abort, for waits outside mu_ (awaitInput).
  std::atomic<bool> quit_{false};
  bool joined_ = false;     // standing in for joined ranks (mu_)
  std::string join_name_;   // (mu_)
  Status aborted_;
  std::unordered_map<std::string, CrossWork> waiting_;  // negotiating, thread-owned
  // Negotiation-thread state: the agreed parameters in force, and the
  // leader's tuner.
  AgreedParams agreed_;
  bool agreed_in_cycle_ = false;  // agreed_ came from a cycle (so it is the same on every agent)
  // The payload region of a cycle's message holds at most this many bytes
  // of inline allreduces (or one allreduce of inline_bytes, if larger).
  static constexpr uint64_t kInlineRegionBytes = 4096;
  std::unique_ptr<autotune::Autotuner> tuner_;
  std::atomic<uint64_t> allreduced_bytes_{0};  // completed, updated by backend callbacks
  uint64_t reported_bytes_ = 0;
  std::chrono::steady_clock::time_point last_report_;
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
  // Drains pipelined allreduces' chunks (one thread, so in order); stopped
  // after the backend, so no drain runs once the destructor returns.
  std::unique_ptr<WorkerPool> drainer_;
};

}  // namespace kolo
