// Alltoall on the agent loop. Rank s sends M[s][d] rows of its input (in
// destination order) to rank d; rank d's output holds the rows it receives,
// from rank 0 first. The split matrix M (int64[size][size]) heads each
// rank's output region (written by its client, see ipc_layout.h). One agent:
// k x k byte copies. Several agents: each agent packs, per destination agent
// B, the blocks (s in its ranks, d in B's ranks) into a send buffer, the
// backend's alltoallv exchanges them, and the received blocks are copied to
// their places in the local outputs.
#include <cstdlib>
#include <cstring>

#include "agent/core/shm_meta.h"
#include "agent/ipc/client_conn.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {

// Across agents, kept in the op's Job::CrossPending: the buffer sent to the
// other agents, and the byte copies from the received staging buffer into
// the local outputs.
struct AlltoallState final : OpState {
  std::unique_ptr<char[], void (*)(char*)> send_staging{nullptr, [](char*) {}};
  struct CopyOut {
    size_t src_off;
    int local_rank;
    size_t dst_off;
    size_t bytes;
  };
  std::vector<CopyOut> copy_out;
};

class AlltoallOp final : public CollectiveOp {
 public:
  CollectiveType type() const override { return CollectiveType::kAlltoall; }
  Status validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                        std::vector<int64_t>* meta) const override;
  void runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                 std::vector<uint64_t> handles) const override;
  void finishCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                         std::shared_ptr<Job::CrossPending> p,
                         const CrossResult& result) const override;

 private:
  // The local inputs packed per destination agent into a send staging
  // buffer, then the agents' alltoallv (the unpacking is finishCrossOnLoop's).
  void runAcrossAgentsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                             std::vector<uint64_t> handles, const LocalSlots& slots,
                             const std::vector<int64_t>& m, uint64_t my_bytes) const;
};

}  // namespace

const CollectiveOp& alltoallOp() {
  static const AlltoallOp op;
  return op;
}

Status AlltoallOp::validateOnLoop(const Job& job, ClientConn& c, const SubmitDesc& d,
                                  std::vector<int64_t>* meta) const {
  const int n = job.worldSize();
  // c.validate() put the output region inside the arena: the matrix is read
  // from it once, here, and only this copy is used from now on.
  if (d.ndim >= 1 && n > 0 && d.out_bytes >= alltoallSplitsBytes(n)) {
    // (a device op's matrix is in the shared arena at meta_offset)
    const char* m = c.metaOf(d, static_cast<uint64_t>(n) * n * sizeof(int64_t));
    if (m == nullptr) {
      return invalidArgument("malformed descriptor: the split matrix of device alltoall '" +
                             std::string(d.name, std::min<size_t>(d.name_len, kMaxNameBytes)) +
                             "' is outside the shared arena");
    }
    *meta = copyShmMeta(m, static_cast<size_t>(n) * n);
  }
  return checkAlltoallSplits(d, n, job.globalRank(c.local_rank), *meta);
}

namespace {

LocalReduce byteCopy(const char* src, char* dst, uint64_t bytes,
                     const std::vector<std::shared_ptr<SharedRegion>>& keep) {
  LocalReduce r;
  r.dtype = DataType::kUint8;
  r.op = ReduceOp::kSum;
  r.count = bytes;
  r.slots = {const_cast<char*>(src)};
  r.dsts = {dst};
  r.keepalive = keep;
  return r;
}

// The rows s sends to d (matrix m of n ranks), and the byte offset of those
// rows inside s's input and inside d's output.
struct SplitMatrix {
  const std::vector<int64_t>& m;
  int n;
  uint64_t row;
  uint64_t at(int s, int d) const {
    return static_cast<uint64_t>(m[static_cast<size_t>(s) * n + d]);
  }
  uint64_t srcOff(int s, int d) const {
    uint64_t o = 0;
    for (int t = 0; t < d; ++t) o += at(s, t);
    return o * row;
  }
  uint64_t dstOff(int s, int d) const {
    uint64_t o = 0;
    for (int t = 0; t < s; ++t) o += at(t, d);
    return o * row;
  }
};

// Pack: per destination agent, (s in mine, d in theirs), each block from
// its rows in s's input to its place in the send staging buffer.
std::vector<LocalReduce> packCopies(const JobWorld& jw, int k, const SplitMatrix& sm,
                                    const std::vector<char*>& ins, char* send,
                                    const std::vector<std::shared_ptr<SharedRegion>>& keep) {
  const int base = jw.rank_offset;
  std::vector<LocalReduce> copies;
  uint64_t off = 0;
  for (int a = 0; a < jw.cross_size; ++a) {
    const int lo = jw.rank_offsets[a], hi = lo + jw.local_sizes[a];
    for (int s = base; s < base + k; ++s) {
      for (int d = lo; d < hi; ++d) {
        const uint64_t bytes = sm.at(s, d) * sm.row;
        if (bytes > 0)
          copies.push_back(byteCopy(ins[s - base] + sm.srcOff(s, d), send + off, bytes, keep));
        off += bytes;
      }
    }
  }
  return copies;
}

// Unpack: per source agent, (s in theirs, d in mine), each block from the
// receive staging buffer to its place in d's output.
std::vector<AlltoallState::CopyOut> unpackPlan(const JobWorld& jw, int k, const SplitMatrix& sm) {
  const int base = jw.rank_offset;
  std::vector<AlltoallState::CopyOut> out;
  uint64_t off = 0;
  for (int a = 0; a < jw.cross_size; ++a) {
    const int lo = jw.rank_offsets[a], hi = lo + jw.local_sizes[a];
    for (int s = lo; s < hi; ++s) {
      for (int d = base; d < base + k; ++d) {
        const uint64_t bytes = sm.at(s, d) * sm.row;
        out.push_back({off, d - base, sm.dstOff(s, d), bytes});
        off += bytes;
      }
    }
  }
  return out;
}

}  // namespace

void AlltoallOp::runOnLoop(OpHost& host, Job& job, const OpPlan& plan, ReadyOp op,
                           std::vector<uint64_t> handles) const {
  const SubmitDesc& d0 = op.descs[0];
  const int n = job.worldSize();
  const int k = job.localSize();
  LocalSlots slots;
  if (!localSlotsOnLoop(host, job, op, handles, alltoallSplitsBytes(n), /*skip_absent=*/false,
                        &slots))
    return;
  // The ranks' one split matrix (zeros when they disagree: plan.error).
  const std::vector<int64_t>& m = plan.splits;
  op.error = plan.error;
  const auto dtype = static_cast<DataType>(d0.dtype);
  if (!op.error.isOk() && job.world().cross_size == 1) {
    host.finishOpOnLoop(job.id(), handles, 0, op.error, dtype, {}, CollectiveType::kAlltoall);
    return;
  }
  uint64_t my_bytes = 0;
  for (int i = 0; i < k; ++i) my_bytes += op.descs[i].data_bytes;
  if (job.world().cross_size == 1) {
    const uint64_t row = rowBytesOf(d0);
    std::vector<LocalReduce> copies;
    for (const AlltoallCopy& x : alltoallLocalCopies(m, n, job.world().rank_offset, k, row)) {
      copies.push_back(byteCopy(slots.ins[x.src_local] + x.src_off,
                                slots.outs[x.dst_local] + x.dst_off, x.bytes, slots.keep));
    }
    copiesThenFinishOnLoop(host, job, op, std::move(handles), std::move(copies), my_bytes, dtype,
                           "MEMCPY_ALLTOALL");
    return;
  }
  runAcrossAgentsOnLoop(host, job, op, std::move(handles), slots, m, my_bytes);
}

void AlltoallOp::runAcrossAgentsOnLoop(OpHost& host, Job& job, const ReadyOp& op,
                                       std::vector<uint64_t> handles, const LocalSlots& slots,
                                       const std::vector<int64_t>& m, uint64_t my_bytes) const {
  const int n = job.worldSize();
  const int k = job.localSize();
  const uint64_t row = rowBytesOf(op.descs[0]);
  const int base = job.world().rank_offset;
  const JobWorld& jw = job.world();
  const int agents = jw.cross_size;
  auto M = [&](int s, int d) { return static_cast<uint64_t>(m[static_cast<size_t>(s) * n + d]); };
  auto ranksOf = [&](int a) {
    return std::pair<int, int>(jw.rank_offsets[a], jw.rank_offsets[a] + jw.local_sizes[a]);
  };
  CrossWork w = crossWorkOf(job, op);
  w.req.params.data_bytes = w.req.params.out_bytes = 0;
  w.dtype = DataType::kUint8;
  uint64_t send_total = 0, recv_total = 0, all_total = 0;
  auto& blocks = w.blocks.emplace<AlltoallBlocks>();
  for (int a = 0; a < agents; ++a) {
    auto [lo, hi] = ranksOf(a);
    uint64_t sb = 0, rb = 0;
    for (int s = base; s < base + k; ++s)
      for (int d = lo; d < hi; ++d) sb += M(s, d) * row;
    for (int s = lo; s < hi; ++s)
      for (int d = base; d < base + k; ++d) rb += M(s, d) * row;
    blocks.send_bytes.push_back(sb);
    blocks.recv_bytes.push_back(rb);
    send_total += sb;
    recv_total += rb;
  }
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      // (Rows between other agents' ranks were checked there, not here: saturate.)
      if (__builtin_add_overflow(all_total, M(s, d), &all_total)) all_total = UINT64_MAX;
    }
  Job::CrossPending p;
  p.handles = std::move(handles);
  p.slots.assign(slots.outs.begin(), slots.outs.end());
  p.keepalive = slots.keep;
  p.dtype = DataType::kUint8;
  p.count = recv_total;
  p.bytes = my_bytes;
  p.started = op.first_arrival;
  p.collective = CollectiveType::kAlltoall;
  p.report_dtype = static_cast<DataType>(op.descs[0].dtype);
  p.staging = staging::acquire(recv_total);
  auto state = std::make_unique<AlltoallState>();
  state->send_staging = staging::acquire(send_total);
  std::vector<LocalReduce> copies;
  const SplitMatrix sm{m, n, row};
  if (op.error.isOk())
    copies = packCopies(jw, k, sm, slots.ins, state->send_staging.get(), slots.keep);
  state->copy_out = unpackPlan(jw, k, sm);
  w.staging = p.staging.get();
  blocks.send = state->send_staging.get();
  p.op_state = std::move(state);
  // Zero rows anywhere in the job: nothing to exchange (every agent agrees).
  w.count = op.error.isOk() ? all_total : 0;
  if (w.count == 0) p.bytes = 0;
  copiesThenCrossOnLoop(host, job, op.name, std::move(p), std::move(w), std::move(copies),
                        "MEMCPY_IN_FUSION_BUFFER");
}

// The received blocks to their places in the local outputs (a rank may
// receive rows without sending any, so even an op of no bytes here).
void AlltoallOp::finishCrossOnLoop(OpHost& host, Job& job, const std::string& name,
                                   std::shared_ptr<Job::CrossPending> p, const CrossResult&) const {
  host.opTimeline().activityStart(name, "MEMCPY_OUT_FUSION_BUFFER");
  std::vector<LocalReduce> copies;
  const auto* state = dynamic_cast<const AlltoallState*>(p->op_state.get());
  static const std::vector<AlltoallState::CopyOut> kNoCopies;
  for (const auto& c : state != nullptr ? state->copy_out : kNoCopies) {
    if (c.bytes == 0) continue;
    LocalReduce r;
    r.dtype = DataType::kUint8;
    r.op = ReduceOp::kSum;
    r.count = c.bytes;
    r.slots = {p->staging.get() + c.src_off};
    r.dsts = {static_cast<char*>(p->slots[c.local_rank]) + c.dst_off};
    r.keepalive = p->keepalive;
    copies.push_back(std::move(r));
  }
  InFlight in_flight = job.beginExecuting();
  host.copyOpAllOnLoop(std::move(copies),
                       [h = &host, in_flight, job_id = job.id(), p, name]() mutable {
                         h->opTimeline().activityEnd(name);
                         h->opTimeline().opEnd(name, p->report_dtype, {});
                         in_flight.end();
                         h->finishOpOnLoop(job_id, p->handles, p->bytes, okStatus(),
                                           p->report_dtype, p->started, p->collective);
                       });
}

}  // namespace kolo
