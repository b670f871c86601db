// The kNcclCross route (device_cross_nccl.h).
#include "agent/ops/device_cross_nccl.h"

#include "agent/backends/nccl/factory.h"
#include "agent/core/device_nccl_steps.h"
#include "agent/cross/cross_job.h"
#include "agent/ops/memory.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"

namespace kolo {

namespace {

// What the op keeps alive until it completes: the grants (arenas, events),
// its local step and the buffer NCCL runs on.
struct NcclCrossState {
  std::vector<std::shared_ptr<DeviceGrant>> hold;
  DeviceLocalOp dop;
  NcclCrossBuffer buf;
  NcclCrossLayout layout;  // allgather, reducescatter, alltoall
};

bool isLayout(CollectiveType c) {
  return c == CollectiveType::kAllgather || c == CollectiveType::kReducescatter ||
         c == CollectiveType::kAlltoall;
}

NcclCrossLayout layoutOf(const Job& job) {
  const JobWorld& w = job.world();
  NcclCrossLayout l;
  l.world = w.world_size;
  l.cross_rank = w.cross_rank;
  l.rank_offsets = w.rank_offsets;
  l.local_sizes = w.local_sizes;
  return l;
}

// What the negotiation thread sees as the work's size (0: it completes at
// once, without a call): the same on every agent, so all post it or none.
// Allgather, alltoall: the bytes of all the ranks' rows; else the elements.
size_t crossCount(const DeviceLocalOp& d) {
  if (d.collective != CollectiveType::kAllgather && d.collective != CollectiveType::kAlltoall)
    return d.count;
  uint64_t rows = 0;
  for (int64_t v : d.meta) rows += v > 0 ? static_cast<uint64_t>(v) : 0;
  return rows * d.row_bytes;
}

// The NCCL call of `state`'s op, once the local step has passed.
void postOnNccl(const NcclCrossState& st, CollectiveType coll, int root, Backend& nccl,
                Backend::Done done) {
  const DeviceLocalOp& d = st.dop;
  const NcclCrossBuffer& b = st.buf;
  switch (coll) {
    case CollectiveType::kBroadcast:
      return nccl.broadcast(b.data, d.count * dataTypeSize(d.dtype), root, std::move(done));
    case CollectiveType::kAllgather:
      return nccl.allgatherv(b.data, b.blocks.at(st.layout.cross_rank), b.out, b.blocks,
                             std::move(done));
    case CollectiveType::kReducescatter:
      return nccl.reducescatter(b.data, b.out, b.blocks, d.dtype, d.op, std::move(done));
    case CollectiveType::kAlltoall:
      return nccl.alltoallv(b.data, b.blocks, b.out, b.recv_blocks, std::move(done));
    default:
      return nccl.allreduce(b.data, d.count, d.dtype, d.op, std::move(done));
  }
}

}  // namespace

void runNcclCrossOnLoop(OpHost& host, Job& job, ReadyOp op, const DeviceLocalOp& dop,
                        std::vector<std::shared_ptr<DeviceGrant>> hold,
                        std::vector<uint64_t> handles) {
  const SubmitDesc& d0 = op.descs[0];
  const auto coll = static_cast<CollectiveType>(d0.collective);
  auto state = std::make_shared<NcclCrossState>();
  state->hold = std::move(hold);
  state->dop = dop;
  const bool layout = isLayout(coll);
  if (layout) state->layout = layoutOf(job);
  int root = 0;
  if (coll == CollectiveType::kBroadcast) {
    root = job.world().crossRankOf(d0.root);
    if (root < 0) {
      op.error = invalidArgument("broadcast of device tensor '" + op.name + "': root rank " +
                                 std::to_string(d0.root) + " is on no agent of this job");
    }
  }
  if (op.error.isOk()) {
    auto in = layout ? enqueueNcclLayoutInput(state->dop, state->layout)
                     : enqueueNcclCrossInput(state->dop);
    if (in.isOk()) {
      state->buf = std::move(*in);
    } else {
      op.error = in.status().withContext("device tensor '" + op.name + "' over NCCL");
    }
  }
  if (!op.error.isOk()) {
    (void)enqueueNcclCrossOutput(state->dop, {}, false);  // out_ready after the waits
    log::get("agent.ops")
        ->warn("job {}: device op '{}': {}", job.id(), op.name, op.error.message());
    return hostMemory().runOnLoop(host, job, collectiveOp(coll), std::move(op), std::move(handles));
  }
  Job::CrossPending p;
  p.handles = std::move(handles);
  p.dtype = dop.dtype;
  p.count = dop.count;
  p.bytes = d0.data_bytes;
  p.started = op.first_arrival;
  p.collective = coll;
  p.report_dtype = static_cast<DataType>(d0.dtype);
  p.device_finish = [state, layout](bool ok) {
    return layout ? enqueueNcclLayoutOutput(state->dop, state->layout, state->buf, ok)
                  : enqueueNcclCrossOutput(state->dop, state->buf, ok);
  };

  CrossWork w;
  w.req.name = op.name;
  w.req.params = d0;  // the device flag stays: every agent routes the name over NCCL
  w.req.params.handle = 0;
  w.req.params.data_offset = w.req.params.out_offset = 0;
  w.req.params.device_event = 0;
  w.req.first_rank = job.globalRank(0);
  w.count = crossCount(dop);
  w.dtype = dop.dtype;
  w.op = dop.op;
  w.collective = coll;
  w.root = root;
  w.device_post = [state, coll, root](Backend& nccl, Backend::Done done) {
    Status st = ncclWaitBeforeNext(nccl, state->buf.ready);
    if (!st.isOk()) return done(st);
    postOnNccl(*state, coll, root, nccl, std::move(done));
  };
  const std::string name = op.name;
  p.in_flight = job.beginExecuting();
  job.cross_pending.insert_or_assign(name, std::move(p));
  host.opTimeline().opStart(name, coll);
  host.opTimeline().activityStart(name, "NEGOTIATE_ACROSS_AGENTS");
  job.cross->submit(std::move(w));
}

}  // namespace kolo
