// The steps the block collectives share (op.h, CollectiveOp): the local
// slots, the one-agent copy-and-finish, and the several-agents hand-over to
// the job's negotiation thread. Loop thread only.
#include "agent/ipc/client_conn.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"

namespace kolo {

OpWorld opWorldOf(const Job& job, uint64_t pipeline_bytes) {
  OpWorld w;
  w.world_size = job.worldSize();
  w.local_size = job.localSize();
  w.cross_size = job.world().cross_size;
  w.rank_offset = job.world().rank_offset;
  w.rank_offsets = job.world().rank_offsets;
  w.local_sizes = job.world().local_sizes;
  w.pipeline_bytes = pipeline_bytes;
  return w;
}

bool CollectiveOp::localSlotsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                    const std::vector<uint64_t>& handles, uint64_t out_prefix,
                                    bool skip_absent, LocalSlots* slots) {
  const int k = job.localSize();
  for (int i = 0; i < k; ++i) {
    if (skip_absent && !op.absent.empty() && op.absent[i]) {
      slots->ins.push_back(nullptr);
      slots->outs.push_back(nullptr);
      continue;
    }
    ClientConn* c = job.client(i);
    if (c == nullptr) {
      rankLeft(host, job, handles);
      return false;
    }
    slots->ins.push_back(c->slot(op.descs[i].data_offset));
    slots->outs.push_back(c->slot(op.descs[i].out_offset) + out_prefix);
    slots->keep.push_back(c->arena());
  }
  return true;
}

void CollectiveOp::copiesThenFinishOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                          std::vector<uint64_t> handles,
                                          std::vector<LocalReduce> copies, uint64_t bytes,
                                          DataType dtype, const char* activity) const {
  OpHost* h = &host;
  const CollectiveType collective = type();
  InFlight in_flight = job.beginExecuting();
  h->opTimeline().opStart(op.name, collective);
  h->opTimeline().activityStart(op.name, activity);
  h->copyOpAllOnLoop(
      std::move(copies), [h, in_flight, job_id = job.id(), handles = std::move(handles), bytes,
                          name = op.name, dtype, started = op.first_arrival, collective]() mutable {
        h->opTimeline().activityEnd(name);
        h->opTimeline().opEnd(name, dtype, {});
        in_flight.end();
        h->finishOpOnLoop(job_id, handles, bytes, okStatus(), dtype, started, collective);
      });
}

CrossWork CollectiveOp::crossWorkOf(const Job& job, const ReadyOp& op) const {
  CrossWork w;
  w.req.name = op.name;
  w.req.params = op.descs[0];
  w.req.params.handle = 0;
  w.req.params.data_offset = w.req.params.out_offset = 0;
  w.req.first_rank = job.globalRank(0);
  if (!op.error.isOk()) w.req.error = op.error.toString();  // its code crosses too
  w.collective = type();
  return w;
}

void CollectiveOp::copiesThenCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                                         Job::CrossPending p, CrossWork w,
                                         std::vector<LocalReduce> copies,
                                         const char* activity) const {
  OpHost* h = &host;
  const uint64_t gen = job.cross_generation;
  p.in_flight = job.beginExecuting();
  job.cross_pending.insert_or_assign(name, std::move(p));
  h->opTimeline().opStart(name, type());
  h->opTimeline().activityStart(name, activity);
  h->copyOpAllOnLoop(std::move(copies), [h, job_id = job.id(), gen, w = std::move(w)]() mutable {
    h->handOpToNegotiationOnLoop(job_id, gen, std::move(w));
  });
}

}  // namespace kolo
