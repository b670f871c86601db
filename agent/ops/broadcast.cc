// Broadcast, in place: the root's slot is copied byte for byte into every
// other rank's slot (on one agent), or through a staging buffer and the
// backend's broadcast among agents (the cross leg: agent/ops/cross_leg.cc).
#include <algorithm>

#include "agent/ipc/client_conn.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"

namespace kolo {

namespace {

class BroadcastOp final : public CollectiveOp {
 public:
  CollectiveType type() const override { return CollectiveType::kBroadcast; }
  Status validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                        std::vector<int64_t>* meta) const override;
  void runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                 std::vector<uint64_t> handles) const override;
};

}  // namespace

const CollectiveOp& broadcastOp() {
  static const BroadcastOp op;
  return op;
}

Status BroadcastOp::validateOnLoop(const Job& job, ClientConn&, const SubmitDesc& d,
                                   std::vector<int64_t>*) const {
  if (d.root < 0 || d.root >= job.worldSize()) {
    return invalidArgument(
        "broadcast of tensor '" + std::string(d.name, std::min<size_t>(d.name_len, kMaxNameBytes)) +
        "': root rank " + std::to_string(d.root) + " is not a rank of this job (size " +
        std::to_string(job.worldSize()) + ")");
  }
  return okStatus();
}

void BroadcastOp::runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                            std::vector<uint64_t> handles) const {
  const SubmitDesc& d0 = op.descs[0];
  if (plan.path == OpPath::kNothing) {
    host.finishOpOnLoop(job.id(), handles, 0, okStatus(), static_cast<DataType>(d0.dtype), {},
                        CollectiveType::kBroadcast);
    return;
  }
  LocalReduce r;
  r.dtype = DataType::kUint8;  // a byte copy, whatever the dtype
  r.op = ReduceOp::kSum;
  r.count = plan.count;
  for (size_t i = 0; i < op.descs.size(); ++i) {
    ClientConn* c = job.client(static_cast<int>(i));
    if (c == nullptr) return rankLeft(host, job, handles);
    r.slots.push_back(c->slot(op.descs[i].data_offset));
    r.keepalive.push_back(c->arena());
  }
  if (plan.placement == OpPlacement::kAcrossAgents) {
    runCrossLegOnLoop(host, job, std::move(op), std::move(r), std::move(handles), &plan.leg);
    return;
  }
  const int root = d0.root - job.world().rank_offset;
  uint64_t bytes = d0.data_bytes;
  std::string job_id = job.id();
  auto dtype = static_cast<DataType>(d0.dtype);
  std::vector<int64_t> shape(d0.shape, d0.shape + std::min<int>(d0.ndim, kMaxDims));
  if (job.localSize() == 1 || root < 0 || root >= job.localSize()) {
    host.finishOpOnLoop(job_id, handles, bytes, okStatus(), dtype, op.first_arrival,
                        CollectiveType::kBroadcast);
    return;
  }
  LocalReduce copy;
  copy.dtype = r.dtype;
  copy.op = r.op;
  copy.count = r.count;
  copy.slots = {r.slots[root]};
  for (int i = 0; i < job.localSize(); ++i) {
    if (i != root) copy.dsts.push_back(r.slots[i]);
  }
  copy.keepalive = std::move(r.keepalive);
  InFlight in_flight = job.beginExecuting();
  host.opTimeline().opStart(op.name, CollectiveType::kBroadcast);
  host.opTimeline().activityStart(op.name, "MEMCPY_BROADCAST");
  host.reduceOpOnLoop(std::move(copy),
                      [h = &host, in_flight, job_id, handles = std::move(handles), bytes,
                       name = op.name, dtype, shape, started = op.first_arrival]() mutable {
                        h->opTimeline().activityEnd(name);
                        h->opTimeline().opEnd(name, dtype, shape);
                        in_flight.end();
                        h->finishOpOnLoop(job_id, handles, bytes, okStatus(), dtype, started,
                                          CollectiveType::kBroadcast);
                      });
}

}  // namespace kolo
