// The shared-memory contract between libkolo and kolo-agent.
//
// Each client has one arena: a memfd created by the agent, passed to the
// client with SCM_RIGHTS, mapped by both. Layout:
//
//   [ArenaHeader][submission ring][completion ring][data region ......]
//
// The client owns allocation inside the data region (it copies tensors in,
// or allocates tensors there directly for zero copy), writes a SubmitDesc
// into the submission ring and signals the doorbell eventfd (unless the
// agent is awake and polling). The agent reads
// the k local ranks' slots, reduces, writes the result back into every
// rank's slot (in place), and posts a CompletionDesc, then signals the
// client's completion eventfd if the client sleeps (ArenaHeader's flags).
// Offsets are relative to the arena start.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/spsc_ring.h"

namespace kolo {

constexpr uint32_t kArenaMagic = 0x4b4f4c41;  // "KOLA"
// 2: SubmitDesc gained the group fields; 3: generation; 4: the header's
// wake-up flags (agent_polling, client_waiting honoured, frames_sent);
// 5: SubmitDesc.split_epoch (split reduction); 6: SubmitDesc.meta_offset
// (the header of a device allgather / alltoall, in the shared arena); 7:
// the DeviceEvents / DeviceEventsGranted frames (a device event pool that
// grows past 64 pairs).
constexpr uint32_t kIpcProtocolVersion = 7;
constexpr size_t kMaxNameBytes = 255;
constexpr int kMaxDims = 8;
constexpr size_t kMaxErrorBytes = 440;
constexpr uint64_t kSubmitRingCapacity = 1024;
constexpr uint64_t kCompletionRingCapacity = 1024;
// An allgather of tensor N is an allreduce named N + this suffix (every
// rank's first dimension) followed by the gather itself.
constexpr std::string_view kAllgatherSizesSuffix = ".__sizes";
constexpr bool isAllgatherSizesName(std::string_view name) {
  return name.size() > kAllgatherSizesSuffix.size() &&
         name.substr(name.size() - kAllgatherSizesSuffix.size()) == kAllgatherSizesSuffix;
}
constexpr size_t kDataAlignment = 64;         // every slot starts on a cache line
constexpr uint64_t kDefaultArenaBytes = 1ull << 30;  // sparse memfd; pages are touched on use

struct SubmitDesc {
  uint64_t handle;          // client-chosen id, echoed in the completion
  uint8_t collective;       // CollectiveType
  uint8_t dtype;            // DataType
  uint8_t reduce_op;        // ReduceOp
  uint8_t ndim;
  int32_t root;             // broadcast root (global rank)
  uint32_t flags;
  uint32_t name_len;
  double prescale;
  double postscale;
  uint64_t data_offset;     // input (and in-place output) slot in the arena
  uint64_t data_bytes;
  uint64_t out_offset;      // separate output slot (allgather etc.); 0 if in place
  uint64_t out_bytes;
  int64_t shape[kMaxDims];
  char name[kMaxNameBytes + 1];
  // Grouped allreduce: the members of a rank's n-th grouped allreduce carry
  // group_id = n (from 1), the number of members and a hash of the members'
  // names in order; all three must match across ranks. 0: not grouped.
  uint64_t group_id;
  uint64_t group_hash;
  uint32_t group_size;
  // Device tensors (flags & kSubmitFlagDevice): the index of the
  // interprocess event pair this op uses (the client's in_ready, recorded
  // after its copy into the device arena; the agent's out_ready, recorded
  // after the result). Was `reserved` (always 0) before the device path.
  uint32_t device_event;
  // The World generation the client had when it submitted (0: none yet).
  // An elastic job's agent refuses an op of another generation with
  // MEMBERSHIP_CHANGED (docs/elastic.md).
  uint64_t generation;
  // Split reduction (kSubmitFlagSplit): the PeerArenas frame whose mappings
  // this rank will read the other ranks' slots through. 0 otherwise.
  uint64_t split_epoch;
  // Device allgather / alltoall (flags & kSubmitFlagDevice): the offset in
  // this (host) shared arena of the int64 header the host path puts at the
  // start of the output region (every rank's first dimension, the split
  // matrix), since the agent reads it on the host and the output region is
  // device memory (docs/gpu.md, "Allgather, reducescatter, alltoall").
  // The device output region keeps the header's room, unwritten. 0 otherwise.
  uint64_t meta_offset;
};

// SubmitDesc.flags. kSubmitFlagDevice: data_offset/out_offset refer to the
// client's device arena (docs/gpu.md), not to this shared arena.
constexpr uint32_t kSubmitFlagDevice = 1u << 0;
// Interprocess events per client and direction (device ops in flight).
constexpr uint32_t kMaxDeviceEvents = 64;
// kSubmitFlagUserMemory ("direct", docs/architecture.md): an allreduce whose
// data_offset and out_offset are addresses in the submitting process's own
// memory, not arena offsets. The agent reads the input and writes the
// result there with process_vm_readv/writev (cross-memory attach), so the
// tensor is never copied into or out of the arena. Only for a client the
// agent admitted to it (Welcome.direct_min_bytes > 0 after its probe).
constexpr uint32_t kSubmitFlagUserMemory = 1u << 1;
// kSubmitFlagStreamed ("streamed copy-in", docs/architecture.md): a host
// allreduce across agents published *before* its input is in the arena.
// The trainer copies the input into [data_offset, +data_bytes) in order,
// after the descriptor, and counts the bytes copied so far in a
// std::atomic<uint64_t> at data_offset - kStreamedHeaderBytes (release
// stores; the slot starts there). The agent reads no byte of the input
// before that count covers it, so the copy overlaps the agents'
// negotiation and ring. Only for a client the agent told it may
// (Welcome.streamed_min_bytes > 0), for data_bytes of at least that, and
// only in a job across several agents.
//
// Streamed copy-out: when the result lands in that same slot (in place in
// the arena) and the agents' ring goes in chunks, the agent also counts
// the result's bytes that are final in the slot (scaled, nothing left to
// write) in a std::atomic<uint64_t> at data_offset - kStreamedHeaderBytes
// + kStreamedFinalOffset (release stores, in order), so the trainer copies
// each reduced chunk out while later ones still cross the agents. The
// trainer zeroes it before it publishes; an agent that never stores it
// leaves the whole copy for the completion.
constexpr uint32_t kSubmitFlagStreamed = 1u << 2;
constexpr uint64_t kStreamedHeaderBytes = 64;  // one cache line before the input
constexpr uint64_t kStreamedFinalOffset = 32;  // the final-bytes count, in that line

// kSubmitFlagSplit ("split reduction", docs/architecture.md): a host
// allreduce in a job on one agent that the ranks reduce themselves, each
// its own share, instead of the agent. Element range splitShare(i) of the
// tensor is local rank i's share. The trainer copies every share but its
// own into its slot [data_offset, +data_bytes) before it publishes (its own
// stays in its memory), and the slot is preceded by a SplitHeader of
// splitHeaderBytes(local size). Once every local rank published the name,
// the agent writes each rank's slot offset into every rank's header and
// completes the op with aux kSplitGo: each rank then reduces its share
// (its own tensor and the others' slots, read through the read-only
// mappings of the PeerArenas frame of split_epoch) into its output and its
// slot, sets `reduced`, copies the other shares out of their owners' slots
// as each owner's `reduced` appears, and sets `done`; it frees its slot
// once every other rank is done. The flags hold the op's `seq` (the agent's,
// new for every split op of the job), so a header whose `seq` changed
// (its owner freed the slot and used the place again) also means done. If the op cannot run split
// (a joined rank, a rank that did not split it, another epoch) every rank's op completes with aux
// kSplitRetry and the trainers resubmit it whole, unflagged. Only for a client the agent told it
// may (Welcome.split_min_bytes > 0).
constexpr uint32_t kSubmitFlagSplit = 1u << 3;
constexpr int64_t kSplitGo = 1;     // CompletionDesc.aux of a split op: reduce your share
constexpr int64_t kSplitRetry = 2;  // CompletionDesc.aux: resubmit it whole
struct SplitHeader {
  alignas(64) std::atomic<uint64_t> seq;      // the op's (written by the agent before kSplitGo)
  alignas(64) std::atomic<uint64_t> reduced;  // = seq: this rank's share is in its slot (release)
  alignas(64) std::atomic<uint64_t> done;     // = seq: this rank read the others' slots (release)
  alignas(64) uint64_t slot_offset[1];  // [local size]: every rank's data_offset (the agent's)
};
inline uint64_t splitHeaderBytes(int local_size) {
  uint64_t b = 192 + static_cast<uint64_t>(local_size > 0 ? local_size : 1) * sizeof(uint64_t);
  return (b + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
}
// Rank `index` of `parts`'s share of `count` elements of `elem_bytes`:
// [*begin, *begin + *n) elements; shares start on cache lines.
inline void splitShare(uint64_t count, uint64_t elem_bytes, int parts, int index, uint64_t* begin,
                       uint64_t* n) {
  const uint64_t line =
      elem_bytes > 0 && kDataAlignment % elem_bytes == 0 ? kDataAlignment / elem_bytes : 1;
  uint64_t per =
      parts > 0 ? (count + static_cast<uint64_t>(parts) - 1) / static_cast<uint64_t>(parts) : count;
  per = (per + line - 1) / line * line;
  const uint64_t b = std::min<uint64_t>(count, per * static_cast<uint64_t>(index));
  *begin = b;
  *n = std::min<uint64_t>(count - b, per);
}

// The payload bytes a descriptor puts in flight: what the agent's per-rank
// quota counts (--max-bytes-in-flight-mb, agent/ipc/limits.h) and what
// libkolo holds its own submissions under (Welcome.max_bytes_in_flight).
// An output at the input's offset (in place) is the same bytes. (The agent
// counts validated descriptors only, whose sizes are bounded: no wrap.)
inline uint64_t submitDescBytes(const SubmitDesc& d) {
  if (d.out_bytes == 0 || d.out_offset == d.data_offset) {
    return d.data_bytes > d.out_bytes ? d.data_bytes : d.out_bytes;
  }
  return d.data_bytes + d.out_bytes;
}

// Allgather (additive): the output region [out_offset, +out_bytes) starts
// with every rank's first dimension (int64_t[world size], written by the
// client), padded to kDataAlignment; the gathered tensor (ranks'
// contributions concatenated in rank order) follows.
inline uint64_t allgatherSizesBytes(int world_size) {
  uint64_t b = static_cast<uint64_t>(world_size > 0 ? world_size : 0) * sizeof(int64_t);
  return (b + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
}

// Reducescatter (additive): rank r of `size` receives rows
// [reducescatterRowOffset(r), +reducescatterRows(r)) of the reduced tensor:
// dim0 / size rows each, and the first dim0 % size ranks one more.
inline int64_t reducescatterRows(int64_t dim0, int size, int rank) {
  return dim0 / size + (rank < dim0 % size ? 1 : 0);
}
inline int64_t reducescatterRowOffset(int64_t dim0, int size, int rank) {
  int64_t extra = dim0 % size;
  return rank * (dim0 / size) + (rank < extra ? rank : extra);
}

// Alltoall (additive): the output region starts with the split matrix
// (int64_t[size][size], rows sent by rank s to rank d at [s * size + d],
// written by the client), padded to kDataAlignment; the received rows follow
// (from rank 0 first).
inline uint64_t alltoallSplitsBytes(int world_size) {
  uint64_t b = static_cast<uint64_t>(world_size > 0 ? world_size : 0) * static_cast<uint64_t>(world_size) *
               sizeof(int64_t);
  return (b + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
}

struct CompletionDesc {
  uint64_t handle;
  int32_t code;             // kolo::Code
  uint32_t msg_len;
  uint64_t out_offset;      // where the result is, for ops that return one elsewhere
  uint64_t out_bytes;
  int64_t aux;              // op-specific (e.g. last joined rank)
  char msg[kMaxErrorBytes];
};

struct alignas(64) ArenaHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t total_bytes;
  uint64_t submit_ring_offset;
  uint64_t completion_ring_offset;
  uint64_t data_offset;
  uint64_t data_bytes;
  // Wake-ups only where somebody sleeps (each side: store its flag, a
  // seq_cst fence, then look at the other side's ring once more; the other
  // side pushes, fences, then reads the flag, so one of them always sees
  // the other):
  // 1 while the agent's loop is awake and polls this submission ring
  // before it sleeps: a submission then needs no doorbell write. 0 (the
  // initial value, and always with --spin-us 0): ring the doorbell.
  alignas(64) std::atomic<uint32_t> agent_polling;
  // 1 while the client is blocked in poll() waiting for a completion: only
  // then does the agent write the completion eventfd.
  alignas(64) std::atomic<uint32_t> client_waiting;
  // Frames the agent has written to this client's socket, counted once each
  // is wholly written: the client reads its socket only when this moved or
  // poll() reported it readable (no failing recvmsg per completion).
  alignas(64) std::atomic<uint64_t> frames_sent;
};

using SubmitRing = SpscRing<SubmitDesc>;
using CompletionRing = SpscRing<CompletionDesc>;

// Computes the layout for an arena of `total_bytes`.
struct ArenaLayout {
  uint64_t submit_ring_offset;
  uint64_t completion_ring_offset;
  uint64_t data_offset;
  uint64_t data_bytes;
  static ArenaLayout compute(uint64_t total_bytes) {
    ArenaLayout l{};
    auto align = [](uint64_t v) { return (v + 4095) & ~uint64_t{4095}; };
    l.submit_ring_offset = align(sizeof(ArenaHeader));
    l.completion_ring_offset =
        align(l.submit_ring_offset + SubmitRing::bytesFor(kSubmitRingCapacity));
    l.data_offset =
        align(l.completion_ring_offset + CompletionRing::bytesFor(kCompletionRingCapacity));
    l.data_bytes = total_bytes > l.data_offset ? total_bytes - l.data_offset : 0;
    return l;
  }
};

}  // namespace kolo
