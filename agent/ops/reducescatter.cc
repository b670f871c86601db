// Reducescatter on the agent loop (Sum/Average/Min/Max/Product over the
// first dimension's row blocks, see reducescatterRows() in ipc_layout.h).
// Each rank's input is its slot (data_offset), its block of the result goes
// to its output slot (out_offset). One agent: each local rank's block is
// reduced across the local inputs straight into its output. Several agents:
// the local inputs are reduced into a staging buffer, the backend's
// reducescatter (per-agent element counts) leaves each agent's block in
// place, and each local rank's block is copied (scaled) into its output.
#include <cstdlib>

#include "agent/ipc/client_conn.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {

// Across agents, kept in the op's Job::CrossPending: each local rank's block
// of the staging buffer (element offset, element count), copied to its slot.
struct ReducescatterState final : OpState {
  std::vector<std::pair<size_t, size_t>> scatter;
};

class ReducescatterOp final : public CollectiveOp {
 public:
  CollectiveType type() const override { return CollectiveType::kReducescatter; }
  Status validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                        std::vector<int64_t>* meta) const override;
  void runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                 std::vector<uint64_t> handles) const override;
  void finishCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                         std::shared_ptr<Job::CrossPending> p,
                         const CrossResult& result) const override;

 private:
  // The local inputs reduced into a staging buffer, then the agents'
  // reducescatter (each rank's block to its output is finishCrossOnLoop's).
  void runAcrossAgentsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                             std::vector<uint64_t> handles, const LocalSlots& slots,
                             const OpPlan& plan) const;
};

}  // namespace

const CollectiveOp& reducescatterOp() {
  static const ReducescatterOp op;
  return op;
}

namespace {

uint64_t rowElems(const SubmitDesc& d) {
  uint64_t row = 1;
  for (int i = 1; i < d.ndim && i < kMaxDims; ++i) row *= static_cast<uint64_t>(d.shape[i]);
  return row;
}

// Global rank `r`'s block of the plan's tensor: (element offset, element count).
std::pair<size_t, size_t> blockOf(const OpPlan& plan, int r) {
  return {plan.offsets[r], plan.offsets[r + 1] - plan.offsets[r]};
}

}  // namespace

Status ReducescatterOp::validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                                       std::vector<int64_t>*) const {
  std::string name(d.name, std::min<size_t>(d.name_len, kMaxNameBytes));
  if (d.ndim < 1)
    return invalidArgument("reducescatter of tensor '" + name +
                           "': it needs at least one dimension");
  const int me = job.globalRank(c.local_rank);
  uint64_t want = static_cast<uint64_t>(reducescatterRows(d.shape[0], job.worldSize(), me)) *
                  rowElems(d) * dataTypeSize(static_cast<DataType>(d.dtype));
  if (d.out_bytes != want) {
    return invalidArgument("reducescatter of tensor '" + name +
                           "': malformed descriptor: output of " + std::to_string(d.out_bytes) +
                           " bytes, rank " + std::to_string(me) + "'s block is " +
                           std::to_string(want));
  }
  return okStatus();
}

void ReducescatterOp::runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                                std::vector<uint64_t> handles) const {
  const SubmitDesc& d0 = op.descs[0];
  const int k = job.localSize();
  const auto dtype = static_cast<DataType>(d0.dtype);
  const size_t es = dataTypeSize(dtype);
  LocalSlots slots;
  if (!localSlotsOnLoop(host, job, op, handles, 0, /*skip_absent=*/false, &slots)) return;
  if (job.world().cross_size > 1) {
    runAcrossAgentsOnLoop(host, job, op, std::move(handles), slots, plan);
    return;
  }
  const int base = job.world().rank_offset;
  std::vector<LocalReduce> parts;
  for (int i = 0; i < k; ++i) {
    auto [off, n] = blockOf(plan, base + i);
    if (n == 0) continue;
    LocalReduce r;
    r.dtype = dtype;
    r.op = plan.reduce;
    r.count = n;
    r.prescale = d0.prescale;
    r.postscale = plan.postscale;
    for (int j = 0; j < k; ++j) r.slots.push_back(slots.ins[j] + off * es);
    r.dsts = {slots.outs[i]};
    r.keepalive = slots.keep;
    parts.push_back(std::move(r));
  }
  copiesThenFinishOnLoop(host, job, op, std::move(handles), std::move(parts), plan.count * es,
                         dtype, "LOCAL_REDUCE");
}

void ReducescatterOp::runAcrossAgentsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                            std::vector<uint64_t> handles, const LocalSlots& slots,
                                            const OpPlan& plan) const {
  const SubmitDesc& d0 = op.descs[0];
  const int k = job.localSize();
  const auto dtype = static_cast<DataType>(d0.dtype);
  const size_t es = dataTypeSize(dtype);
  const int base = job.world().rank_offset;
  Job::CrossPending p;
  p.handles = std::move(handles);
  p.slots.assign(slots.outs.begin(), slots.outs.end());
  p.keepalive = slots.keep;
  p.dtype = dtype;
  p.count = plan.count;
  p.bytes = plan.count * es;
  p.postscale = plan.postscale;
  p.started = op.first_arrival;
  p.collective = CollectiveType::kReducescatter;
  p.report_dtype = dtype;
  auto state = std::make_unique<ReducescatterState>();
  for (int i = 0; i < k; ++i) state->scatter.push_back(blockOf(plan, base + i));
  p.op_state = std::move(state);
  p.staging = staging::acquire(plan.count * es);

  CrossWork w = crossWorkOf(job, op);
  w.req.params.out_bytes = 0;  // differs per rank
  w.staging = p.staging.get();
  w.count = op.error.isOk() ? plan.count : 0;
  w.dtype = dtype;
  w.op = plan.reduce;
  const JobWorld& jw = job.world();
  auto& blocks = w.blocks.emplace<ReducescatterBlocks>();
  for (int a = 0; a < jw.cross_size; ++a) {
    size_t n = 0;
    for (int r = jw.rank_offsets[a]; r < jw.rank_offsets[a] + jw.local_sizes[a]; ++r)
      n += blockOf(plan, r).second;
    blocks.counts.push_back(n);
  }
  std::vector<LocalReduce> parts;
  if (w.count > 0) {
    LocalReduce r;
    r.dtype = dtype;
    r.op = plan.reduce;
    r.count = plan.count;
    r.prescale = d0.prescale;
    r.postscale = 1.0;  // applied after the agents' reduction
    r.slots.assign(slots.ins.begin(), slots.ins.end());
    r.dsts = {p.staging.get()};
    r.keepalive = slots.keep;
    parts.push_back(std::move(r));
  }
  copiesThenCrossOnLoop(host, job, op.name, std::move(p), std::move(w), std::move(parts),
                        "LOCAL_REDUCE");
}

// Each local rank's block of the agents' result, scaled, into its output slot.
void ReducescatterOp::finishCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                                        std::shared_ptr<Job::CrossPending> p,
                                        const CrossResult& result) const {
  if (finishedInSlotsOnLoop(host, job, name, p, result)) return;
  host.opTimeline().activityStart(name, "MEMCPY_OUT_FUSION_BUFFER");
  const auto* state = dynamic_cast<const ReducescatterState*>(p->op_state.get());
  if (state == nullptr || state->scatter.empty())
    return copyBackOnLoop(host, job, name, std::move(p), result);
  const auto& scatter = state->scatter;
  const size_t es = dataTypeSize(p->dtype);
  std::vector<LocalReduce> copies;
  for (size_t i = 0; i < scatter.size(); ++i) {
    if (scatter[i].second == 0) continue;
    LocalReduce c;
    c.dtype = p->dtype;
    c.op = ReduceOp::kSum;
    c.count = scatter[i].second;
    c.postscale = p->postscale;
    c.slots = {p->staging.get() + scatter[i].first * es};
    c.dsts = {p->slots[i]};
    c.keepalive = p->keepalive;
    copies.push_back(std::move(c));
  }
  InFlight in_flight = job.beginExecuting();
  host.copyOpAllOnLoop(std::move(copies),
                       [h = &host, in_flight, job_id = job.id(), p, name]() mutable {
                         h->opTimeline().activityEnd(name);
                         h->opTimeline().opEnd(name, p->dtype, {});
                         in_flight.end();
                         h->finishOpOnLoop(job_id, p->handles, p->bytes, okStatus(),
                                           p->report_dtype, p->started, p->collective);
                       });
}

}  // namespace kolo
