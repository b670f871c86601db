// Client: split reduction (ipc_layout.h kSubmitFlagSplit; docs/architecture.md,
// "Split reduction"). In a job on one agent, the ranks reduce a large host
// allreduce themselves, each its share, instead of copying the whole tensor
// into the arena for the agent's one thread and the whole result back out:
//
//   submit    every share but this rank's own into its slot (prepareHost)
//   kSplitGo  this rank's share: its own tensor and the others' slots, read
//             through the read-only PeerArenas mappings, reduced into its
//             output and its slot; then `reduced` (reduceShare)
//   then      each other share copied from its owner's slot into the output
//             as the owner's `reduced` appears; then `done`
//             (advanceSplitLocked, on every drain pass: nothing blocks)
//   later     the slot is freed once every other rank is `done`
//             (reapSplitHoldsLocked)
#include <algorithm>
#include <cstring>

#include "client.h"
#include "client_text.h"
#include "common/log.h"
#include "common/reduce.h"
#include "common/stream_copy.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {

std::shared_ptr<spdlog::logger> logger() {
  static auto l = log::get("client");
  return l;
}

}  // namespace

void Client::attachPeers(const ipc::AgentFrame& f) {
  const ipc::PeerArenas& p = f.peers();
  const size_t n = static_cast<size_t>(p.arena_bytes_size());
  if (stray_fds_.size() < n) {
    logger()->warn(
        "split reduction off: the agent's PeerArenas frame came with {} descriptors for {} arenas",
        stray_fds_.size(), n);
    peers_.reset();
    return;
  }
  auto peers = std::make_shared<PeerArenas>();
  peers->epoch = p.epoch();
  Status bad;
  for (size_t i = 0; i < n; ++i) {
    UniqueFd fd = std::move(stray_fds_.front());
    stray_fds_.pop_front();
    if (!bad.isOk()) continue;
    StatusOr<SharedRegion> r = SharedRegion::attachReadOnly(std::move(fd));
    if (!r.isOk()) {
      bad = r.status();
    } else if (r->size() < p.arena_bytes(static_cast<int>(i))) {
      bad = internalError("local rank " + std::to_string(i) + "'s arena is smaller than announced");
    } else {
      peers->arenas.push_back(std::move(*r));
    }
  }
  if (!bad.isOk()) {
    logger()->warn("split reduction off: {}", bad.toString());
    peers_.reset();
    return;
  }
  peers_ = std::move(peers);
  unsplit_names_.clear();
  logger()->debug("split reduction: the arenas of {} local ranks (epoch {})", n, p.epoch());
}

bool Client::splittable(const OpArgs& a, const SlotPlan& plan, bool slot_taken) const {
  const char* out = static_cast<const char*>(a.output);
  // Its own share is reduced where it lies, element by element: the
  // caller's tensors must be aligned to their element (else the arena path).
  const uint64_t es = isValidDataType(a.dtype) ? dataTypeSize(static_cast<DataType>(a.dtype)) : 1;
  if (reinterpret_cast<uintptr_t>(a.input) % es != 0 || reinterpret_cast<uintptr_t>(out) % es != 0)
    return false;
  return split_min_bytes_ > 0 && peers_ != nullptr && world_.cross_size == 1 &&
         world_.local_size >= 2 && static_cast<int>(peers_->arenas.size()) == world_.local_size &&
         world_.local_rank >= 0 && world_.local_rank < world_.local_size && !slot_taken &&
         a.collective == static_cast<int>(CollectiveType::kAllreduce) && a.group_id == 0 &&
         !a.compressed && plan.copy == CopyIn::kPlain && !plan.direct && !plan.shared_input &&
         plan.header.bytes == 0 && plan.out.bytes == 0 && plan.input.in_slot &&
         plan.input.at == 0 && plan.result && plan.result->in_slot && plan.result->at == 0 &&
         plan.input.bytes >= split_min_bytes_ && out != nullptr &&
         !(out >= data_begin_ && out < data_end_) &&
         unsplit_names_.count(std::string_view(a.name)) == 0;
}

Status Client::reduceShare(Op& op) {
  SplitOp& s = *op.split;
  const uint64_t es = dataTypeSize(s.dtype);
  const uint64_t bytes = s.count * es;
  const int n = s.parts;
  s.slots.assign(static_cast<size_t>(n), nullptr);
  s.headers.assign(static_cast<size_t>(n), nullptr);
  for (int j = 0; j < n; ++j) {
    const uint64_t off = s.header->slot_offset[j];  // (the completion's acquire)
    if (j == s.index) {
      if (arena_.data() + off != s.slot_data) {
        return internalError("the kolo agent named slot " + std::to_string(off) +
                             " as this rank's for split " + describeTensor(op.collective, op.name));
      }
      s.slots[static_cast<size_t>(j)] = s.slot_data;
      continue;
    }
    const SharedRegion& arena = s.peers->arenas[static_cast<size_t>(j)];
    if (off < s.header_bytes || off > arena.size() || bytes > arena.size() - off) {
      return internalError("the kolo agent named slot " + std::to_string(off) + " of local rank " +
                           std::to_string(j) + ", outside its arena, for split " +
                           describeTensor(op.collective, op.name));
    }
    s.slots[static_cast<size_t>(j)] = arena.data() + off;
    s.headers[static_cast<size_t>(j)] =
        reinterpret_cast<const SplitHeader*>(arena.data() + off - s.header_bytes);
  }
  uint64_t b = 0, m = 0;
  splitShare(s.count, es, n, s.index, &b, &m);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    const char* base = j != s.index ? s.slots[static_cast<size_t>(j)]
                       : s.filled   ? s.slot_data
                                    : s.input;
    srcs[static_cast<size_t>(j)] = base + b * es;
  }
  void* dsts[2] = {s.slot_data + b * es, static_cast<char*>(op.output) + b * es};
  if (m > 0) {
    reduceBlocks(s.dtype, s.op, srcs.data(), n, dsts, op.released ? 1 : 2, m, s.prescale,
                 s.postscale);
  }
  s.seq = s.header->seq.load(std::memory_order_relaxed);
  s.header->reduced.store(s.seq, std::memory_order_release);
  s.pending.clear();
  // The next shares first: rank i+1's owner finished its share about when this one did.
  for (int k = 1; k < n; ++k) s.pending.push_back((s.index + k) % n);
  s.deadline = Clock::now() + opts_.op_timeout;
  return okStatus();
}

bool Client::advanceSplitLocked(std::unique_lock<std::mutex>& lk, uint64_t handle) {
  auto it = ops_.find(handle);
  if (it == ops_.end() || it->second.state != OpState::kSplitting) return false;
  Status st;
  for (;;) {
    Op& op = it->second;
    SplitOp& s = *op.split;
    if (op.released) s.pending.clear();  // nobody reads the output any more
    auto ready = std::find_if(s.pending.begin(), s.pending.end(), [&](int j) {
      return s.headers[static_cast<size_t>(j)]->reduced.load(std::memory_order_acquire) == s.seq;
    });
    if (ready == s.pending.end()) {
      if (s.pending.empty()) break;
      if (Clock::now() < s.deadline) return false;  // the next drain pass looks again
      std::string missing;
      for (int j : s.pending) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      st = timedOut(describeTensor(op.collective, op.name) + ": local rank(s) " + missing +
                    " did not reduce their share of it within " +
                    client_text::fmtSeconds(opts_.op_timeout) +
                    " s (KOLO_OP_TIMEOUT) after every rank submitted it (split reduction)");
      break;
    }
    const int j = *ready;
    s.pending.erase(ready);
    split_sleep_us_ = 0;  // (drainer) shares come: spin again next time
    uint64_t b = 0, m = 0;
    const uint64_t es = dataTypeSize(s.dtype);
    splitShare(s.count, es, s.parts, j, &b, &m);
    char* dst = static_cast<char*>(op.output) + b * es;
    const char* src = s.slots[static_cast<size_t>(j)] + b * es;
    const uint64_t node_bytes = splitCopyNodeBytes(s.count * es * static_cast<uint64_t>(s.parts));
    op.state = OpState::kCompleting;  // release() waits; the table may change meanwhile
    lk.unlock();
    arenaCopy(dst, src, m * es, node_bytes);
    lk.lock();
    it = ops_.find(handle);
    it->second.state = OpState::kSplitting;
  }
  Op& op = it->second;
  SplitOp& s = *op.split;
  s.header->done.store(s.seq, std::memory_order_release);
  // The other ranks may still read this slot: it is freed once they are done.
  SplitHold hold;
  hold.slot = *op.slot;
  hold.seq = s.seq;
  hold.peers = s.peers;
  for (int j = 0; j < s.parts; ++j) {
    if (j != s.index) hold.others.push_back(s.headers[static_cast<size_t>(j)]);
  }
  split_holds_.push_back(std::move(hold));
  op.slot.reset();
  split_ops_.erase(std::find(split_ops_.begin(), split_ops_.end(), handle));
  splitting_.store(split_ops_.size(), std::memory_order_relaxed);
  finishOpLocked(it, std::move(st));
  reapSplitHoldsLocked(false);
  return true;
}

bool Client::advanceSplits() {
  std::unique_lock<std::mutex> lk(mu_);
  const std::vector<uint64_t> handles = split_ops_;  // (advancing one may finish it)
  bool any = false;
  for (uint64_t h : handles) any |= advanceSplitLocked(lk, h);
  if (!split_holds_.empty()) reapSplitHoldsLocked(false);
  return any;
}

bool Client::splitShareReady() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t h : split_ops_) {
    const Op& op = ops_.find(h)->second;
    if (op.state != OpState::kSplitting) continue;  // (one of its copies runs)
    const SplitOp& s = *op.split;
    if (s.pending.empty() || op.released || Clock::now() >= s.deadline) return true;
    for (int j : s.pending) {
      if (s.headers[static_cast<size_t>(j)]->reduced.load(std::memory_order_acquire) == s.seq)
        return true;
    }
  }
  return false;
}

void Client::reapSplitHoldsLocked(bool all) {
  auto freed = std::remove_if(split_holds_.begin(), split_holds_.end(), [&](const SplitHold& h) {
    // Done with ours: its `done` says so, or its owner used the place again
    // (which it does only after it was done).
    const bool free_it =
        all || std::all_of(h.others.begin(), h.others.end(), [&](const SplitHeader* o) {
          return o->done.load(std::memory_order_acquire) == h.seq ||
                 o->seq.load(std::memory_order_relaxed) != h.seq;
        });
    if (free_it && alloc_->free(h.slot)) ++space_epoch_;
    return free_it;
  });
  if (freed != split_holds_.end()) {
    split_holds_.erase(freed, split_holds_.end());
    cv_.notify_all();
  }
}

void Client::fillOwnShare(SplitOp& s) {
  if (s.filled) return;
  uint64_t b = 0, m = 0;
  const uint64_t es = dataTypeSize(s.dtype);
  splitShare(s.count, es, s.parts, s.index, &b, &m);
  std::memcpy(s.slot_data + b * es, s.input + b * es, m * es);
  s.filled = true;
}

void Client::retrySplitLocked(uint64_t handle, Op& op) {
  SubmitDesc d = *op.desc;
  if (op.split) {
    fillOwnShare(*op.split);  // (its own share was only in the caller's tensor)
    op.split.reset();         // completes as an ordinary op now
    d.flags &= ~kSubmitFlagSplit;
    d.split_epoch = 0;
  }
  if (unsplit_names_.size() < 65536) unsplit_names_.insert(op.name);
  d.handle = handle;
  d.generation = world_.generation;
  op.desc.reset();                        // once: a second retry would be the agent's bug
  bool pushed = submit_ring_.tryPush(d);  // (its first push left the ring: there is room)
  if (!pushed) {
    finishOpLocked(ops_.find(handle), internalError("the submission ring is full resubmitting " +
                                                    describeTensor(op.collective, op.name)));
    return;
  }
  ringDoorbell();
}

}  // namespace kolo
