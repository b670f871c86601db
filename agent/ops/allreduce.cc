// Allreduce (and barrier, a zero-byte allreduce): the k local slots are
// reduced in place, or into the ranks' output slots out of place, on the
// local executor; across agents, the cross leg (agent/ops/cross_leg.cc,
// cross_plan.h) reduces them into staging, or works on the one rank's slot,
// and the agents' result comes back into every slot (finishCrossOnLoop).
#include <algorithm>
#include <cstdlib>

#include "agent/core/local_executor.h"
#include "agent/ipc/client_conn.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"

namespace kolo {

namespace {

class AllreduceOp final : public CollectiveOp {
 public:
  CollectiveType type() const override { return CollectiveType::kAllreduce; }
  void runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                 std::vector<uint64_t> handles) const override;

 private:
  static void runSplitOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                             const std::vector<uint64_t>& handles);
};

}  // namespace

const CollectiveOp& allreduceOp() {
  static const AllreduceOp op;
  return op;
}

// Split reduction (ipc_layout.h kSubmitFlagSplit): the ranks reduce the
// op themselves. The agent checks that every local rank split it against
// the arenas it last sent them, writes each rank's slot offset into every
// rank's SplitHeader and completes the op with kSplitGo; anything else
// (a joined rank, a rank that did not split it, an older epoch) completes
// every rank's op with kSplitRetry, and the trainers resubmit it whole.
void AllreduceOp::runSplitOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                 const std::vector<uint64_t>& handles) {
  const SubmitDesc& d0 = op.descs[0];
  const int n = job.localSize();
  const uint64_t header = splitHeaderBytes(n);
  bool go = job.world().cross_size == 1 && !op.anyAbsent() && job.split_epoch != 0 &&
            static_cast<int>(op.descs.size()) == n && static_cast<int>(job.split_conns.size()) == n;
  std::vector<SplitHeader*> headers;
  for (int i = 0; go && i < n; ++i) {
    const SubmitDesc& d = op.descs[static_cast<size_t>(i)];
    ClientConn* c = job.client(i);
    if (c == nullptr) return rankLeft(host, job, handles);
    const ArenaLayout layout = ArenaLayout::compute(c->arenaBytes());
    go = (d.flags & kSubmitFlagSplit) != 0 && d.split_epoch == job.split_epoch &&
         c->id() == job.split_conns[static_cast<size_t>(i)] &&
         d.data_offset >= layout.data_offset + header;  // (validate(): aligned, inside the data)
    if (go) headers.push_back(reinterpret_cast<SplitHeader*>(c->slot(d.data_offset - header)));
  }
  const auto dtype = static_cast<DataType>(d0.dtype);
  if (!go) {
    host.finishSplitOnLoop(job.id(), handles, 0, kSplitRetry, dtype, {});
    return;
  }
  const uint64_t seq = ++job.split_seq;
  for (SplitHeader* h : headers) {
    h->reduced.store(0, std::memory_order_relaxed);
    h->done.store(0, std::memory_order_relaxed);
    h->seq.store(seq, std::memory_order_relaxed);
    for (int j = 0; j < n; ++j) h->slot_offset[j] = op.descs[static_cast<size_t>(j)].data_offset;
  }
  host.observeNegotiation(std::chrono::duration<double>(op.ready_at - op.first_arrival).count());
  host.opTimeline().opStart(op.name, CollectiveType::kAllreduce);
  std::vector<int64_t> shape(d0.shape, d0.shape + std::min<int>(d0.ndim, kMaxDims));
  host.opTimeline().opEnd(op.name, dtype, shape);
  // (the completion's release publishes the offsets)
  host.finishSplitOnLoop(job.id(), handles, d0.data_bytes, kSplitGo, dtype, op.first_arrival);
}

void AllreduceOp::runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                            std::vector<uint64_t> handles) const {
  const SubmitDesc& d0 = op.descs[0];
  if (plan.path == OpPath::kNothing) {
    host.finishOpOnLoop(job.id(), handles, 0, okStatus(), static_cast<DataType>(d0.dtype), {},
                        CollectiveType::kAllreduce);
    return;
  }
  if (plan.path == OpPath::kSplit) return runSplitOnLoop(host, job, op, handles);
  LocalReduce r;
  r.dtype = static_cast<DataType>(d0.dtype);
  r.op = plan.reduce;
  r.count = plan.count;
  r.prescale = plan.prescale;
  r.postscale = plan.postscale;
  // Out of place with both tensors in the shared arena: the result goes to
  // the rank's output slot and its input is left as it was.
  std::vector<void*> outs;
  for (size_t i = 0; i < op.descs.size(); ++i) {
    if (!op.absent.empty() && op.absent[i]) continue;  // joined: contributes zeros
    ClientConn* c = job.client(static_cast<int>(i));
    if (c == nullptr) return rankLeft(host, job, handles);
    const SubmitDesc& d = op.descs[i];
    const bool oop = d.out_bytes > 0 && d.out_offset != d.data_offset;
    r.keepalive.push_back(c->arena());
    if ((d.flags & kSubmitFlagUserMemory) != 0) {
      // Direct: the rank's tensor stays in its own memory (validated by
      // ClientConn::validateDirect; the pid is the connection's).
      r.remote_slots.resize(r.slots.size());
      r.remote_dsts.resize(outs.size());
      r.slots.push_back(nullptr);
      outs.push_back(nullptr);
      r.remote_slots.push_back({c->direct_proc, d.data_offset});
      r.remote_dsts.push_back({c->direct_proc, oop ? d.out_offset : d.data_offset});
      continue;
    }
    r.slots.push_back(c->slot(d.data_offset));
    outs.push_back(oop ? c->slot(d.out_offset) : r.slots.back());
    if ((d.flags & kSubmitFlagStreamed) != 0) {
      // Still being copied in (validated: the count lies in the cache line
      // before the input, inside the arena that r.keepalive keeps mapped).
      // The result's final-bytes count, where the result lands in that slot.
      char* line = c->slot(d.data_offset - kStreamedHeaderBytes);
      r.streamed.push_back(
          {reinterpret_cast<const std::atomic<uint64_t>*>(line), static_cast<int>(i),
           oop ? nullptr : reinterpret_cast<std::atomic<uint64_t>*>(line + kStreamedFinalOffset)});
    }
  }
  if (plan.streamed && plan.placement == OpPlacement::kOneAgent) {
    // Only the cross-agent leg waits for a streamed input (libkolo streams
    // only across agents): refuse rather than reduce a half-copied tensor.
    host.finishOpOnLoop(job.id(), handles, 0,
                        invalidArgument("allreduce of tensor '" + op.name +
                                        "' was streamed into the arena in a job on one agent"),
                        r.dtype, {}, CollectiveType::kAllreduce);
    return;
  }
  const bool direct = plan.memory == OpMemoryKind::kDirect;
  if (plan.out_of_place) r.dsts = outs;
  if (direct) r.error = std::make_shared<FirstError>();
  if (plan.zero_source) {
    // Min, Max, Product: the joined ranks' zeros change the result, so one
    // zero source stands for them (Sum and Average need none).
    if (r.dsts.empty()) r.dsts = r.slots;
    auto zeros =
        std::shared_ptr<char>(static_cast<char*>(std::calloc(d0.data_bytes + 64, 1)), std::free);
    r.slots.push_back(zeros.get());
    r.scratch = zeros;
  }
  if (plan.placement == OpPlacement::kAcrossAgents) {
    runCrossLegOnLoop(host, job, std::move(op), std::move(r), std::move(handles), &plan.leg);
    return;
  }
  InFlight in_flight = job.beginExecuting();
  uint64_t bytes = d0.data_bytes;
  std::string job_id = job.id();
  host.opTimeline().opStart(op.name, CollectiveType::kAllreduce);
  host.opTimeline().activityStart(op.name, direct ? "DIRECT_REDUCE" : "LOCAL_REDUCE");
  std::vector<int64_t> shape(d0.shape, d0.shape + std::min<int>(d0.ndim, kMaxDims));
  host.observeNegotiation(std::chrono::duration<double>(op.ready_at - op.first_arrival).count());
  std::shared_ptr<FirstError> error = r.error;
  host.reduceOpOnLoop(std::move(r), [h = &host, in_flight, job_id, handles = std::move(handles),
                                     bytes, name = op.name, dtype = static_cast<DataType>(d0.dtype),
                                     shape, started = op.first_arrival, error]() mutable {
    h->opTimeline().activityEnd(name);
    h->opTimeline().opEnd(name, dtype, shape);
    in_flight.end();
    Status st = error ? error->get() : okStatus();
    if (error && st.isOk()) h->observeDirect(bytes);
    if (!st.isOk()) st = st.withContext("allreduce of tensor '" + name + "' (direct user memory)");
    h->finishOpOnLoop(job_id, handles, st.isOk() ? bytes : 0, st, dtype, started,
                      CollectiveType::kAllreduce);
  });
}

}  // namespace kolo
