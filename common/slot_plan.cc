#include "common/slot_plan.h"

#include <algorithm>
#include <cstring>

namespace kolo {

namespace {

uint64_t alignUp(uint64_t v) { return (v + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }

// The bytes of one row (everything after the first dimension).
uint64_t rowBytes(const SlotRequest& r) {
  uint64_t row = dataTypeSize(r.dtype);
  for (int i = 1; i < r.ndim; ++i) row *= static_cast<uint64_t>(r.shape[i]);
  return row;
}

// Whether [off, off + bytes) lies within one kolo_alloc_shared buffer.
bool withinOneShared(const SlotGeometry& g, uint64_t off, uint64_t bytes) {
  if (g.shared == nullptr) return false;
  auto it = g.shared->upper_bound(off);
  if (it == g.shared->begin()) return false;
  --it;
  return off + bytes <= it->first + it->second;
}

SlotPiece inSlot(uint64_t at, uint64_t bytes) { return SlotPiece{at, bytes, true}; }
SlotPiece absolute(uint64_t at, uint64_t bytes) { return SlotPiece{at, bytes, false}; }

// Allgather / alltoall: one slot holds [header | output, padded | input].
StatusOr<SlotPlan> planGather(const SlotRequest& r, const SlotGeometry& g) {
  const bool a2a = r.splits_matrix != nullptr;
  const int64_t* header = a2a ? r.splits_matrix : r.gather_dims;
  if (header == nullptr) {
    return internalError(describeTensor(r.collective, r.name) +
                         ": submitted without the ranks' first dimensions or split matrix");
  }
  const size_t n = static_cast<size_t>(g.size);
  SlotPlan p;
  p.gather = true;
  for (size_t s = 0; s < n; ++s) {
    p.gather_dim0 += a2a ? r.splits_matrix[s * n + static_cast<size_t>(g.rank)] : r.gather_dims[s];
  }
  const uint64_t prefix = a2a ? alltoallSplitsBytes(g.size) : allgatherSizesBytes(g.size);
  const uint64_t total = static_cast<uint64_t>(p.gather_dim0) * rowBytes(r);
  const uint64_t out_padded = alignUp(total);
  p.slot_bytes = prefix + out_padded + r.bytes;
  p.header = inSlot(0, sizeof(int64_t) * (a2a ? n * n : n));
  p.header_src = header;
  p.out = inSlot(0, prefix + total);
  p.result = inSlot(prefix, total);
  p.result_bytes = total;
  p.input = inSlot(prefix + out_padded, r.bytes);
  p.copy = r.bytes > 0 ? CopyIn::kPlain : CopyIn::kNone;
  return p;
}

// Reducescatter: one slot holds [input, padded | this rank's block of rows].
StatusOr<SlotPlan> planReducescatter(const SlotRequest& r, const SlotGeometry& g) {
  SlotPlan p;
  const uint64_t out_bytes =
      static_cast<uint64_t>(reducescatterRows(r.shape[0], g.size, g.rank)) * rowBytes(r);
  if (out_bytes > 0 && !r.has_output) {
    return invalidArgument(describeTensor(r.collective, r.name) + ": output is NULL");
  }
  p.result_bytes = r.bytes;
  if (r.bytes == 0 && out_bytes == 0) return p;
  const uint64_t in_padded = alignUp(r.bytes);
  p.slot_bytes = in_padded + out_bytes;
  p.input = inSlot(0, r.bytes);
  p.out = inSlot(in_padded, out_bytes);
  p.result = p.out;
  p.result_bytes = out_bytes;
  p.copy = r.bytes > 0 ? CopyIn::kPlain : CopyIn::kNone;
  return p;
}

// Zero copy: the input already lives in a kolo_alloc_shared buffer; an
// allreduce may name another one as its output (the agent writes there).
StatusOr<SlotPlan> planZeroCopy(const SlotRequest& r, const SlotGeometry& g) {
  const std::string what = describeTensor(r.collective, r.name);
  const uint64_t off = *r.input_offset;
  if (!withinOneShared(g, off, r.bytes)) {
    return invalidArgument(what + ": its " + std::to_string(r.bytes) +
                           " bytes start inside the shared arena but do not lie within one "
                           "buffer from kolo_alloc_shared");
  }
  SlotPlan p;
  p.input = absolute(off, r.bytes);
  p.result = p.input;
  p.result_bytes = r.bytes;
  if (r.collective != CollectiveType::kAllreduce || !r.output_offset || *r.output_offset == off) {
    return p;
  }
  const uint64_t out = *r.output_offset;
  if (!withinOneShared(g, out, r.bytes)) {
    return invalidArgument(what + ": its output's " + std::to_string(r.bytes) +
                           " bytes start inside the shared arena but do not lie within one "
                           "buffer from kolo_alloc_shared");
  }
  if (out < off + r.bytes && off < out + r.bytes) {
    return invalidArgument(what + ": the output overlaps the input without being the same buffer");
  }
  p.out = absolute(out, r.bytes);
  p.result = p.out;
  p.shared_input = true;
  return p;
}

// The direct path takes a plain host allreduce whose input and output both
// lie outside the arena (kolo_alloc_shared buffers are zero copy already).
bool isDirect(const SlotRequest& r, const SlotGeometry& g) {
  return g.direct_min_bytes > 0 && r.collective == CollectiveType::kAllreduce && !r.compressed &&
         r.bytes >= g.direct_min_bytes && r.has_output && r.input_addr != 0 && r.output_addr != 0 &&
         !r.input_offset && !r.output_offset;
}

}  // namespace

std::string describeTensor(CollectiveType collective, std::string_view name) {
  constexpr size_t kShown = 64;
  std::string s(collectiveName(collective));
  s += " of tensor '";
  s.append(name.substr(0, kShown));
  s += name.size() > kShown ? "...'" : "'";
  return s;
}

StatusOr<SlotPlan> planSlots(const SlotRequest& r, const SlotGeometry& g) {
  if (r.collective == CollectiveType::kAllgather || r.collective == CollectiveType::kAlltoall) {
    return planGather(r, g);
  }
  if (r.collective == CollectiveType::kReducescatter) return planReducescatter(r, g);
  SlotPlan p;
  p.result_bytes = r.bytes;
  if (r.bytes == 0) return p;  // nothing to place (barrier, join, empty tensors)
  if (r.compressed) {
    p.copy = r.dtype == DataType::kFloat16 ? CopyIn::kToFloat16 : CopyIn::kToBFloat16;
  } else if (r.input_offset && !r.out_of_place) {
    return planZeroCopy(r, g);
  } else if (isDirect(r, g)) {
    p.direct = true;
    p.input = absolute(r.input_addr, r.bytes);
    if (r.output_addr != r.input_addr) {
      if (r.output_addr < r.input_addr + r.bytes && r.input_addr < r.output_addr + r.bytes) {
        return invalidArgument(describeTensor(r.collective, r.name) +
                               ": the output overlaps the input without being the same buffer");
      }
      p.out = absolute(r.output_addr, r.bytes);
    }
    return p;
  } else {
    p.copy = CopyIn::kPlain;
  }
  p.slot_bytes = r.bytes;
  p.input = inSlot(0, r.bytes);
  p.result = p.input;
  return p;
}

SubmitDesc describeSubmit(const SlotRequest& r, const SlotPlan& plan, uint64_t slot_offset) {
  SubmitDesc d{};
  d.collective = static_cast<uint8_t>(r.collective);
  d.dtype = static_cast<uint8_t>(r.dtype);
  d.reduce_op = static_cast<uint8_t>(r.op);
  d.ndim = static_cast<uint8_t>(r.ndim);
  d.root = r.collective == CollectiveType::kBroadcast ? r.root : -1;
  d.name_len = static_cast<uint32_t>(r.name.size());
  d.prescale = r.prescale;
  d.postscale = r.postscale;
  if (plan.direct) d.flags |= kSubmitFlagUserMemory;
  d.data_offset = plan.input.offset(slot_offset);
  d.data_bytes = r.bytes;
  d.out_offset = plan.out.offset(slot_offset);
  d.out_bytes = plan.out.bytes;
  for (int i = 0; i < r.ndim && i < kMaxDims; ++i) d.shape[i] = r.shape[i];
  std::memcpy(d.name, r.name.data(), std::min(r.name.size(), kMaxNameBytes));
  d.group_id = r.group_id;
  d.group_hash = r.group_hash;
  d.group_size = r.group_size;
  return d;
}

}  // namespace kolo
