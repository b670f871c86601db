// Client: the one submit path. submit() validates the op, claims its name,
// prepares it (host memory: the slot plan of common/slot_plan.h, a slot of
// the arena, the copy in; device memory: client_device.cc) and publishes
// the descriptor. Every public collective (client_collectives.cc) ends here.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <new>

#include "client.h"
#include "client_text.h"
#include "common/half.h"
#include "common/stream_copy.h"

namespace kolo {

namespace {

using client_text::fmtSeconds;
using client_text::quoteName;
using std::chrono::milliseconds;

constexpr milliseconds kDrainerBlockMax{1000};

// The KOLO_ARENA_MB whose data region holds a tensor of `bytes`: the rings
// and the header come first.
uint64_t arenaMbFor(uint64_t bytes) {
  uint64_t overhead = ArenaLayout::compute(0).data_offset;
  return (bytes + overhead + (1u << 20) - 1) >> 20;
}

}  // namespace

StatusOr<uint64_t> Client::submit(const OpArgs& args) {
  OpArgs a = args;
  const bool device = wantsDevice(a);
  if (device) a.device = 1;
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  const std::string name(a.name);
  const auto collective = static_cast<CollectiveType>(a.collective);
  const std::string what =
      device ? std::string(collectiveName(collective)) + " of device tensor " + quoteName(name)
             : describeTensor(collective, name);
  if (device) RETURN_IF_ERROR(deviceAdmits(a, what));
  RETURN_IF_ERROR(reserveName(collective, name));
  const auto deadline = Clock::now() + opts_.op_timeout;
  SubmitDesc d{};
  Op op;
  op.name = name;
  op.collective = collective;
  op.output = a.output;
  StreamedCopy streamed;
  Status st = device ? prepareDevice(a, bytes, what, deadline, &d, &op)
                     : prepareHost(a, bytes, what, deadline, &d, &op, &streamed);
  d.handle = freshHandle();
  if (st.isOk()) st = publish(d, op, deadline, what);
  if (!st.isOk()) {
    abandon(op);
    releaseName(name);
    return st;
  }
  if (streamed.bytes > 0) copyStreamed(d.handle, streamed);
  return d.handle;
}

Status Client::validate(const OpArgs& a, uint64_t* bytes) const {
  if (a.name == nullptr || a.name[0] == '\0') {
    return invalidArgument(std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
                           ": the tensor name is empty; every collective needs a name "
                           "that is the same on all ranks");
  }
  size_t name_len = std::strlen(a.name);
  std::string_view name(a.name, name_len);
  if (name_len > kMaxNameBytes) {
    return invalidArgument(std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
                           ": tensor name " + quoteName(name) + " is " + std::to_string(name_len) +
                           " bytes; the limit is " + std::to_string(kMaxNameBytes));
  }
  const std::string tensor = describeTensor(static_cast<CollectiveType>(a.collective), name) + ": ";
  if (a.collective != static_cast<int>(CollectiveType::kAllreduce) &&
      a.collective != static_cast<int>(CollectiveType::kBroadcast) &&
      a.collective != static_cast<int>(CollectiveType::kAllgather) &&
      a.collective != static_cast<int>(CollectiveType::kReducescatter) &&
      a.collective != static_cast<int>(CollectiveType::kAlltoall) &&
      a.collective != static_cast<int>(CollectiveType::kJoin)) {
    return invalidArgument(tensor + "this collective cannot be submitted this way");
  }
  if ((a.collective == static_cast<int>(CollectiveType::kAllgather) ||
       a.collective == static_cast<int>(CollectiveType::kAlltoall) ||
       a.collective == static_cast<int>(CollectiveType::kReducescatter)) &&
      a.ndim < 1) {
    return invalidArgument(tensor + "ndim is " + std::to_string(a.ndim) +
                           "; it works along the first dimension, so it needs at least one");
  }
  if (a.collective == static_cast<int>(CollectiveType::kBroadcast)) {
    int size = world().size;
    if (a.root < 0 || a.root >= size) {
      return invalidArgument(tensor + "root rank " + std::to_string(a.root) +
                             " is not a rank of this job (size " + std::to_string(size) + ")");
    }
  }
  if (a.ndim < 0 || a.ndim > kMaxDims) {
    return invalidArgument(tensor + "ndim is " + std::to_string(a.ndim) +
                           "; it must be 0 (scalar) to " + std::to_string(kMaxDims));
  }
  if (a.ndim > 0 && a.shape == nullptr) return invalidArgument(tensor + "shape is NULL");
  if (!isValidDataType(a.dtype)) {
    return invalidArgument(tensor + "unknown dtype " + std::to_string(a.dtype));
  }
  if (!isValidReduceOp(a.op)) {
    return invalidArgument(tensor + "unknown reduce op " + std::to_string(a.op) +
                           (a.op == 2 ? " (Adasum is not supported)" : ""));
  }
  if (!std::isfinite(a.prescale) || !std::isfinite(a.postscale)) {
    return invalidArgument(tensor + "prescale and postscale must be finite");
  }
  uint64_t elems = 1;
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] < 0) {
      return invalidArgument(tensor + "dimension " + std::to_string(i) + " is " +
                             std::to_string(a.shape[i]));
    }
    if (__builtin_mul_overflow(elems, static_cast<uint64_t>(a.shape[i]), &elems)) {
      return invalidArgument(tensor + "the shape's element count overflows");
    }
  }
  uint64_t n = 0;
  if (__builtin_mul_overflow(elems, dataTypeSize(static_cast<DataType>(a.dtype)), &n)) {
    return invalidArgument(tensor + "the tensor's byte size overflows");
  }
  const bool needs_output =
      a.collective != static_cast<int>(CollectiveType::kReducescatter);  // checked later
  if (n > 0 && (a.input == nullptr || (needs_output && a.output == nullptr))) {
    return invalidArgument(tensor + (a.input == nullptr ? "input" : "output") + " is NULL");
  }
  const char* in = static_cast<const char*>(a.input);
  bool in_arena = in >= data_begin_ && in < data_end_;
  if (!in_arena && n > alloc_->capacity() && a.device != 1 &&
      !wantsDevice(a)) {  // (device: its own arena)
    return invalidArgument(tensor + "it is " + std::to_string(n) +
                           " bytes, larger than this process's whole shared arena (" +
                           std::to_string(alloc_->capacity()) +
                           " bytes of data). Raise KOLO_ARENA_MB (now " +
                           (opts_.arena_bytes == 0 ? std::string("unset: the agent's default")
                                                   : std::to_string(opts_.arena_bytes >> 20)) +
                           ") to at least " + std::to_string(arenaMbFor(n)) + ".");
  }
  *bytes = n;
  return okStatus();
}

StatusOr<uint64_t> Client::allocateSlot(uint64_t bytes, const std::string& what,
                                        Clock::time_point deadline) {
  auto start = Clock::now();
  for (;;) {
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
      // Split ops' slots the other ranks are done with first: a slot that
      // comes back to the same place finds its pages mapped in every rank.
      if (!split_holds_.empty()) reapSplitHoldsLocked(false);
      if (auto off = alloc_->allocate(bytes)) {
        ++unpublished_slots_;
        return *off;
      }
      // Space comes back when an op in flight completes; a slot another
      // thread has taken but not yet published becomes such an op.
      bool in_flight = unpublished_slots_ > 0 || !split_holds_.empty() ||
                       std::any_of(ops_.begin(), ops_.end(), [](const auto& kv) {
                         return kv.second.state != OpState::kDone && kv.second.slot.has_value();
                       });
      if (!in_flight) {
        uint64_t shared = 0;
        for (const auto& [off, n] : shared_) shared += ArenaAllocator::roundUp(n);
        return invalidArgument(
            what + ": its " + std::to_string(bytes) + " bytes do not fit in the shared arena (" +
            std::to_string(alloc_->capacity()) + " bytes of data, " + std::to_string(shared) +
            " held by kolo_alloc_shared buffers) and nothing is in flight to free space. "
            "Free some shared buffers or raise KOLO_ARENA_MB.");
      }
      epoch = space_epoch_;
    }
    // The arena is temporarily full: let completions free slots.
    bool more = progressUntil([&] { return space_epoch_ != epoch || !failed_.isOk(); }, deadline,
                              kDrainerBlockMax);
    if (!more) {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
      if (Clock::now() >= deadline) {
        return timedOut(what + ": waited " + fmtSeconds(Clock::now() - start) + " s for " +
                        std::to_string(bytes) + " bytes of the shared arena (" +
                        std::to_string(alloc_->usedBytes()) + " of " +
                        std::to_string(alloc_->capacity()) +
                        " in use) but the collectives in flight did not complete "
                        "(KOLO_OP_TIMEOUT). Raise KOLO_ARENA_MB or wait on handles sooner.");
      }
    }
  }
}

Status Client::reserveName(CollectiveType collective, const std::string& name) {
  std::unique_lock<std::mutex> lock(mu_);
  RETURN_IF_ERROR(usableLocked());
  if (names_in_flight_.count(name) != 0) {
    // Its completion may be waiting in the ring: one non-blocking pass.
    lock.unlock();
    progressUntil([&] { return names_in_flight_.count(name) == 0; }, Clock::now(), milliseconds(0));
    lock.lock();
    RETURN_IF_ERROR(usableLocked());
  }
  if (names_in_flight_.count(name) != 0) {
    return invalidArgument("Requested to " + std::string(collectiveName(collective)) +
                           " a tensor with the same name as another tensor that is "
                           "currently being processed: " +
                           quoteName(name) +
                           ". If you want to request another tensor, use a different tensor "
                           "name.");
  }
  names_in_flight_.insert(name);
  return okStatus();
}

void Client::releaseName(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  names_in_flight_.erase(name);
  cv_.notify_all();
}

SlotRequest slotRequest(const OpArgs& a, uint64_t bytes) {
  SlotRequest r;
  r.collective = static_cast<CollectiveType>(a.collective);
  r.name = a.name;
  r.dtype = static_cast<DataType>(a.dtype);
  r.op = static_cast<ReduceOp>(a.op);
  r.ndim = a.ndim;
  r.shape = a.shape;
  r.root = a.root;
  r.prescale = a.prescale;
  r.postscale = a.postscale;
  r.bytes = bytes;
  r.gather_dims = a.gather_dims;
  r.splits_matrix = a.splits_matrix;
  r.group_id = a.group_id;
  r.group_hash = a.group_hash;
  r.group_size = a.group_size;
  return r;
}

Client::HostPlacement Client::placeHostLocked(const OpArgs& a, const SlotRequest& r,
                                              uint64_t bytes) {
  HostPlacement h;
  h.node_bytes = nodeBytesInFlightLocked(bytes);
  h.cross_size = world_.cross_size;
  // Across agents with this rank alone on its agent, the arena path runs
  // the agents' ring in place on this rank's slot: as few copies as the
  // direct path, though here at submission, before the ring. From the
  // agents' pipeline size up the direct path wins even so: the agent reads
  // and writes the tensor chunk by chunk while the ring runs.
  const bool alone = world_.cross_size > 1 && world_.local_size < 2;
  h.planned = planSlots(r, SlotGeometry{&shared_, world_.rank, world_.size,
                                        alone ? direct_alone_min_bytes_ : direct_min_bytes_});
  if (!h.planned.isOk() || !h.planned->direct || alone ||
      opts_.direct != ClientOptions::Direct::kAuto)
    return h;
  // KOLO_DIRECT=auto: the arena while it has room (over a step's
  // tensors the trainers' copies overlap the agent's reductions, and
  // the agent pins no trainer pages); direct only for a tensor that
  // would have to wait for arena space (docs/architecture.md).
  StatusOr<SlotPlan> in_arena = planSlots(r, SlotGeometry{&shared_, world_.rank, world_.size, 0});
  if (in_arena.isOk() && splittable(a, *in_arena, false) && usableLocked().isOk()) {
    // Split reduction beats both, with its header before the slot.
    if (auto off = alloc_->allocate(in_arena->slot_bytes + splitHeaderBytes(world_.local_size))) {
      ++unpublished_slots_;
      h.slot_taken = *off;
      h.split = true;
      h.peers = peers_;
      h.world = world_;
      h.planned = std::move(in_arena);
    }
  } else if (in_arena.isOk() && usableLocked().isOk()) {
    if (auto off = alloc_->allocate(in_arena->slot_bytes)) {
      ++unpublished_slots_;
      h.slot_taken = *off;
      h.planned = std::move(in_arena);
    }
  }
  return h;
}

Client::SplitOp Client::startSplit(const OpArgs& a, const SlotPlan& plan, const HostPlacement& h,
                                   uint64_t slot, uint64_t header) {
  // Every share but this rank's own (read from the caller's tensor at
  // kSplitGo), behind a cleared SplitHeader.
  const uint64_t base = slot + header;
  SplitOp s;
  s.peers = h.peers;
  s.input = static_cast<const char*>(a.input);
  s.header = new (arena_.data() + slot) SplitHeader();
  s.slot_data = arena_.data() + plan.input.offset(base);
  s.header_bytes = header;
  s.dtype = static_cast<DataType>(a.dtype);
  const uint64_t es = dataTypeSize(s.dtype);
  s.count = plan.input.bytes / es;
  const auto rop = static_cast<ReduceOp>(a.op);
  s.op = rop == ReduceOp::kAverage ? ReduceOp::kSum : rop;
  s.prescale = a.prescale;
  s.postscale = rop == ReduceOp::kAverage ? a.postscale / h.world.size : a.postscale;
  s.index = h.world.local_rank;
  s.parts = h.world.local_size;
  for (int j = 0; j < s.parts; ++j) {
    if (j == s.index) continue;
    uint64_t b = 0, m = 0;
    splitShare(s.count, es, s.parts, j, &b, &m);
    arenaCopy(s.slot_data + b * es, s.input + b * es, m * es, splitCopyNodeBytes(h.node_bytes));
  }
  return s;
}

Status Client::prepareHost(const OpArgs& a, uint64_t bytes, const std::string& what,
                           Clock::time_point deadline, SubmitDesc* d, Op* op,
                           StreamedCopy* streamed) {
  SlotRequest r = slotRequest(a, bytes);
  auto arenaOffset = [&](const void* p) -> std::optional<uint64_t> {
    const char* c = static_cast<const char*>(p);
    if (c == nullptr || c < data_begin_ || c >= data_end_) return std::nullopt;
    return static_cast<uint64_t>(c - arena_.data());
  };
  r.input_offset = arenaOffset(a.input);
  r.output_offset = arenaOffset(a.output);
  r.has_output = a.output != nullptr;
  r.input_addr = reinterpret_cast<uint64_t>(a.input);
  r.output_addr = reinterpret_cast<uint64_t>(a.output);
  r.out_of_place = a.out_of_place;
  r.compressed = a.compressed;
  HostPlacement h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    h = placeHostLocked(a, r, bytes);
  }
  RETURN_IF_ERROR(h.planned.status());
  const SlotPlan& plan = *h.planned;
  if (!h.split) {
    std::lock_guard<std::mutex> lock(mu_);
    h.split = splittable(a, plan, h.slot_taken.has_value()) &&
              plan.slot_bytes + splitHeaderBytes(world_.local_size) <= alloc_->capacity();
    if (h.split) {
      h.peers = peers_;
      h.world = world_;
    }
  }
  const bool split = h.split;  // split reduction (client_split.cc)
  // Streamed copy-in (docs/architecture.md): across agents, a large
  // allreduce is published first and copied after, in order, with the
  // count of bytes copied in the cache line before the input, so that the
  // copy overlaps the agents' negotiation and ring (the agent reads each
  // chunk once the count covers it).
  const bool stream = streamed_min_bytes_ > 0 && h.cross_size > 1 && !h.slot_taken &&
                      a.collective == static_cast<int>(CollectiveType::kAllreduce) &&
                      plan.copy == CopyIn::kPlain && !plan.direct && plan.header.bytes == 0 &&
                      plan.input.in_slot && plan.input.at == 0 &&
                      plan.input.bytes >= streamed_min_bytes_ &&
                      plan.slot_bytes + kStreamedHeaderBytes <= alloc_->capacity();
  const uint64_t header = stream  ? kStreamedHeaderBytes
                          : split ? splitHeaderBytes(h.world.local_size)
                                  : 0;
  uint64_t slot = 0;
  if (h.slot_taken) {
    slot = *h.slot_taken;
    op->slot = slot;
  } else if (plan.slot_bytes > 0) {
    ASSIGN_OR_RETURN(slot, allocateSlot(plan.slot_bytes + header, what, deadline));
    op->slot = slot;
  }
  const uint64_t base = slot + header;  // where the plan's pieces start
  if (stream) {
    auto* copied = new (arena_.data() + slot) std::atomic<uint64_t>(0);
    auto* final_bytes = new (arena_.data() + slot + kStreamedFinalOffset) std::atomic<uint64_t>(0);
    // Streamed copy-out: the result lands where the input was (the slot
    // plan is in place) and goes to the caller's buffer as the agent
    // publishes it.
    if (plan.result && plan.result->offset(base) == plan.input.offset(base) && !a.compressed &&
        !plan.gather && a.output != nullptr) {
      op->final_bytes = final_bytes;
    }
    op->copying = true;
    *streamed = {arena_.data() + plan.input.offset(base), static_cast<const char*>(a.input),
                 plan.input.bytes, copied, h.node_bytes};
  } else if (split) {
    op->split = startSplit(a, plan, h, slot, header);
  } else {
    copyIn(a, plan, slot, h.node_bytes);
  }
  *d = describeSubmit(r, plan, base);
  if (stream) d->flags |= kSubmitFlagStreamed;
  if (split) {
    d->flags |= kSubmitFlagSplit;
    d->split_epoch = op->split->peers->epoch;
  }
  if (a.collective == static_cast<int>(CollectiveType::kAllreduce)) op->desc = *d;
  // Direct: the agent writes the result into the output itself.
  op->result = plan.direct   ? static_cast<const char*>(a.output)
               : plan.result ? arena_.data() + plan.result->offset(base)
                             : nullptr;
  op->shared_input = plan.shared_input ? arena_.data() + plan.input.offset(base) : nullptr;
  op->bytes = plan.result_bytes;
  op->gather = plan.gather;
  op->gather_dim0 = plan.gather_dim0;
  if (a.compressed) op->decompress = a.dtype;
  return okStatus();
}

void Client::copyStreamed(uint64_t handle, const StreamedCopy& s) {
  constexpr uint64_t kStep = uint64_t{1} << 20;  // the agent's chunks are 1 MiB or more
  for (uint64_t done = 0; done < s.bytes;) {
    const uint64_t n = std::min(kStep, s.bytes - done);
    arenaCopy(s.dst + done, s.src + done, n, s.node_bytes);  // (non-temporal: fenced)
    done += n;
    s.copied->store(done, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(handle);
  if (it == ops_.end()) return;  // (a copying op is never erased)
  Op& op = it->second;
  op.copying = false;
  if (op.state == OpState::kDone) {  // it failed while we copied: the slot is ours to free
    if (op.slot && alloc_->free(*op.slot)) ++space_epoch_;
    op.slot.reset();
    if (op.released) ops_.erase(it);
    cv_.notify_all();
  }
}

bool Client::advanceStreamOuts() {
  std::unique_lock<std::mutex> lk(mu_);
  bool any = false;
  for (size_t i = 0; i < stream_out_ops_.size();) {
    const uint64_t handle = stream_out_ops_[i];
    auto it = ops_.find(handle);
    if (it == ops_.end() || it->second.state != OpState::kSubmitted || it->second.released) {
      // Ended (its completion copied the rest) or no longer the caller's.
      stream_out_ops_[i] = stream_out_ops_.back();
      stream_out_ops_.pop_back();
      continue;
    }
    Op& op = it->second;
    const uint64_t final_bytes =
        std::min(op.bytes, op.final_bytes->load(std::memory_order_acquire));
    if (final_bytes <= op.copied_out) {
      ++i;
      continue;
    }
    op.out_copying = true;
    char* out = static_cast<char*>(op.output);
    const char* src = op.result;
    const uint64_t from = op.copied_out;
    const uint64_t node_bytes = nodeBytesInFlightLocked(0);
    lk.unlock();
    arenaCopy(out + from, src + from, final_bytes - from, node_bytes);
    lk.lock();
    it = ops_.find(handle);  // (an out_copying op stays in the table)
    if (it != ops_.end()) {
      it->second.copied_out = final_bytes;
      it->second.out_copying = false;
    }
    cv_.notify_all();
    any = true;
    ++i;
  }
  streaming_out_.store(stream_out_ops_.size(), std::memory_order_relaxed);
  return any;
}

void Client::copyIn(const OpArgs& a, const SlotPlan& plan, uint64_t slot, uint64_t node_bytes) {
  if (plan.header.bytes > 0) {
    std::memcpy(arena_.data() + plan.header.offset(slot), plan.header_src, plan.header.bytes);
  }
  char* dst = arena_.data() + plan.input.offset(slot);
  const uint64_t bytes = plan.input.bytes;
  switch (plan.copy) {
    case CopyIn::kNone:
      break;
    case CopyIn::kPlain:
      arenaCopy(dst, a.input, bytes, node_bytes);
      break;
    case CopyIn::kToFloat16:
    case CopyIn::kToBFloat16: {
      const auto* src = static_cast<const float*>(a.input);
      auto* out = reinterpret_cast<uint16_t*>(dst);
      const size_t count = bytes / sizeof(uint16_t);
      if (plan.copy == CopyIn::kToFloat16) {
        for (size_t i = 0; i < count; ++i) out[i] = floatToHalf(src[i]);
      } else {
        for (size_t i = 0; i < count; ++i) out[i] = floatToBf16(src[i]);
      }
      break;
    }
  }
}

// The op enters the table and the ring in one critical section, so its
// completion always finds it. At most maxInFlight() ops are in flight, so
// neither ring can ever be full: the agent never has to wait for this
// client to make room for a completion.
Status Client::publish(SubmitDesc d, Op& op, Clock::time_point deadline, const std::string& what) {
  // Device descriptors carry the generation and take the membership notice
  // too: across agents an elastic job's device op of an ended generation
  // must be refused, not run in the next one (docs/gpu.md).
  const uint64_t desc_bytes = submitDescBytes(d);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
      if (generation_notice_ != 0) {
        Status changed(Code::kMembershipChanged,
                       "the job's membership changed: generation " +
                           std::to_string(generation_notice_) + " (" + std::to_string(world_.size) +
                           " ranks, this one rank " + std::to_string(world_.rank) +
                           ") replaced the one this process used; reset and sync the training "
                           "state before the next collective (kolo.torch.elastic does it)");
        generation_notice_ = 0;
        return changed;
      }
      if (roomToPublishLocked(desc_bytes)) {
        d.generation = world_.generation;
        if (op.desc) {  // (a kSplitRetry resubmits it with this handle)
          op.desc->handle = d.handle;
          op.desc->generation = d.generation;
        }
        if (op.slot) --unpublished_slots_;
        op.desc_bytes = desc_bytes;
        if (op.final_bytes != nullptr) {
          stream_out_ops_.push_back(d.handle);
          streaming_out_.store(stream_out_ops_.size(), std::memory_order_relaxed);
        }
        ops_.emplace(d.handle, std::move(op));
        ++in_flight_;
        bytes_in_flight_ += desc_bytes;
        bool pushed = submit_ring_.tryPush(d);  // we are the only producer
        assert(pushed);
        (void)pushed;
        break;
      }
    }
    bool room = progressUntil([&] { return roomToPublishLocked(desc_bytes) || !failed_.isOk(); },
                              deadline, kDrainerBlockMax);
    if (!room && Clock::now() >= deadline) {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_ >= maxInFlight()) {
        return timedOut(what + ": none of the " + std::to_string(maxInFlight()) +
                        " collectives this process has in flight completed within " +
                        fmtSeconds(opts_.op_timeout) + " s (KOLO_OP_TIMEOUT)");
      }
      return timedOut(
          what + ": " + std::to_string(desc_bytes) + " more bytes would pass the " +
          std::to_string(max_bytes_in_flight_) +
          " this process may have in flight on the agent (its --max-bytes-in-flight-mb, "
          "or the arena's size), and none of the " +
          std::to_string(in_flight_) + " collectives holding " + std::to_string(bytes_in_flight_) +
          " bytes completed within " + fmtSeconds(opts_.op_timeout) + " s (KOLO_OP_TIMEOUT)");
    }
  }
  ringDoorbell();
  return okStatus();
}

void Client::abandon(Op& op) {
  if (op.device) (void)device_->finish(op.staged, nullptr, 0, 0, op.stream, false, false);
  if (!op.slot) return;
  std::lock_guard<std::mutex> lock(mu_);
  --unpublished_slots_;
  if (alloc_->free(*op.slot)) ++space_epoch_;
  op.slot.reset();
  cv_.notify_all();
}

}  // namespace kolo
