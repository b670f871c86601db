#include "agent/ops/op.h"

#include "agent/timeline/timeline.h"

namespace kolo {

Status CollectiveOp::validateOnLoop(const Job&, ClientConn&, const SubmitDesc&,
                                    std::vector<int64_t>*) const {
  return okStatus();
}

void CollectiveOp::rankLeft(OpHost& host, Job& job, const std::vector<uint64_t>& handles) {
  host.finishOpOnLoop(job.id(), handles, 0,
                      job.failure().isOk() ? aborted("a rank left") : job.failure(),
                      DataType::kFloat32, {}, CollectiveType::kAllreduce);
}

void CollectiveOp::finishCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                                     std::shared_ptr<Job::CrossPending> p,
                                     const CrossResult& result) const {
  if (finishedInSlotsOnLoop(host, job, name, p, result)) return;
  host.opTimeline().activityStart(name, "MEMCPY_OUT_FUSION_BUFFER");
  copyBackOnLoop(host, job, name, std::move(p), result);
}

bool CollectiveOp::finishedInSlotsOnLoop(OpHost& host, Job& job, const std::string& name,
                                         const std::shared_ptr<Job::CrossPending>& p,
                                         const CrossResult& result) {
  if (p->read_error && p->read_error->failed()) {
    // Pipelined direct, or streamed copy-in: a rank's tensor could not be
    // read (or was never wholly copied in) while the ring ran, so the other
    // agents reduced an incomplete buffer: the job fails everywhere rather
    // than let a wrong result stand.
    Status st = p->read_error->get().withContext(
        std::string(collectiveName(p->collective)) + " of tensor '" + name + "' (" +
        (p->streamed ? "streamed copy-in" : "direct user memory") +
        ", read while the agents' ring ran)");
    host.opTimeline().opEnd(name, p->dtype, {});
    host.finishOpOnLoop(job.id(), p->handles, 0, st, p->report_dtype, p->started, p->collective);
    host.failJobForOpOnLoop(job, st);
    return true;
  }
  if (p->bytes == 0) {
    host.opTimeline().opEnd(name, p->dtype, {});
    host.finishOpOnLoop(job.id(), p->handles, 0, okStatus(), p->report_dtype, {}, p->collective);
    return true;
  }
  const bool fused = result.data != nullptr && p->collective == CollectiveType::kAllreduce;
  if (p->leg.resultInSlots(result.drained, fused)) {
    host.opTimeline().opEnd(name, p->dtype, {});
    Status st = p->error ? p->error->get() : okStatus();
    host.finishOpOnLoop(job.id(), p->handles, st.isOk() ? p->bytes : 0, st, p->report_dtype, p->started,
                        p->collective);
    return true;
  }
  return false;
}

void CollectiveOp::copyBackOnLoop(OpHost& host, Job& job, const std::string& name,
                                  std::shared_ptr<Job::CrossPending> p, const CrossResult& result) {
  const bool fused = result.data != nullptr && p->collective == CollectiveType::kAllreduce;
  LocalReduce r;
  r.dtype = p->dtype;
  r.op = ReduceOp::kSum;
  r.count = p->count;
  r.prescale = 1.0;
  r.postscale = p->postscale;
  r.slots = {p->leg.in_place || p->leg.first_slot ? p->slots[0] : p->stagingData()};
  r.dsts = p->slots;
  r.remote_dsts = p->remote_slots;  // direct: into the ranks' own memory
  r.error = p->error;
  r.keepalive = p->keepalive;
  if (fused) {
    // A fused allreduce: the result is read from the fused buffer itself
    // (no copy back into the staging buffer first).
    r.slots = {const_cast<void*>(result.data)};
    r.scratch = result.keep;
  }
  InFlight in_flight = job.beginExecuting();
  host.reduceOpOnLoop(std::move(r), [h = &host, in_flight, job_id = job.id(), p, name]() mutable {
    h->opTimeline().activityEnd(name);
    h->opTimeline().opEnd(name, p->dtype, {});
    in_flight.end();
    Status st = p->error ? p->error->get() : okStatus();
    if (!st.isOk()) {
      st = st.withContext(std::string(collectiveName(p->collective)) + " of tensor '" + name + "' (direct user memory)");
    } else if (p->before_finish) {
      st = p->before_finish();
    }
    if (st.isOk() && p->error) h->observeDirect(p->bytes);
    h->finishOpOnLoop(job_id, p->handles, st.isOk() ? p->bytes : 0, st, p->report_dtype, p->started,
                      p->collective);
  });
}

const CollectiveOp* collectiveOp(CollectiveType c) {
  switch (c) {
    case CollectiveType::kAllreduce:
      return &allreduceOp();
    case CollectiveType::kBroadcast:
      return &broadcastOp();
    case CollectiveType::kAllgather:
      return &allgatherOp();
    case CollectiveType::kReducescatter:
      return &reducescatterOp();
    case CollectiveType::kAlltoall:
      return &alltoallOp();
    case CollectiveType::kBarrier:
    case CollectiveType::kJoin:
      break;
  }
  return nullptr;
}

}  // namespace kolo
