// Operations as objects: one type per collective (agent/ops/<collective>.cc),
// looked up in a table by the collective a trainer submitted, instead of
// branches on the collective through the agent.
//
//   validateOnLoop  per rank, at submission, before the tensor table: what
//                   the rank left in shared memory (a private copy in *meta)
//   runOnLoop       once the name is node-ready: the local part on the
//                   executor; across agents, the staging buffer and the
//                   CrossWork handed to the job's negotiation thread
//   finishCrossOnLoop  across agents, once the agents' collective succeeded
//                   (Agent::onCrossDoneOnLoop): the result into the ranks'
//                   slots, then the completions (OpHost::finishOpOnLoop)
//
// The op types hold no state between ops: each op's state is in the
// ReadyOp, the lambdas it hands to the executor and, across agents, its
// Job::CrossPending, whose op_state is of the op type's own OpState type.
// Agent::executeOnLoop hands each op to its memory kind (agent/ops/memory.h),
// chosen once: host memory runs the op type; device tensors take the device
// path (docs/gpu.md) before any op type sees them. Join has its own path
// (agent_join.cc). Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/core/job.h"
#include "agent/core/local_executor.h"
#include "agent/core/tensor_table.h"
#include "agent/ops/op_plan.h"
#include "common/dtype.h"
#include "common/status.h"

namespace kolo {

class ClientConn;
namespace metrics {
class Counter;
}
namespace timeline {
class Timeline;
}

// What an op needs from the agent (Agent implements it).
class OpHost {
 public:
  virtual ~OpHost() = default;
  virtual timeline::Timeline& opTimeline() = 0;
  // Completes the op on every local rank (`handles` by local rank, 0: a
  // joined rank), counts it, and removes the job if nothing is left.
  virtual void finishOpOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                              uint64_t bytes, const Status& st, DataType dtype, SteadyTime started,
                              CollectiveType collective) = 0;
  // Split reduction (ipc_layout.h kSubmitFlagSplit): completes the op on
  // every local rank with `aux` (kSplitGo: the ranks reduce it themselves,
  // counted as `bytes` done; kSplitRetry: they resubmit it whole).
  virtual void finishSplitOnLoop(const std::string& job_id, const std::vector<uint64_t>& handles,
                                 uint64_t bytes, int64_t aux, DataType dtype,
                                 SteadyTime started) = 0;
  // The local executor: one reduction or copy, or several (`done` once all
  // finished); `done` runs on the loop.
  virtual void reduceOpOnLoop(LocalReduce r, std::function<void()> done) = 0;
  virtual void copyOpAllOnLoop(std::vector<LocalReduce> copies, std::function<void()> done) = 0;
  // Across agents: the hand-over of a prepared CrossWork to the job's
  // negotiation thread once its local step is done (or its failure, if the
  // job moved on meanwhile), and the size from which an allreduce is
  // pipelined (--cross-pipeline-kb).
  virtual void handOpToNegotiationOnLoop(const std::string& job_id, uint64_t gen, CrossWork w) = 0;
  virtual uint64_t crossPipelineBytes() const = 0;
  // Streamed copy-out (--stream-copy-out): the counter of result bytes
  // published chunk by chunk (thread-safe), or null when it is off.
  virtual metrics::Counter* streamedOutCounter() const = 0;
  // How long the op waited for its last local rank (metrics).
  virtual void observeNegotiation(double seconds) = 0;
  // The direct user-memory path moved `bytes` of one rank's tensor in place.
  virtual void observeDirect(uint64_t bytes) = 0;
  // A streamed copy-in began: `bytes` of one rank's tensor are read as its
  // trainer copies them into the arena.
  virtual void observeStreamed(uint64_t bytes) = 0;
  // Fails the whole job on every agent (its ranks get JobFailed).
  virtual void failJobForOpOnLoop(Job& job, const Status& st) = 0;
  // The job, or null once it is gone (an op that comes back to the loop).
  virtual Job* opJobOnLoop(const std::string& job_id) = 0;
  // Runs `work` on the agent's device staging thread (it may block, bounded
  // by deviceStaging().timeout_ms; apart from the backends' setup workers,
  // so a stuck staging delays no job's rendezvous), then `then` with its
  // status on the loop (device tensors staged to the host).
  virtual void stageDeviceThenOnLoop(std::function<Status()> work,
                                     std::function<void(Status)> then) = 0;
  struct DeviceStaging {
    int64_t timeout_ms = 600'000;               // --device-staging-timeout-s
    const std::atomic<bool>* cancel = nullptr;  // set when the agent stops
  };
  virtual DeviceStaging deviceStaging() const = 0;
  // Runs `fn` on the loop after the work already there (device Tensor
  // Fusion flushes the ops that became ready in this pass of the loop).
  virtual void postOnLoop(std::function<void()> fn) = 0;
  // The agent's --fusion-threshold-mb in bytes (a job's own setting wins).
  virtual uint64_t fusionThresholdBytes() const = 0;
};

class CollectiveOp {
 public:
  virtual ~CollectiveOp() = default;
  virtual CollectiveType type() const = 0;
  // A rank's submission, after the descriptor was checked against its arena.
  virtual Status validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                                std::vector<int64_t>* meta) const;
  // The node-ready op (op.error set: it fails here and, across agents, is
  // announced to the other agents so that their ranks are released too),
  // with its plan (agent/ops/op_plan.h), computed once by HostMemory.
  virtual void runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                         std::vector<uint64_t> handles) const = 0;
  // Across agents, once the agents' collective succeeded
  // (Agent::onCrossDoneOnLoop): the result from the op's staging buffer, or
  // from the fused buffer (`result`), into the ranks' slots, then the
  // completions. `p` is the op's state, taken out of Job::cross_pending. The
  // default copies it (scaled) into every slot: allreduce, broadcast and
  // allgather.
  virtual void finishCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                                 std::shared_ptr<Job::CrossPending> p,
                                 const CrossResult& result) const;

 protected:
  // Every local rank's handle fails with the job's failure (or "a rank
  // left") when a rank's connection is gone.
  static void rankLeft(OpHost& host, Job& job, const std::vector<uint64_t>& handles);
  // finishCrossOnLoop's first steps: completes the op when nothing is left
  // to copy (no bytes, or the result already in the slots) and says so.
  static bool finishedInSlotsOnLoop(OpHost& host, Job& job, const std::string& name,
                                    const std::shared_ptr<Job::CrossPending>& p,
                                    const CrossResult& result);
  // The copy (scaled) of the result into every slot, then the completions.
  static void copyBackOnLoop(OpHost& host, Job& job, const std::string& name,
                             std::shared_ptr<Job::CrossPending> p, const CrossResult& result);

  // The steps the block collectives (allgather, alltoall, reducescatter)
  // share (agent/ops/op_steps.cc).
  //
  // The local ranks' input and output slots (the output `out_prefix` bytes
  // in) and their arenas. False when a rank's connection is gone (the op
  // then failed as rankLeft). `skip_absent`: a joined rank (op.absent) has
  // null slots.
  struct LocalSlots {
    std::vector<char*> ins, outs;
    std::vector<std::shared_ptr<SharedRegion>> keep;
  };
  static bool localSlotsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                               const std::vector<uint64_t>& handles, uint64_t out_prefix,
                               bool skip_absent, LocalSlots* slots);
  // One agent: `copies` on the executor (timeline activity `activity`),
  // then the completions, `bytes` done.
  void copiesThenFinishOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                              std::vector<uint64_t> handles, std::vector<LocalReduce> copies,
                              uint64_t bytes, DataType dtype, const char* activity) const;
  // Several agents: the request every agent negotiates for `op` (its
  // parameters without this rank's handle and offsets; op.error crosses).
  CrossWork crossWorkOf(const Job& job, const ReadyOp& op) const;
  // Several agents: `p` becomes the op's Job::CrossPending, `copies` (the
  // local step into the staging buffer) run on the executor, then `w` goes
  // to the job's negotiation thread.
  void copiesThenCrossOnLoop(OpHost& host, Job& job, const std::string& name, Job::CrossPending p,
                             CrossWork w, std::vector<LocalReduce> copies,
                             const char* activity) const;
};

// The op type of `c`, or null when the agent does not run it as an op (join,
// barrier: libkolo sends a barrier as an allreduce).
const CollectiveOp* collectiveOp(CollectiveType c);

// The cross-agent leg of an allreduce or a broadcast, once its LocalReduce
// is planned (agent/ops/cross_leg.cc): staging or in place, pipelined or not
// (agent/ops/cross_plan.h), then the job's negotiation thread.
// `planned`: the leg of the op's OpPlan (host ops); null: planned here from
// the LocalReduce (the device path's staged ops).
void runCrossLegOnLoop(OpHost& host, Job& job, ReadyOp op, LocalReduce r,
                       std::vector<uint64_t> handles, const CrossLegPlan* planned = nullptr);

// What an op's plan reads of the job (planOp).
OpWorld opWorldOf(const Job& job, uint64_t pipeline_bytes);

// One type per collective (the table's entries).
const CollectiveOp& allreduceOp();
const CollectiveOp& broadcastOp();
const CollectiveOp& allgatherOp();
const CollectiveOp& reducescatterOp();
const CollectiveOp& alltoallOp();

}  // namespace kolo
