#include "agent/ops/op_plan.h"

#include <string>

#include "agent/core/shm_meta.h"
#include "common/ipc_layout.h"

namespace kolo {

const char* opPlacementName(OpPlacement p) {
  return p == OpPlacement::kOneAgent ? "one agent" : "across agents";
}

const char* opMemoryName(OpMemoryKind m) {
  return m == OpMemoryKind::kShared ? "shared" : "direct";
}

const char* opPathName(OpPath p) {
  switch (p) {
    case OpPath::kNothing:
      return "nothing";
    case OpPath::kLocal:
      return "local";
    case OpPath::kSplit:
      return "split";
    case OpPath::kInPlace:
      return "in place";
    case OpPath::kStaged:
      return "staged";
    case OpPath::kPipelined:
      return "pipelined";
  }
  return "?";
}

namespace {

bool absentAt(const ReadyOp& op, size_t i) { return !op.absent.empty() && op.absent[i]; }

// The one rule for Average: Sum, with the postscale divided by the world size.
void planReduction(const SubmitDesc& d0, int world_size, OpPlan& p) {
  const auto rop = static_cast<ReduceOp>(d0.reduce_op);
  p.reduce = rop == ReduceOp::kAverage ? ReduceOp::kSum : rop;
  p.prescale = d0.prescale;
  p.postscale = rop == ReduceOp::kAverage ? d0.postscale / world_size : d0.postscale;
}

OpPath pathOfLeg(const CrossLegPlan& leg) {
  if (leg.pipelined) return OpPath::kPipelined;
  return leg.in_place ? OpPath::kInPlace : OpPath::kStaged;
}

// The local step's shape as the cross leg sees it (CrossLegInputs, from
// what allreduce's local step holds: a source per present rank and the
// zero source, an output per present rank when out of place or joined).
CrossLegInputs allreduceLegInputs(const ReadyOp& op, const OpPlan& p, const OpWorld& w) {
  const SubmitDesc& d0 = op.descs[0];
  size_t present = 0;
  bool lone_out_elsewhere = false;
  for (size_t i = 0; i < op.descs.size(); ++i) {
    if (absentAt(op, i)) continue;
    ++present;
    const SubmitDesc& d = op.descs[i];
    const bool direct = (d.flags & kSubmitFlagUserMemory) != 0;
    lone_out_elsewhere = !direct && d.out_bytes > 0 && d.out_offset != d.data_offset;
  }
  CrossLegInputs li;
  li.ok = op.error.isOk();
  li.collective = CollectiveType::kAllreduce;
  li.count = p.count;
  li.bytes = d0.data_bytes;
  li.sources = present + (p.zero_source ? 1 : 0);
  li.outputs = p.out_of_place || p.zero_source ? present : 0;
  li.output_elsewhere = li.sources == 1 && li.outputs == 1 && lone_out_elsewhere;
  li.has_scratch = p.zero_source;
  li.direct = p.memory == OpMemoryKind::kDirect;
  li.prescale = p.prescale;
  li.postscale = p.postscale;
  li.pipeline_bytes = w.pipeline_bytes;
  return li;
}

void planAllreduce(const ReadyOp& op, const OpWorld& w, OpPlan& p) {
  const SubmitDesc& d0 = op.descs[0];
  planReduction(d0, w.world_size, p);
  p.count = d0.data_bytes / dataTypeSize(static_cast<DataType>(d0.dtype));
  bool split = false;
  for (size_t i = 0; i < op.descs.size(); ++i) {
    const SubmitDesc& d = op.descs[i];
    split |= (d.flags & kSubmitFlagSplit) != 0;
    if (absentAt(op, i)) continue;
    p.out_of_place |= d.out_bytes > 0 && d.out_offset != d.data_offset;
    if ((d.flags & kSubmitFlagUserMemory) != 0) {
      p.memory = OpMemoryKind::kDirect;
    } else if ((d.flags & kSubmitFlagStreamed) != 0) {
      p.streamed = true;
    }
  }
  p.zero_source = p.joined && p.reduce != ReduceOp::kSum && d0.data_bytes > 0;
  if (d0.data_bytes == 0 && w.cross_size == 1) {
    p.path = OpPath::kNothing;
  } else if (split) {
    p.path = OpPath::kSplit;  // (go on one agent with every rank split alike; else retry)
  } else if (w.cross_size > 1) {
    p.leg = planCrossLeg(allreduceLegInputs(op, p, w));
    p.path = pathOfLeg(p.leg);
  }
}

void planBroadcast(const ReadyOp& op, const OpWorld& w, OpPlan& p) {
  const SubmitDesc& d0 = op.descs[0];
  p.count = d0.data_bytes;  // a byte copy, whatever the dtype
  if (d0.data_bytes == 0 && w.cross_size == 1) {
    p.path = OpPath::kNothing;
  } else if (w.cross_size > 1) {
    CrossLegInputs li;
    li.ok = op.error.isOk();
    li.collective = CollectiveType::kBroadcast;
    li.count = p.count;
    li.bytes = d0.data_bytes;
    li.sources = op.descs.size();
    li.pipeline_bytes = w.pipeline_bytes;
    p.leg = planCrossLeg(li);
    p.path = pathOfLeg(p.leg);
  }
}

// Every rank's first dimension, as the first local rank that takes part
// listed them (its private copy, taken and checked at its submission); the
// other local ranks' copies must agree (they come from one allreduce), so
// each local rank's rows and output region were checked by that rank.
Status planGatherOffsets(const ReadyOp& op, const OpWorld& w, OpPlan& p) {
  const int world = w.world_size;
  const int k = w.local_size;
  p.offsets.assign(world + 1, 0);
  int lead = -1;  // the first local rank that takes part
  for (int i = 0; i < k && lead < 0; ++i) {
    if (!absentAt(op, i)) lead = i;
  }
  auto metaOf = [&](int i) -> const std::vector<int64_t>* {
    const bool have = op.metas.size() == static_cast<size_t>(k) &&
                      op.metas[i].size() == static_cast<size_t>(world);
    return have ? &op.metas[i] : nullptr;
  };
  const std::vector<int64_t>* dims0 = lead >= 0 ? metaOf(lead) : nullptr;
  if (lead >= 0 && dims0 == nullptr) {
    return internalError("allgather of tensor '" + op.name + "': rank " +
                         std::to_string(w.rank_offset + lead) +
                         "'s list of first dimensions is not one of this generation's size " +
                         std::to_string(world));
  }
  for (int i = 0; i < world && dims0 != nullptr; ++i) {
    const int local = i - w.rank_offset;
    if (local >= 0 && local < k && absentAt(op, local) && (*dims0)[i] != 0) {
      return internalError("allgather of tensor '" + op.name + "': rank " + std::to_string(i) +
                           " has joined but is listed with first dimension " +
                           std::to_string((*dims0)[i]));
    }
  }
  for (int i = lead + 1; i < k; ++i) {
    if (absentAt(op, i)) continue;
    const std::vector<int64_t>* dims = metaOf(i);
    if (dims == nullptr || *dims != *dims0) {
      return invalidArgument("allgather of tensor '" + op.name + "': ranks " +
                             std::to_string(w.rank_offset + lead) + " and " +
                             std::to_string(w.rank_offset + i) +
                             " list different first dimensions for the other ranks");
    }
  }
  if (dims0 != nullptr) {
    const uint64_t row = rowBytesOf(op.descs[0]);
    for (int r = 0; r < world; ++r)
      p.offsets[r + 1] = p.offsets[r] + static_cast<uint64_t>((*dims0)[r]) * row;
  }
  return okStatus();
}

// Each rank's private copy of its split matrix (taken and checked at its
// submission); they must be the same matrix, so every rank's rows and
// columns used were checked by the rank they belong to.
Status planSplits(const ReadyOp& op, const OpWorld& w, OpPlan& p) {
  const size_t cells = static_cast<size_t>(w.world_size) * w.world_size;
  p.splits.assign(cells, 0);
  for (int i = 0; i < w.local_size; ++i) {
    if (op.metas.size() != static_cast<size_t>(w.local_size) || op.metas[i].size() != cells) {
      return internalError(
          "alltoall of tensor '" + op.name + "': rank " + std::to_string(w.rank_offset + i) +
          "'s split matrix is not one of this generation's size " + std::to_string(w.world_size));
    }
    if (i > 0 && op.metas[i] != op.metas[0]) {
      return invalidArgument("alltoall of tensor '" + op.name + "': ranks " +
                             std::to_string(w.rank_offset) + " and " +
                             std::to_string(w.rank_offset + i) + " hold different split matrices");
    }
  }
  if (w.local_size > 0) p.splits = op.metas[0];
  return okStatus();
}

// Reducescatter: each global rank's block of first-dimension rows
// (reducescatterRows), as element offsets.
void planScatterOffsets(const ReadyOp& op, const OpWorld& w, OpPlan& p) {
  const SubmitDesc& d0 = op.descs[0];
  planReduction(d0, w.world_size, p);
  uint64_t row = 1;
  for (int i = 1; i < d0.ndim && i < kMaxDims; ++i) row *= static_cast<uint64_t>(d0.shape[i]);
  const int64_t dim0 = d0.ndim >= 1 ? d0.shape[0] : 0;
  p.count = static_cast<uint64_t>(dim0) * row;
  p.offsets.assign(w.world_size + 1, 0);
  for (int r = 0; r < w.world_size; ++r) {
    p.offsets[r] = reducescatterRowOffset(dim0, w.world_size, r) * row;
    p.offsets[r + 1] = p.offsets[r] + reducescatterRows(dim0, w.world_size, r) * row;
  }
}

}  // namespace

OpPlan planOp(const ReadyOp& op, const OpWorld& w) {
  OpPlan p;
  const SubmitDesc& d0 = op.descs[0];
  p.collective = static_cast<CollectiveType>(d0.collective);
  p.placement = w.cross_size > 1 ? OpPlacement::kAcrossAgents : OpPlacement::kOneAgent;
  p.path = w.cross_size > 1 ? OpPath::kStaged : OpPath::kLocal;
  p.joined = op.anyAbsent();
  p.error = op.error;
  switch (p.collective) {
    case CollectiveType::kAllreduce:
    case CollectiveType::kBarrier:
      planAllreduce(op, w, p);
      break;
    case CollectiveType::kBroadcast:
      planBroadcast(op, w, p);
      break;
    case CollectiveType::kAllgather:
      if (p.error.isOk()) p.error = planGatherOffsets(op, w, p);
      if (!p.error.isOk()) p.offsets.assign(w.world_size + 1, 0);
      break;
    case CollectiveType::kAlltoall:
      if (p.error.isOk()) p.error = planSplits(op, w, p);
      if (!p.error.isOk()) p.splits.assign(static_cast<size_t>(w.world_size) * w.world_size, 0);
      break;
    case CollectiveType::kReducescatter:
      planScatterOffsets(op, w, p);
      break;
    case CollectiveType::kJoin:
      break;
  }
  return p;
}

}  // namespace kolo
