// The cross-agent leg of an allreduce or a broadcast: the op's
// Job::CrossPending (buffers, InFlight token, the CrossLegPlan decided once
// here) and its CrossWork; the local step on the executor first unless the
// op runs in place or is pipelined; then the job's negotiation thread
// (CrossJob). Agent::onCrossDoneOnLoop and the op type's finishCrossOnLoop
// take it from there.
#include "agent/core/streamed_input.h"
#include "agent/ops/cross_plan.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {

// The op's state while the agents reduce it: where the results go (dsts: the
// output slots of out-of-place ranks, and the joined ranks' zero source is
// not written back), its scaling and its counts.
Job::CrossPending pendingOf(const ReadyOp& op, const LocalReduce& r,
                            std::vector<uint64_t> handles) {
  const SubmitDesc& d0 = op.descs[0];
  Job::CrossPending p;
  p.handles = std::move(handles);
  p.slots = r.dsts.empty() ? r.slots : r.dsts;
  p.remote_slots = r.remote_dsts;  // (parallel to p.slots)
  p.error = r.error;
  p.keepalive = r.keepalive;
  p.dtype = r.dtype;
  p.count = r.count;
  p.bytes = d0.data_bytes;
  p.postscale = r.postscale;
  p.started = op.first_arrival;
  p.collective = static_cast<CollectiveType>(d0.collective);
  p.report_dtype = static_cast<DataType>(d0.dtype);
  p.scratch = r.scratch;
  p.before_finish = r.before_finish;
  return p;
}

// What planCrossLeg decides from (agent/ops/cross_plan.h).
CrossLegInputs legInputsOf(const ReadyOp& op, const LocalReduce& r, const Job::CrossPending& p,
                           uint64_t pipeline_bytes) {
  CrossLegInputs li;
  li.ok = op.error.isOk();
  li.collective = p.collective;
  li.count = r.count;
  li.bytes = p.bytes;
  li.sources = r.slots.size();
  li.outputs = r.dsts.size();
  li.output_elsewhere = r.slots.size() == 1 && r.dsts.size() == 1 && r.slots[0] != r.dsts[0];
  li.has_scratch = r.scratch != nullptr;
  li.has_before_finish = static_cast<bool>(r.before_finish);
  li.direct = !r.remote_slots.empty();
  li.prescale = r.prescale;
  li.postscale = p.postscale;
  li.pipeline_bytes = pipeline_bytes;
  return li;
}

// The request every agent negotiates (device tensors staged through host
// look like host ones to the other agents).
CrossWork legWorkOf(const Job& job, const ReadyOp& op, const LocalReduce& r) {
  const SubmitDesc& d0 = op.descs[0];
  CrossWork w;
  w.req.name = op.name;
  w.req.params = d0;
  w.req.params.handle = 0;
  w.req.params.data_offset = w.req.params.out_offset = 0;
  w.req.params.flags = 0;
  w.req.params.device_event = 0;
  w.req.first_rank = job.globalRank(0);
  if (!op.error.isOk()) w.req.error = op.error.toString();  // its code crosses too
  w.count = op.error.isOk() ? r.count : 0;
  w.dtype = r.dtype;
  w.op = r.op;
  w.collective = static_cast<CollectiveType>(d0.collective);
  return w;
}

// Pipelined: the negotiation thread's fill of the buffer the ring reads and
// the drain thread's write-back, chunk by chunk (CrossWork::fill, drain).
void addPipelineSteps(CrossWork& w, const LocalReduce& r, const Job::CrossPending& p) {
  const CrossLegPlan& leg = p.leg;
  if (leg.copy_in)
    w.input = r.slots[0];  // the backend reads the input (no copy) when it goes in chunks
  if (leg.fills()) {
    auto in = std::make_shared<LocalReduce>(r);
    in->dsts = {w.staging};
    in->remote_dsts.clear();  // (direct: the sources stay remote)
    in->error = p.read_error;
    in->postscale = 1.0;  // applied after the agents' reduction
    // (`in` keeps the sources alive: the arenas, and a joined ranks' zero
    // source in `scratch`; the lambda keeps the staging buffer.)
    w.fill = [in, keep = p.shared_staging](size_t b, size_t e) { reduceRange(*in, b, e - b); };
  }
  if (leg.drains()) {  // (else the result is where it belongs)
    auto out = std::make_shared<LocalReduce>();
    out->dtype = r.dtype;
    out->op = ReduceOp::kSum;
    out->count = r.count;
    out->postscale = p.postscale;
    out->slots = {w.staging};
    out->dsts = p.slots;
    out->remote_dsts = p.remote_slots;  // direct: into the ranks' own memory
    out->error = p.error;
    out->keepalive = p.keepalive;
    out->scratch = p.shared_staging;  // (null when in place)
    w.drain = [out](size_t b, size_t e) { reduceRange(*out, b, e - b); };
  }
}

// Streamed copy-in: the negotiation thread waits for the input as the
// trainers copy it; streamed copy-out: each rank whose result lands in its
// input slot learns, chunk by chunk, how much of it is final (ipc_layout.h).
void addStreamedSteps(CrossWork& w, const LocalReduce& r, const CrossLegPlan& leg,
                      std::shared_ptr<StreamedInput> streamed, metrics::Counter* counter) {
  const size_t es = dataTypeSize(r.dtype);
  w.await_input = [streamed, keep = r.keepalive, es](size_t end, const std::atomic<bool>& stop,
                                                     std::chrono::milliseconds stall) {
    streamed->await(end * es, stop, stall);
  };
  std::vector<std::atomic<uint64_t>*> finals;
  for (const StreamedSource& s : r.streamed) {
    if (s.final_bytes != nullptr) finals.push_back(s.final_bytes);
  }
  if (leg.pipelined && !finals.empty() && counter != nullptr) {
    // (called in order, one chunk run at a time: `last` needs no lock)
    w.published = [finals = std::move(finals), keep = r.keepalive, es, counter,
                   last = uint64_t{0}](size_t end) mutable {
      const uint64_t bytes = end * es;
      for (std::atomic<uint64_t>* f : finals) f->store(bytes, std::memory_order_release);
      counter->inc((bytes - last) * finals.size());
      last = bytes;
    };
  }
}

// Broadcast: the agent that hosts the root fills the staging buffer with
// the root's slot; the others receive into it. The root's local rank, or
// -1 when it is on another agent.
int setBroadcastRoot(CrossWork& w, const Job& job, const ReadyOp& op) {
  const SubmitDesc& d0 = op.descs[0];
  w.root = job.world().crossRankOf(d0.root);
  int root_local = d0.root - job.world().rank_offset;
  if (root_local < 0 || root_local >= job.localSize()) root_local = -1;
  if (w.count > 0 && w.root < 0) {
    w.count = 0;
    w.req.error = "broadcast of tensor '" + op.name + "': root rank " + std::to_string(d0.root) +
                  " is on no agent of this job";
  }
  return root_local;
}

}  // namespace

void runCrossLegOnLoop(OpHost& host, Job& job, ReadyOp op, LocalReduce r,
                       std::vector<uint64_t> handles, const CrossLegPlan* planned) {
  Job::CrossPending p = pendingOf(op, r, std::move(handles));
  // In place or through a staging buffer, pipelined or not: decided once
  // (agent/ops/cross_plan.h) and kept on the op for onCrossDoneOnLoop.
  const CrossLegInputs li = legInputsOf(op, r, p, host.crossPipelineBytes());
  // A host op brings the leg its OpPlan computed from the descriptors; it
  // must be the one its local step implies (a bug otherwise: the op fails
  // on every agent below rather than run a leg its buffers do not fit).
  p.leg = planCrossLeg(li);
  const bool plan_differs = planned != nullptr && !(*planned == p.leg);
  const CrossLegPlan leg = p.leg;
  if (li.direct && leg.pipelined) p.read_error = std::make_shared<FirstError>();
  // Streamed copy-in: the trainers are still copying. Every plan a
  // streamed op can have (an allreduce of at least the pipeline size, which
  // ClientConn::validate checked) reads its input only on the negotiation
  // thread, after CrossWork::await_input; the executor never sees it.
  std::shared_ptr<StreamedInput> streamed;
  if (!r.streamed.empty() && op.error.isOk()) {
    if (!p.read_error) p.read_error = std::make_shared<FirstError>();
    p.streamed = true;
    streamed = std::make_shared<StreamedInput>(op.name, p.bytes, r.streamed, p.read_error);
    host.observeStreamed(p.bytes);
  }
  if (leg.pipelined && leg.needsStaging()) {
    p.shared_staging = staging::acquireShared(p.bytes);  // pooled: see common/staging_pool.h
  } else if (leg.needsStaging()) {
    p.staging = staging::acquire(p.bytes);
  }
  CrossWork w = legWorkOf(job, op, r);
  w.staging = leg.in_place || leg.first_slot ? p.slots[0] : p.stagingData();
  if (leg.pipelined) addPipelineSteps(w, r, p);
  if (streamed) addStreamedSteps(w, r, leg, streamed, host.streamedOutCounter());
  if (streamed && leg.localStepFirst()) {
    // Cannot happen (see above); were it to, the executor would read a
    // half-copied tensor: every agent fails the op instead.
    w.count = 0;
    w.req.error = "allreduce of tensor '" + op.name +
                  "': a streamed input reached the local step (internal error)";
  }
  if (plan_differs) {
    w.count = 0;
    w.req.error = std::string(collectiveName(w.collective)) + " of tensor '" + op.name +
                  "': its plan and its local step disagree on the cross leg (internal error)";
  }
  const int bcast_root_local =
      w.collective == CollectiveType::kBroadcast ? setBroadcastRoot(w, job, op) : -1;

  std::string job_id = job.id();
  uint64_t gen = job.cross_generation;
  p.in_flight = job.beginExecuting();
  job.cross_pending.insert_or_assign(op.name, std::move(p));
  host.opTimeline().opStart(op.name, w.collective);
  if (w.count == 0 || !leg.localStepFirst() ||
      (w.collective == CollectiveType::kBroadcast && bcast_root_local < 0)) {
    host.opTimeline().activityStart(op.name, "NEGOTIATE_ACROSS_AGENTS");
    job.cross->submit(std::move(w));
    return;
  }
  if (w.collective == CollectiveType::kBroadcast) r.slots = {r.slots[bcast_root_local]};
  r.dsts = {w.staging};
  r.remote_dsts.clear();  // the staging buffer is the agent's
  r.postscale = 1.0;      // applied after the agents' reduction
  host.opTimeline().activityStart(op.name, li.direct ? "DIRECT_REDUCE" : "LOCAL_REDUCE");
  std::shared_ptr<FirstError> error = r.error;
  host.reduceOpOnLoop(std::move(r), [h = &host, job_id, gen, w, error]() mutable {
    if (error && error->failed()) {
      // A rank's tensor could not be read: every agent fails the op with
      // this text (no ring over a half-filled buffer).
      w.req.error = error->get().toString();
      w.count = 0;
    }
    h->handOpToNegotiationOnLoop(job_id, gen, std::move(w));
  });
}

}  // namespace kolo
