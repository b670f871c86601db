#include "agent/core/shm_meta.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "agent/core/tensor_table.h"
#include "common/dtype.h"

namespace kolo {

std::vector<int64_t> copyShmMeta(const char* src, size_t count) {
  std::vector<int64_t> out(count);
  if (count > 0) std::memcpy(out.data(), src, count * sizeof(int64_t));
  return out;
}

uint64_t rowBytesOf(const SubmitDesc& d) {
  uint64_t row = dataTypeSize(static_cast<DataType>(d.dtype));
  for (int i = 1; i < d.ndim && i < kMaxDims; ++i) row *= static_cast<uint64_t>(d.shape[i]);
  return row;
}

namespace {

std::string tensorName(const SubmitDesc& d) {
  return std::string(d.name, std::min<size_t>(d.name_len, kMaxNameBytes));
}

// rows * row == bytes, without overflow.
bool rowsFill(uint64_t rows, uint64_t row, uint64_t bytes) {
  uint64_t product;
  if (__builtin_mul_overflow(rows, row, &product)) return false;
  return product == bytes;
}

}  // namespace

Status checkAllgatherSizes(const SubmitDesc& d, int world, int me,
                           const std::vector<int64_t>& dims) {
  auto bad = [&](const std::string& what) {
    return invalidArgument("allgather of tensor '" + tensorName(d) + "': " + what);
  };
  if (d.ndim < 1) return bad("it needs at least one dimension");
  const uint64_t prefix = allgatherSizesBytes(world);
  if (world < 1 || me < 0 || me >= world || dims.size() != static_cast<size_t>(world) ||
      d.out_bytes < prefix) {
    return bad("malformed descriptor: the output region lacks the ranks' first dimensions");
  }
  if (dims[me] != d.shape[0]) {
    return bad("malformed descriptor: rank " + std::to_string(me) + " lists first dimension " +
               std::to_string(dims[me]) + " but sent shape " + TensorTable::shapeString(d));
  }
  uint64_t total = 0;
  for (int r = 0; r < world; ++r) {
    if (dims[r] < 0)
      return bad("malformed descriptor: negative first dimension for rank " + std::to_string(r));
    if (__builtin_add_overflow(total, static_cast<uint64_t>(dims[r]), &total)) {
      return bad("malformed descriptor: the ranks' first dimensions overflow");
    }
  }
  const uint64_t row = rowBytesOf(d);
  if (!rowsFill(total, row, d.out_bytes - prefix)) {
    return bad("malformed descriptor: output region of " + std::to_string(d.out_bytes - prefix) +
               " bytes, the ranks' first dimensions add up to " + std::to_string(total) +
               " rows of " + std::to_string(row) + " bytes");
  }
  return okStatus();
}

Status checkAlltoallSplits(const SubmitDesc& d, int world, int me, const std::vector<int64_t>& m) {
  auto bad = [&](const std::string& what) {
    return invalidArgument("alltoall of tensor '" + tensorName(d) + "': " + what);
  };
  if (d.ndim < 1) return bad("it needs at least one dimension");
  const uint64_t prefix = alltoallSplitsBytes(world);
  if (world < 1 || me < 0 || me >= world || m.size() != static_cast<size_t>(world) * world ||
      d.out_bytes < prefix) {
    return bad("malformed descriptor: the output region lacks the split matrix");
  }
  uint64_t sent = 0, received = 0;
  bool overflow = false;
  for (int t = 0; t < world; ++t) {
    const int64_t out = m[static_cast<size_t>(me) * world + t];
    const int64_t in = m[static_cast<size_t>(t) * world + me];
    if (out < 0 || in < 0) return bad("malformed descriptor: negative split");
    overflow |= __builtin_add_overflow(sent, static_cast<uint64_t>(out), &sent);
    overflow |= __builtin_add_overflow(received, static_cast<uint64_t>(in), &received);
  }
  if (overflow || sent != static_cast<uint64_t>(d.shape[0])) {
    return bad("rank " + std::to_string(me) + "'s splits add up to " +
               (overflow ? std::string("more than 2^64") : std::to_string(sent)) +
               " rows, but its tensor has " + std::to_string(d.shape[0]));
  }
  if (!rowsFill(received, rowBytesOf(d), d.out_bytes - prefix)) {
    return bad("malformed descriptor: output region does not match the rows this rank receives");
  }
  return okStatus();
}

std::vector<AlltoallCopy> alltoallLocalCopies(const std::vector<int64_t>& m, int world, int base,
                                              int k, uint64_t row) {
  auto M = [&](int s, int d) {
    return static_cast<uint64_t>(m[static_cast<size_t>(s) * world + d]);
  };
  std::vector<AlltoallCopy> out;
  for (int i = 0; i < k; ++i) {
    const int s = base + i;
    uint64_t src = 0;  // rows of s before those it sends to d
    for (int d = 0; d < base; ++d) src += M(s, d);
    for (int j = 0; j < k; ++j) {
      const int d = base + j;
      uint64_t dst = 0;  // rows d receives before those from s
      for (int t = 0; t < s; ++t) dst += M(t, d);
      const uint64_t rows = M(s, d);
      if (rows > 0 && row > 0) out.push_back({i, j, src * row, dst * row, rows * row});
      src += rows;
    }
  }
  return out;
}

}  // namespace kolo
