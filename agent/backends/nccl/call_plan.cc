#include "agent/backends/nccl/call_plan.h"

#include <algorithm>

namespace kolo::nccl {
namespace {
bool allEqual(const std::vector<size_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](size_t x) { return x == v[0]; });
}
}  // namespace

std::vector<Call> planAllgatherv(int rank, const std::vector<size_t>& recv_bytes) {
  std::vector<Call> calls;
  if (recv_bytes.empty()) return calls;
  if (allEqual(recv_bytes)) {
    if (recv_bytes[0] > 0) calls.push_back({Call::kAllGather, -1, 0, 0, recv_bytes[0], true});
    return calls;
  }
  size_t off = 0;
  for (int i = 0; i < static_cast<int>(recv_bytes.size()); ++i) {
    if (recv_bytes[i] > 0) calls.push_back({Call::kBroadcast, i, 0, off, recv_bytes[i], i == rank});
    off += recv_bytes[i];
  }
  return calls;
}

std::vector<Call> planReducescatter(int rank, const std::vector<size_t>& recv_counts) {
  std::vector<Call> calls;
  if (recv_counts.empty()) return calls;
  if (allEqual(recv_counts)) {
    if (recv_counts[0] > 0) calls.push_back({Call::kReduceScatter, -1, 0, 0, recv_counts[0], true});
    return calls;
  }
  size_t off = 0;
  for (int i = 0; i < static_cast<int>(recv_counts.size()); ++i) {
    if (recv_counts[i] > 0) calls.push_back({Call::kReduce, i, off, 0, recv_counts[i], true});
    off += recv_counts[i];
  }
  (void)rank;
  return calls;
}

std::vector<Call> planAlltoallv(const std::vector<size_t>& send_bytes,
                                const std::vector<size_t>& recv_bytes) {
  std::vector<Call> calls;
  size_t soff = 0, roff = 0;
  for (int p = 0; p < static_cast<int>(send_bytes.size()); ++p) {
    if (send_bytes[p] > 0) calls.push_back({Call::kSend, p, soff, 0, send_bytes[p], true});
    if (p < static_cast<int>(recv_bytes.size()) && recv_bytes[p] > 0)
      calls.push_back({Call::kRecv, p, 0, roff, recv_bytes[p], true});
    soff += send_bytes[p];
    if (p < static_cast<int>(recv_bytes.size())) roff += recv_bytes[p];
  }
  return calls;
}

}  // namespace kolo::nccl
