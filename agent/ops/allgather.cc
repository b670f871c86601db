// Allgather on the agent loop. Each rank's output region starts with every
// rank's first dimension (written by its client, see ipc_layout.h); the
// gathered tensor follows. One agent: every local input is copied into every
// local output at its rank's offset. Several agents: the local inputs are
// copied into a staging buffer sized for the whole output (at their global
// offsets), the backend's allgatherv fills in the other agents' blocks, and
// the staging buffer is copied into every local output.
#include <cstdlib>
#include <cstring>

#include "agent/core/shm_meta.h"
#include "agent/ipc/client_conn.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {

class AllgatherOp final : public CollectiveOp {
 public:
  CollectiveType type() const override { return CollectiveType::kAllgather; }
  Status validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                        std::vector<int64_t>* meta) const override;
  void runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                 std::vector<uint64_t> handles) const override;

 private:
  // Every local input into every local output at its rank's offset.
  void runOneAgentOnLoop(OpHost& host, Job& job, const ReadyOp& op, std::vector<uint64_t> handles,
                         const LocalSlots& slots, const std::vector<uint64_t>& offsets) const;
  // The local inputs into a staging buffer of the whole output, then the
  // agents' allgatherv (the copy back is finishCrossOnLoop's).
  void runAcrossAgentsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                             std::vector<uint64_t> handles, const LocalSlots& slots,
                             const std::vector<uint64_t>& offsets) const;
};

}  // namespace

const CollectiveOp& allgatherOp() {
  static const AllgatherOp op;
  return op;
}

namespace {

auto gatherLog() { return log::get("agent.ops"); }

}  // namespace

Status AllgatherOp::validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                                   std::vector<int64_t>* meta) const {
  const int world = job.worldSize();
  // c.validate() put the output region inside the arena: the sizes are read
  // from it once, here, and only this copy is used from now on.
  if (d.ndim >= 1 && world > 0 && d.out_bytes >= allgatherSizesBytes(world)) {
    // (a device op's header is in the shared arena at meta_offset)
    const char* m = c.metaOf(d, static_cast<uint64_t>(world) * sizeof(int64_t));
    if (m == nullptr) {
      return invalidArgument("malformed descriptor: the first dimensions of device allgather '" +
                             std::string(d.name, std::min<size_t>(d.name_len, kMaxNameBytes)) +
                             "' are outside the shared arena");
    }
    *meta = copyShmMeta(m, static_cast<size_t>(world));
  }
  return checkAllgatherSizes(d, world, job.globalRank(c.local_rank), *meta);
}

namespace {

// A byte copy of `bytes` from `src` to each of `dsts`.
LocalReduce byteCopy(char* src, std::vector<void*> dsts, uint64_t bytes,
                     const std::vector<std::shared_ptr<SharedRegion>>& keep) {
  LocalReduce r;
  r.dtype = DataType::kUint8;
  r.op = ReduceOp::kSum;
  r.count = bytes;
  r.slots = {src};
  r.dsts = std::move(dsts);
  r.keepalive = keep;
  return r;
}

}  // namespace

void AllgatherOp::runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                            std::vector<uint64_t> handles) const {
  const SubmitDesc& d0 = op.descs[0];
  const int world = job.worldSize();
  // A rank that has joined (kolo_join) has no slots: it contributes zero
  // rows (its first dimension is 0 in everyone's list) and receives nothing.
  LocalSlots slots;
  if (!localSlotsOnLoop(host, job, op, handles, allgatherSizesBytes(world), /*skip_absent=*/true,
                        &slots))
    return;
  // Each rank's rows in the gathered tensor (zeros when the ranks' lists
  // of first dimensions disagree: plan.error).
  const std::vector<uint64_t>& offsets = plan.offsets;
  op.error = plan.error;
  const auto dtype = static_cast<DataType>(d0.dtype);
  if (!op.error.isOk() && job.world().cross_size == 1) {
    gatherLog()->warn("job {}: {}", job.id(), op.error.message());
    host.finishOpOnLoop(job.id(), handles, 0, op.error, dtype, {}, CollectiveType::kAllgather);
    return;
  }
  if (job.world().cross_size == 1) {
    runOneAgentOnLoop(host, job, op, std::move(handles), slots, offsets);
  } else {
    runAcrossAgentsOnLoop(host, job, op, std::move(handles), slots, offsets);
  }
}

void AllgatherOp::runOneAgentOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                    std::vector<uint64_t> handles, const LocalSlots& slots,
                                    const std::vector<uint64_t>& offsets) const {
  const int k = job.localSize();
  const int base = job.world().rank_offset;
  auto absent = [&](int i) { return !op.absent.empty() && op.absent[i]; };
  std::vector<LocalReduce> copies;
  for (int i = 0; i < k; ++i) {
    uint64_t bytes = offsets[base + i + 1] - offsets[base + i];
    if (bytes == 0 || absent(i)) continue;
    std::vector<void*> dsts;
    for (int j = 0; j < k; ++j) {
      if (!absent(j)) dsts.push_back(slots.outs[j] + offsets[base + i]);
    }
    copies.push_back(byteCopy(slots.ins[i], std::move(dsts), bytes, slots.keep));
  }
  copiesThenFinishOnLoop(host, job, op, std::move(handles), std::move(copies), offsets.back(),
                         static_cast<DataType>(op.descs[0].dtype), "MEMCPY_ALLGATHER");
}

void AllgatherOp::runAcrossAgentsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                        std::vector<uint64_t> handles, const LocalSlots& slots,
                                        const std::vector<uint64_t>& offsets) const {
  const int k = job.localSize();
  const int base = job.world().rank_offset;
  const uint64_t total = offsets.back();
  auto absent = [&](int i) { return !op.absent.empty() && op.absent[i]; };
  Job::CrossPending p;
  p.handles = std::move(handles);
  for (char* o : slots.outs) {
    if (o != nullptr) p.slots.push_back(o);
  }
  p.keepalive = slots.keep;
  p.dtype = DataType::kUint8;  // the copy back is a byte copy
  p.count = total;
  p.bytes = total;
  p.postscale = 1.0;
  p.started = op.first_arrival;
  p.collective = CollectiveType::kAllgather;
  p.report_dtype = static_cast<DataType>(op.descs[0].dtype);
  p.staging = staging::acquire(total);

  CrossWork w = crossWorkOf(job, op);
  w.staging = p.staging.get();
  w.count = op.error.isOk() ? total : 0;
  w.dtype = DataType::kUint8;
  const JobWorld& jw = job.world();
  auto& blocks = w.blocks.emplace<AllgatherBlocks>();
  for (int a = 0; a < jw.cross_size; ++a) {
    int lo = jw.rank_offsets[a], hi = lo + jw.local_sizes[a];
    blocks.bytes.push_back(offsets[hi] - offsets[lo]);
  }
  std::vector<LocalReduce> copies;
  if (w.count > 0) {
    for (int i = 0; i < k; ++i) {
      uint64_t bytes = offsets[base + i + 1] - offsets[base + i];
      if (bytes > 0 && !absent(i))
        copies.push_back(
            byteCopy(slots.ins[i], {p.staging.get() + offsets[base + i]}, bytes, slots.keep));
    }
  }
  copiesThenCrossOnLoop(host, job, op.name, std::move(p), std::move(w), std::move(copies),
                        "MEMCPY_IN_FUSION_BUFFER");
}

}  // namespace kolo
