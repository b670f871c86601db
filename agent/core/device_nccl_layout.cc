// device_nccl_steps.h's layout steps (allgather, reducescatter, alltoall of
// device tensors across agents over NCCL), over the device seam (CUDA or
// the host emulation). Loop thread; nothing here waits for the device.
#include <algorithm>

#include "agent/core/device_grant.h"
#include "agent/core/device_nccl_steps.h"
#include "agent/gpu/collective_plan.h"

namespace kolo {

namespace {

SeamGrant* seam(DeviceGrant* g) { return static_cast<SeamGrant*>(g); }

std::string what(const DeviceLocalOp& op) {
  return std::string(collectiveName(op.collective)) + " of device tensor '" + op.name + "'";
}

Status checkLayout(const DeviceLocalOp& op, const NcclCrossLayout& l) {
  const size_t k = op.grants.size();
  if (gpu::deviceApi() == nullptr)
    return unavailable("this kolo-agent has no device implementation");
  if (k == 0 || op.offsets.size() != k || op.events.size() != k || op.out_offsets.size() != k)
    return internalError("device op without ranks");
  for (DeviceGrant* g : op.grants) {
    if (seam(g)->ctx_ != seam(op.grants[0])->ctx_) return internalError("device op over two GPUs");
  }
  const size_t agents = l.rank_offsets.size();
  if (agents == 0 || l.local_sizes.size() != agents || l.cross_rank < 0 ||
      static_cast<size_t>(l.cross_rank) >= agents ||
      l.local_sizes[l.cross_rank] != static_cast<int>(k) ||
      l.rank_offsets.back() + l.local_sizes.back() != l.world) {
    return internalError(what(op) + ": the job's layout across agents does not match its ranks");
  }
  return okStatus();
}

char* inOf(const DeviceLocalOp& op, size_t i) {
  return static_cast<char*>(seam(op.grants[i])->slot(op.offsets[i]));
}
char* outOf(const DeviceLocalOp& op, size_t i) {
  return static_cast<char*>(seam(op.grants[i])->slot(op.out_offsets[i]));
}

// Allgather: byte offsets of every global rank's rows, and each agent's
// block (bytes).
struct GatherLayout {
  std::vector<uint64_t> offsets;  // world + 1
  std::vector<size_t> agent_bytes;
};
StatusOr<GatherLayout> gatherLayout(const DeviceLocalOp& op, const NcclCrossLayout& l) {
  if (op.meta.size() != static_cast<size_t>(l.world)) {
    return internalError(what(op) + ": " + std::to_string(op.meta.size()) +
                         " first dimensions for " + std::to_string(l.world) + " ranks");
  }
  GatherLayout g;
  ASSIGN_OR_RETURN(g.offsets, gpu::allgatherOffsets(op.meta, op.row_bytes, op.name));
  for (size_t a = 0; a < l.rank_offsets.size(); ++a) {
    const int lo = l.rank_offsets[a], hi = lo + l.local_sizes[a];
    g.agent_bytes.push_back(g.offsets[hi] - g.offsets[lo]);
  }
  return g;
}

// Reducescatter: every global rank's block (elements), and each agent's.
struct ScatterLayout {
  std::vector<gpu::ElemBlock> ranks;
  std::vector<size_t> agent_counts;
};
StatusOr<ScatterLayout> scatterLayout(const DeviceLocalOp& op, const NcclCrossLayout& l) {
  const size_t es = dataTypeSize(op.dtype);
  const uint64_t row_elems = es > 0 ? op.row_bytes / es : 0;
  ScatterLayout s;
  ASSIGN_OR_RETURN(s.ranks, gpu::reducescatterBlocks(op.dim0, row_elems, l.world, op.name));
  for (size_t a = 0; a < l.rank_offsets.size(); ++a) {
    size_t n = 0;
    for (int r = l.rank_offsets[a]; r < l.rank_offsets[a] + l.local_sizes[a]; ++r)
      n += s.ranks[r].count;
    s.agent_counts.push_back(n);
  }
  if (static_cast<uint64_t>(op.dim0) * row_elems != op.count)
    return internalError(what(op) + ": its rows do not make its element count");
  return s;
}

// Alltoall: splits[s * world + d] rows from global rank s to global rank
// d. The send buffer holds, by destination agent, for each of its ranks d,
// the rows of every local rank s (in rank order) for d; so each agent
// receives, by source agent, for each of its ranks d, the rows for d of
// that agent's ranks in rank order: rank d's output is the concatenation
// of its chunk of every received block, sources in global rank order.
struct AlltoallLayout {
  std::vector<size_t> send_bytes, recv_bytes;  // by agent
  size_t send_total = 0, recv_total = 0;
};
StatusOr<AlltoallLayout> alltoallLayout(const DeviceLocalOp& op, const NcclCrossLayout& l) {
  const size_t w = static_cast<size_t>(l.world);
  if (op.meta.size() != w * w) {
    return internalError(what(op) + ": a split matrix of " + std::to_string(op.meta.size()) +
                         " entries for " + std::to_string(w) + " ranks");
  }
  for (int64_t v : op.meta) {
    if (v < 0) return invalidArgument(what(op) + ": a negative split (" + std::to_string(v) + ")");
  }
  const int lo = l.rank_offsets[l.cross_rank], hi = lo + l.local_sizes[l.cross_rank];
  AlltoallLayout t;
  for (size_t a = 0; a < l.rank_offsets.size(); ++a) {
    const int alo = l.rank_offsets[a], ahi = alo + l.local_sizes[a];
    uint64_t send_rows = 0, recv_rows = 0;
    for (int x = alo; x < ahi; ++x) {
      for (int m = lo; m < hi; ++m) {
        send_rows += static_cast<uint64_t>(op.meta[m * w + x]);  // local m to x
        recv_rows += static_cast<uint64_t>(op.meta[x * w + m]);  // x to local m
      }
    }
    t.send_bytes.push_back(send_rows * op.row_bytes);
    t.recv_bytes.push_back(recv_rows * op.row_bytes);
    t.send_total += t.send_bytes.back();
    t.recv_total += t.recv_bytes.back();
  }
  return t;
}

// Rows from global rank s to global rank d (alltoall).
uint64_t rowsOf(const DeviceLocalOp& op, const NcclCrossLayout& l, int s, int d) {
  return static_cast<uint64_t>(op.meta[static_cast<size_t>(s) * l.world + d]);
}

Status alltoallInput(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l,
                     DeviceCtx& ctx, NcclCrossBuffer* buf) {
  ASSIGN_OR_RETURN(AlltoallLayout t, alltoallLayout(op, l));
  const size_t total = t.send_total + t.recv_total;
  if (total > 0) {
    ASSIGN_OR_RETURN(auto arena, api.createArena(ctx.device, total));
    buf->staging = std::move(arena);
  }
  char* send = buf->staging ? static_cast<char*>(buf->staging->data()) : nullptr;
  const int lo = l.rank_offsets[l.cross_rank];
  const int k = l.local_sizes[l.cross_rank];
  size_t at = 0;
  for (size_t a = 0; a < l.rank_offsets.size(); ++a) {  // destination agents by cross rank
    for (int d = l.rank_offsets[a]; d < l.rank_offsets[a] + l.local_sizes[a]; ++d) {
      for (int i = 0; i < k; ++i) {
        uint64_t off = 0;  // of d's rows in local rank i's input
        for (int x = 0; x < d; ++x) off += rowsOf(op, l, lo + i, x);
        const uint64_t bytes = rowsOf(op, l, lo + i, d) * op.row_bytes;
        if (bytes > 0) {
          RETURN_IF_ERROR(
              api.copyAsync(send + at, inOf(op, i) + off * op.row_bytes, bytes, ctx.s()));
        }
        at += bytes;
      }
    }
  }
  buf->data = send;
  buf->out = send != nullptr ? send + t.send_total : nullptr;
  buf->blocks = std::move(t.send_bytes);
  buf->recv_blocks = std::move(t.recv_bytes);
  return okStatus();
}

Status alltoallOutput(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l,
                      const NcclCrossBuffer& buf, void* s) {
  const int lo = l.rank_offsets[l.cross_rank];
  const int k = l.local_sizes[l.cross_rank];
  const char* recv = static_cast<const char*>(buf.out);
  std::vector<uint64_t> out_at(static_cast<size_t>(k), 0);  // bytes written into each output
  size_t at = 0;
  for (size_t a = 0; a < l.rank_offsets.size(); ++a) {
    const int alo = l.rank_offsets[a], ahi = alo + l.local_sizes[a];
    for (int i = 0; i < k; ++i) {
      uint64_t bytes = 0;
      for (int x = alo; x < ahi; ++x) bytes += rowsOf(op, l, x, lo + i) * op.row_bytes;
      if (bytes > 0) RETURN_IF_ERROR(api.copyAsync(outOf(op, i) + out_at[i], recv + at, bytes, s));
      out_at[i] += bytes;
      at += bytes;
    }
  }
  return okStatus();
}

Status gatherInput(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l, void* s,
                   NcclCrossBuffer* buf) {
  ASSIGN_OR_RETURN(GatherLayout g, gatherLayout(op, l));
  const int first = l.rank_offsets[l.cross_rank];
  char* out0 = outOf(op, 0);
  for (size_t i = 0; i < op.grants.size(); ++i) {
    const int r = first + static_cast<int>(i);
    const uint64_t bytes = g.offsets[r + 1] - g.offsets[r];
    if (bytes > 0) RETURN_IF_ERROR(api.copyAsync(out0 + g.offsets[r], inOf(op, i), bytes, s));
  }
  buf->out = out0;
  buf->data = out0 + g.offsets[first];
  buf->blocks = std::move(g.agent_bytes);
  return okStatus();
}

Status scatterInput(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l, void* s,
                    NcclCrossBuffer* buf) {
  ASSIGN_OR_RETURN(ScatterLayout sl, scatterLayout(op, l));
  std::vector<void*> ins;
  for (size_t i = 0; i < op.grants.size(); ++i) ins.push_back(inOf(op, i));
  if (op.count > 0) {
    RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, ins.data(), static_cast<int>(ins.size()),
                                     ins.data(), 1, op.count, op.prescale, 1.0, s));
  }
  const size_t es = dataTypeSize(op.dtype);
  buf->data = ins[0];
  buf->out = inOf(op, 0) + sl.ranks[l.rank_offsets[l.cross_rank]].offset * es;
  buf->blocks = std::move(sl.agent_counts);
  return okStatus();
}

Status gatherOutput(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l,
                    void* s) {
  ASSIGN_OR_RETURN(GatherLayout g, gatherLayout(op, l));
  const uint64_t total = g.offsets.back();
  if (total == 0) return okStatus();
  for (size_t i = 1; i < op.grants.size(); ++i)
    RETURN_IF_ERROR(api.copyAsync(outOf(op, i), outOf(op, 0), total, s));
  return okStatus();
}

Status scatterOutput(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l,
                     void* s) {
  ASSIGN_OR_RETURN(ScatterLayout sl, scatterLayout(op, l));
  const size_t es = dataTypeSize(op.dtype);
  const char* reduced = inOf(op, 0);
  const int first = l.rank_offsets[l.cross_rank];
  for (size_t i = 0; i < op.grants.size(); ++i) {
    const gpu::ElemBlock& b = sl.ranks[first + static_cast<int>(i)];
    if (b.count == 0) continue;
    const void* src = reduced + b.offset * es;
    void* dst = outOf(op, i);
    RETURN_IF_ERROR(
        api.launchReduce(op.dtype, op.op, &src, 1, &dst, 1, b.count, 1.0, op.postscale, s));
  }
  return okStatus();
}

// Frees `staging` once the agent stream has passed what is enqueued now
// (DeviceCtx::sweep), never waiting for it here.
Status retireBehindStream(gpu::DeviceApi& api, DeviceCtx& ctx,
                          std::unique_ptr<gpu::DevArena>& staging) {
  if (!staging) return okStatus();
  ASSIGN_OR_RETURN(auto passed, api.createEvent(false));
  Status st = passed->record(ctx.s());
  if (!st.isOk()) return st;  // (the buffer is then freed with its caller's state)
  RetiredGrant r;
  r.passed = std::move(passed);
  r.arena = std::move(staging);
  ctx.retired.push_back(std::move(r));
  return okStatus();
}

Status enqueueLayoutWork(gpu::DeviceApi& api, const DeviceLocalOp& op, const NcclCrossLayout& l,
                         DeviceCtx& ctx, NcclCrossBuffer* out) {
  switch (op.collective) {
    case CollectiveType::kAllgather:
      return gatherInput(api, op, l, ctx.s(), out);
    case CollectiveType::kReducescatter:
      return scatterInput(api, op, l, ctx.s(), out);
    case CollectiveType::kAlltoall:
      return alltoallInput(api, op, l, ctx, out);
    default:
      return invalidArgument(what(op) + ": not wired across agents over NCCL");
  }
}

}  // namespace

StatusOr<NcclCrossBuffer> enqueueNcclLayoutInput(const DeviceLocalOp& op,
                                                 const NcclCrossLayout& layout) {
  RETURN_IF_ERROR(checkLayout(op, layout));
  gpu::DeviceApi& api = *gpu::deviceApi();
  DeviceCtx& ctx = *seam(op.grants[0])->ctx_;
  RETURN_IF_ERROR(api.setDevice(ctx.device));
  ctx.sweep();
  for (size_t i = 0; i < op.grants.size(); ++i)
    RETURN_IF_ERROR(seam(op.grants[i])->in_.at(op.events[i])->streamWait(ctx.s()));
  NcclCrossBuffer out;
  Status st = enqueueLayoutWork(api, op, layout, ctx, &out);
  StatusOr<std::unique_ptr<gpu::DevEvent>> ev = internalError("no event");
  if (st.isOk()) {
    ev = api.createEvent(false);
    st = ev.isOk() ? (*ev)->record(ctx.s()) : ev.status();
  }
  if (!st.isOk()) {
    // Copies into the staging buffer may be enqueued: it outlives them.
    (void)retireBehindStream(api, ctx, out.staging);
    return st;
  }
  out.ready = std::shared_ptr<gpu::DevEvent>(std::move(*ev));
  return out;
}

Status enqueueNcclLayoutOutput(const DeviceLocalOp& op, const NcclCrossLayout& layout,
                               NcclCrossBuffer& buf, bool ok) {
  RETURN_IF_ERROR(checkLayout(op, layout));
  gpu::DeviceApi& api = *gpu::deviceApi();
  DeviceCtx& ctx = *seam(op.grants[0])->ctx_;
  RETURN_IF_ERROR(api.setDevice(ctx.device));
  Status st;
  if (ok && buf.ready != nullptr) {
    if (op.collective == CollectiveType::kAllgather) {
      st = gatherOutput(api, op, layout, ctx.s());
    } else if (op.collective == CollectiveType::kReducescatter) {
      st = scatterOutput(api, op, layout, ctx.s());
    } else if (op.collective == CollectiveType::kAlltoall) {
      st = alltoallOutput(api, op, layout, buf, ctx.s());
    }
  }
  // The staging buffer is freed once the agent stream has passed the copies out of it.
  Status ret = retireBehindStream(api, ctx, buf.staging);
  if (st.isOk()) st = ret;
  Status rec;
  for (size_t i = 0; i < op.grants.size(); ++i) {
    Status r = seam(op.grants[i])->out_.at(op.events[i])->record(ctx.s());
    if (!r.isOk() && rec.isOk()) rec = r;
  }
  return st.isOk() ? rec : st;
}

}  // namespace kolo
