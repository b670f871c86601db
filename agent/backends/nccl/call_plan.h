// How the nccl backend maps the Backend interface's variable-size
// collectives onto NCCL calls (NCCL has no allgatherv/reducescatterv/
// alltoallv). Pure logic, built in every configuration and unit-tested
// without a GPU: every rank must issue the same collective calls in the same
// order inside one group, and send/recv pairs must match.
//
//  - allgatherv: all blocks equal -> one AllGather (in place when `in` is
//    this rank's block of `out`); else one Broadcast per non-empty block,
//    rooted at its owner, into that block of `out`.
//  - reducescatter: all counts equal -> one ReduceScatter; else one Reduce
//    per non-empty block, rooted at its owner (recvbuff used only there).
//  - alltoallv: one Send and one Recv per peer with bytes to move (self too:
//    NCCL copies to itself inside the group).
#pragma once

#include <cstddef>
#include <vector>

namespace kolo::nccl {

struct Call {
  enum Kind { kAllGather, kBroadcast, kReduceScatter, kReduce, kSend, kRecv };
  Kind kind;
  int peer = -1;         // root (Broadcast, Reduce) or peer (Send, Recv); -1 otherwise
  size_t in_offset = 0;  // into the input buffer (units: bytes or elements, see below)
  size_t out_offset = 0; // into the output buffer
  size_t count = 0;      // bytes or elements
  bool use_in = true;    // Broadcast: the root sends from `in` (else from out + out_offset)
};

// Units: bytes.
std::vector<Call> planAllgatherv(int rank, const std::vector<size_t>& recv_bytes);
// Units: elements.
std::vector<Call> planReducescatter(int rank, const std::vector<size_t>& recv_counts);
// Units: bytes.
std::vector<Call> planAlltoallv(const std::vector<size_t>& send_bytes,
                                const std::vector<size_t>& recv_bytes);

}  // namespace kolo::nccl
