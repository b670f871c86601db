#include "agent/gpu/collective_plan.h"

#include "common/ipc_layout.h"

namespace kolo::gpu {

namespace {

bool mulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t* out) {  // a * b + c
  uint64_t m = 0;
  return !__builtin_mul_overflow(a, b, &m) && !__builtin_add_overflow(m, c, out);
}

bool overlaps(uintptr_t a, uint64_t an, uintptr_t b, uint64_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

Status tooLarge(const std::string& what) {
  return invalidArgument(what + ": the sizes overflow 64 bits");
}

}  // namespace

StatusOr<std::vector<uint64_t>> allgatherOffsets(const std::vector<int64_t>& dims,
                                                 uint64_t row_bytes, const std::string& name) {
  const std::string what = "allgather of device tensor '" + name + "'";
  std::vector<uint64_t> off(dims.size() + 1, 0);
  for (size_t r = 0; r < dims.size(); ++r) {
    if (dims[r] < 0) {
      return invalidArgument(what + ": rank " + std::to_string(r) + "'s first dimension is " +
                             std::to_string(dims[r]));
    }
    if (!mulAdd(static_cast<uint64_t>(dims[r]), row_bytes, off[r], &off[r + 1]))
      return tooLarge(what);
  }
  return off;
}

StatusOr<std::vector<CopySegment>> planAllgatherCopies(const std::vector<RankSlots>& slots,
                                                       const std::vector<int64_t>& dims,
                                                       uint64_t row_bytes,
                                                       const std::string& name) {
  if (slots.size() != dims.size()) {
    return invalidArgument("allgather of device tensor '" + name +
                           "': " + std::to_string(slots.size()) + " ranks but " +
                           std::to_string(dims.size()) + " first dimensions");
  }
  ASSIGN_OR_RETURN(std::vector<uint64_t> off, allgatherOffsets(dims, row_bytes, name));
  std::vector<CopySegment> segs;
  for (size_t s = 0; s < slots.size(); ++s) {
    const uint64_t bytes = off[s + 1] - off[s];
    if (bytes == 0) continue;
    for (size_t d = 0; d < slots.size(); ++d) {
      const uintptr_t dst = slots[d].out + off[s];
      if (dst == slots[s].in) continue;  // in place
      if (overlaps(slots[s].in, bytes, dst, bytes)) {
        return invalidArgument("allgather of device tensor '" + name + "': rank " +
                               std::to_string(s) + "'s input overlaps rank " + std::to_string(d) +
                               "'s output at another offset");
      }
      segs.push_back(CopySegment{reinterpret_cast<const void*>(slots[s].in),
                                 reinterpret_cast<void*>(dst), static_cast<size_t>(bytes)});
    }
  }
  return segs;
}

StatusOr<std::vector<ElemBlock>> reducescatterBlocks(int64_t dim0, uint64_t row_elems, int size,
                                                     const std::string& name) {
  const std::string what = "reducescatter of device tensor '" + name + "'";
  if (size < 1) return invalidArgument(what + ": " + std::to_string(size) + " ranks");
  if (dim0 < 0) return invalidArgument(what + ": the first dimension is " + std::to_string(dim0));
  std::vector<ElemBlock> blocks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const auto rows = static_cast<uint64_t>(reducescatterRows(dim0, size, r));
    const auto first = static_cast<uint64_t>(reducescatterRowOffset(dim0, size, r));
    if (!mulAdd(rows, row_elems, 0, &blocks[r].count) ||
        !mulAdd(first, row_elems, 0, &blocks[r].offset)) {
      return tooLarge(what);
    }
  }
  return blocks;
}

StatusOr<std::vector<ReduceBlock>> planReducescatter(const std::vector<RankSlots>& slots,
                                                     int64_t dim0, uint64_t row_elems,
                                                     size_t elem_bytes, const std::string& name) {
  const std::string what = "reducescatter of device tensor '" + name + "'";
  const int k = static_cast<int>(slots.size());
  ASSIGN_OR_RETURN(std::vector<ElemBlock> blocks, reducescatterBlocks(dim0, row_elems, k, name));
  uint64_t in_bytes = 0;
  if (!mulAdd(static_cast<uint64_t>(dim0), row_elems, 0, &in_bytes) ||
      !mulAdd(in_bytes, elem_bytes, 0, &in_bytes)) {
    return tooLarge(what);
  }
  std::vector<ReduceBlock> out;
  for (int r = 0; r < k; ++r) {
    if (blocks[r].count == 0) continue;
    const uint64_t out_bytes = blocks[r].count * elem_bytes;
    ReduceBlock b;
    b.rank = r;
    b.dst = slots[r].out;
    b.count = blocks[r].count;
    for (int s = 0; s < k; ++s) {
      if (overlaps(slots[s].in, in_bytes, b.dst, out_bytes)) {
        return invalidArgument(what + ": rank " + std::to_string(r) + "'s output overlaps rank " +
                               std::to_string(s) + "'s input (reducescatter is not in place)");
      }
      b.srcs.push_back(slots[s].in + blocks[r].offset * elem_bytes);
    }
    out.push_back(std::move(b));
  }
  return out;
}

StatusOr<AlltoallPlan> planAlltoallCopies(const std::vector<RankSlots>& slots,
                                          const std::vector<int64_t>& splits,
                                          const std::vector<int64_t>& dims, uint64_t row_bytes,
                                          const std::string& name) {
  const std::string what = "alltoall of device tensor '" + name + "'";
  const size_t k = slots.size();
  if (dims.size() != k || splits.size() != k * k) {
    return invalidArgument(what + ": " + std::to_string(k) + " ranks need a " + std::to_string(k) +
                           "x" + std::to_string(k) + " split matrix and " + std::to_string(k) +
                           " first dimensions, not " + std::to_string(splits.size()) +
                           " splits and " + std::to_string(dims.size()) + " first dimensions");
  }
  AlltoallPlan p;
  p.recv_rows.assign(k, 0);
  p.recv_splits.assign(k * k, 0);
  for (size_t s = 0; s < k; ++s) {
    int64_t sum = 0;
    for (size_t d = 0; d < k; ++d) {
      const int64_t m = splits[s * k + d];
      if (m < 0) {
        return invalidArgument(what + ": rank " + std::to_string(s) + " sends " +
                               std::to_string(m) + " rows to rank " + std::to_string(d));
      }
      if (__builtin_add_overflow(sum, m, &sum) ||
          __builtin_add_overflow(p.recv_rows[d], m, &p.recv_rows[d])) {
        return tooLarge(what);
      }
      p.recv_splits[d * k + s] = m;
    }
    if (sum != dims[s]) {
      return invalidArgument(what + ": rank " + std::to_string(s) + "'s splits add up to " +
                             std::to_string(sum) + " rows, but its tensor has " +
                             std::to_string(dims[s]));
    }
  }
  // dst_off[d]: where the next block received by rank d goes (from rank 0 first).
  std::vector<uint64_t> dst_off(k, 0);
  for (size_t s = 0; s < k; ++s) {
    uint64_t src_off = 0;
    for (size_t d = 0; d < k; ++d) {
      uint64_t bytes = 0;
      if (!mulAdd(static_cast<uint64_t>(splits[s * k + d]), row_bytes, 0, &bytes))
        return tooLarge(what);
      if (bytes > 0) {
        const uintptr_t src = slots[s].in + src_off;
        const uintptr_t dst = slots[d].out + dst_off[d];
        for (size_t r = 0; r < k; ++r) {
          if (overlaps(slots[r].in, static_cast<uint64_t>(dims[r]) * row_bytes, dst, bytes)) {
            return invalidArgument(what + ": rank " + std::to_string(d) +
                                   "'s output overlaps rank " + std::to_string(r) +
                                   "'s input (alltoall is not in place)");
          }
        }
        p.copies.push_back(CopySegment{reinterpret_cast<const void*>(src),
                                       reinterpret_cast<void*>(dst), static_cast<size_t>(bytes)});
      }
      src_off += bytes;
      dst_off[d] += bytes;
    }
  }
  return p;
}

}  // namespace kolo::gpu
