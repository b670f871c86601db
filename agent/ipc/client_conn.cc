#include "agent/ipc/client_conn.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "agent/gpu/device_ipc.h"
#include "common/dtype.h"

namespace kolo {

Status ClientConn::createArena(uint64_t bytes, const std::string& label) {
  ArenaLayout layout = ArenaLayout::compute(bytes);
  if (layout.data_bytes < 4096) return invalidArgument("arena of " + std::to_string(bytes) + " bytes is too small");
  ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::create(label, bytes));
  auto* hdr = new (region.data()) ArenaHeader();
  hdr->magic = kArenaMagic;
  hdr->version = kIpcProtocolVersion;
  hdr->total_bytes = bytes;
  hdr->submit_ring_offset = layout.submit_ring_offset;
  hdr->completion_ring_offset = layout.completion_ring_offset;
  hdr->data_offset = layout.data_offset;
  hdr->data_bytes = layout.data_bytes;
  SubmitRing::format(region.data() + layout.submit_ring_offset, kSubmitRingCapacity);
  CompletionRing::format(region.data() + layout.completion_ring_offset, kCompletionRingCapacity);
  // The capacities are ours, never read back from the header the trainer can write.
  submit_ = SubmitRing(region.data() + layout.submit_ring_offset, kSubmitRingCapacity);
  completions_ =
      CompletionRing(region.data() + layout.completion_ring_offset, kCompletionRingCapacity);
  arena_ = std::make_shared<SharedRegion>(std::move(region));
  doorbell_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  completion_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!doorbell_.valid() || !completion_.valid()) return errnoStatus("eventfd", errno);
  return okStatus();
}

uint64_t ClientConn::allArenasBytes() const {
  return arenaBytes() + (device ? device->bytes() : 0);
}

bool ClientConn::inData(uint64_t off, uint64_t len) const {
  if (!arena_) return false;
  const ArenaLayout layout = ArenaLayout::compute(arena_->size());
  return len == 0 || (off >= layout.data_offset && len <= layout.data_bytes &&
                      off - layout.data_offset <= layout.data_bytes - len);
}

const char* ClientConn::metaOf(const SubmitDesc& d, uint64_t bytes) const {
  if (!gpu::isDevice(d)) return slot(d.out_offset);  // (validate() checked the output region)
  return inData(d.meta_offset, bytes) ? slot(d.meta_offset) : nullptr;
}

Status ClientConn::validate(const SubmitDesc& d) const {
  auto* hdr = reinterpret_cast<const ArenaHeader*>(arena_->data());
  (void)hdr;
  ArenaLayout layout = ArenaLayout::compute(arena_->size());
  if (d.name_len == 0 || d.name_len > kMaxNameBytes) {
    return invalidArgument("malformed descriptor: name length " + std::to_string(d.name_len));
  }
  if (!isValidCollective(d.collective)) return invalidArgument("malformed descriptor: unknown collective " + std::to_string(d.collective));
  if (!isValidDataType(d.dtype)) return invalidArgument("malformed descriptor: unknown dtype " + std::to_string(d.dtype));
  if (!isValidReduceOp(d.reduce_op)) return invalidArgument("malformed descriptor: unknown reduce op " + std::to_string(d.reduce_op));
  if (d.ndim > kMaxDims) return invalidArgument("malformed descriptor: ndim " + std::to_string(d.ndim));
  uint64_t elems = 1;
  for (int i = 0; i < d.ndim; ++i) {
    if (d.shape[i] < 0) return invalidArgument("malformed descriptor: negative dimension");
    if (d.shape[i] != 0 && elems > (uint64_t{1} << 62) / static_cast<uint64_t>(d.shape[i])) {
      return invalidArgument("malformed descriptor: shape overflows");
    }
    elems *= static_cast<uint64_t>(d.shape[i]);
  }
  const uint64_t esize = dataTypeSize(static_cast<DataType>(d.dtype));
  if (elems > UINT64_MAX / esize) return invalidArgument("malformed descriptor: shape overflows");
  uint64_t want = elems * esize;
  bool in_place = d.collective == static_cast<uint8_t>(CollectiveType::kAllreduce) ||
                  d.collective == static_cast<uint8_t>(CollectiveType::kBroadcast) ||
                  d.collective == static_cast<uint8_t>(CollectiveType::kAllgather) ||
                  d.collective == static_cast<uint8_t>(CollectiveType::kReducescatter) ||
                  d.collective == static_cast<uint8_t>(CollectiveType::kAlltoall);
  if (in_place && want != d.data_bytes) {
    return invalidArgument("malformed descriptor: shape " + std::to_string(elems) + " elements of " +
                           std::to_string(dataTypeSize(static_cast<DataType>(d.dtype))) +
                           " bytes does not match data_bytes " + std::to_string(d.data_bytes));
  }
  if (d.prescale != d.prescale || d.postscale != d.postscale) {
    return invalidArgument("scale factors must not be NaN");
  }
  if ((d.flags & kSubmitFlagStreamed) != 0 &&
      (d.flags & (kSubmitFlagUserMemory | kSubmitFlagDevice)) != 0) {
    return invalidArgument(
        "malformed descriptor: only a tensor in the shared arena may be streamed into it");
  }
  if ((d.flags & kSubmitFlagSplit) != 0 &&
      (d.flags & (kSubmitFlagUserMemory | kSubmitFlagDevice | kSubmitFlagStreamed)) != 0) {
    return invalidArgument(
        "malformed descriptor: only a tensor copied into the shared arena may be split");
  }
  if ((d.flags & kSubmitFlagUserMemory) != 0) return validateDirect(d);
  if (gpu::isDevice(d)) {
    return gpu::validateDeviceDesc(d, device ? device->bytes() : 0, device ? device->events() : 0,
                                   device_error);
  }
  auto in_data = [&](uint64_t off, uint64_t len) {
    return len == 0 || (off >= layout.data_offset && len <= layout.data_bytes &&
                        off - layout.data_offset <= layout.data_bytes - len);
  };
  if (!in_data(d.data_offset, d.data_bytes)) {
    return invalidArgument("malformed descriptor: data [" + std::to_string(d.data_offset) + ", +" +
                           std::to_string(d.data_bytes) + ") is outside the arena's data region");
  }
  if (!in_data(d.out_offset, d.out_bytes)) {
    return invalidArgument("malformed descriptor: output region is outside the arena");
  }
  if ((d.flags & kSubmitFlagStreamed) != 0) {
    if (streamed_min_bytes == 0) {
      return invalidArgument(
          "malformed descriptor: a streamed copy-in from a trainer the agent did not allow it");
    }
    if (d.collective != static_cast<uint8_t>(CollectiveType::kAllreduce) ||
        d.data_bytes < streamed_min_bytes) {
      return invalidArgument("malformed descriptor: only a host allreduce of at least " +
                             std::to_string(streamed_min_bytes) +
                             " bytes may be streamed into the arena");
    }
    // The count of bytes copied: the cache line before the input.
    if (d.data_offset % kDataAlignment != 0 ||
        !in_data(d.data_offset - kStreamedHeaderBytes, kStreamedHeaderBytes)) {
      return invalidArgument("malformed descriptor: a streamed input at " +
                             std::to_string(d.data_offset) +
                             " has no aligned copy count before it in the arena's data region");
    }
  }
  if ((d.flags & kSubmitFlagSplit) != 0) {
    if (split_min_bytes == 0) {
      return invalidArgument(
          "malformed descriptor: a split reduction from a trainer the agent did not allow it");
    }
    if (d.collective != static_cast<uint8_t>(CollectiveType::kAllreduce) ||
        d.data_bytes < split_min_bytes || (d.out_bytes > 0 && d.out_offset != d.data_offset)) {
      return invalidArgument("malformed descriptor: only an in-place host allreduce of at least " +
                             std::to_string(split_min_bytes) + " bytes may be split");
    }
    // Its SplitHeader comes first (the rest of it is checked against the
    // job's local size when the op runs).
    if (d.data_offset % kDataAlignment != 0 ||
        !in_data(d.data_offset - splitHeaderBytes(1), splitHeaderBytes(1))) {
      return invalidArgument("malformed descriptor: a split input at " +
                             std::to_string(d.data_offset) +
                             " has no aligned header before it in the arena's data region");
    }
  }
  if (d.collective == static_cast<uint8_t>(CollectiveType::kAllreduce) && d.out_bytes > 0 &&
      d.out_offset != d.data_offset) {
    // Out of place: the output is a region of its own, as large as the input.
    if (d.out_bytes != d.data_bytes) {
      return invalidArgument("malformed descriptor: allreduce output region of " + std::to_string(d.out_bytes) +
                             " bytes for " + std::to_string(d.data_bytes) + " bytes of input");
    }
    if (d.out_offset < d.data_offset + d.data_bytes && d.data_offset < d.out_offset + d.out_bytes) {
      return invalidArgument("malformed descriptor: allreduce output region overlaps its input");
    }
  }
  if (d.prescale != d.prescale || d.postscale != d.postscale) {
    return invalidArgument("scale factors must not be NaN");
  }
  return okStatus();
}

Status ClientConn::validateDirect(const SubmitDesc& d) const {
  if (direct_min_bytes == 0) {
    return invalidArgument("malformed descriptor: a direct user-memory op from a trainer the agent did not admit "
                           "to the direct path");
  }
  if (d.collective != static_cast<uint8_t>(CollectiveType::kAllreduce) || (d.flags & kSubmitFlagDevice) != 0) {
    return invalidArgument("malformed descriptor: only a host allreduce may name user memory");
  }
  // The bounds of a tensor in a 64-bit address space (and of the limits'
  // payload quota, checked separately).
  constexpr uint64_t kMaxDirectBytes = uint64_t{1} << 40;
  auto range_ok = [](uint64_t addr, uint64_t len) { return addr != 0 && len <= kMaxDirectBytes && addr + len > addr; };
  if (d.data_bytes == 0 || !range_ok(d.data_offset, d.data_bytes)) {
    return invalidArgument("malformed descriptor: user memory [" + std::to_string(d.data_offset) + ", +" +
                           std::to_string(d.data_bytes) + ") is not a valid range");
  }
  if (d.out_bytes > 0 && d.out_offset != d.data_offset) {
    if (d.out_bytes != d.data_bytes || !range_ok(d.out_offset, d.out_bytes)) {
      return invalidArgument("malformed descriptor: user-memory output [" + std::to_string(d.out_offset) + ", +" +
                             std::to_string(d.out_bytes) + ") for " + std::to_string(d.data_bytes) +
                             " bytes of input");
    }
    if (d.out_offset < d.data_offset + d.data_bytes && d.data_offset < d.out_offset + d.out_bytes) {
      return invalidArgument("malformed descriptor: allreduce output region overlaps its input");
    }
  }
  return okStatus();
}

bool ClientConn::popSubmission(SubmitDesc* out) {
  if (broken()) return false;
  if (submit_.tryPop(out)) return true;
  checkRings();
  return false;
}

std::string ClientConn::ringError() const {
  if (submit_.corrupt()) return "broke its submission ring (" + submit_.corruption() + ")";
  if (completions_.corrupt())
    return "broke its completion ring (" + completions_.corruption() + ")";
  return "";
}

void ClientConn::checkRings() {
  if (!broken() || broken_reported_) return;
  broken_reported_ = true;
  overflow_.clear();
  if (on_broken_ring) on_broken_ring();
}

void ClientConn::clearDoorbell() {
  uint64_t v;
  while (::read(doorbell_.get(), &v, sizeof v) > 0) {
  }
}

void ClientConn::complete(uint64_t handle, const Status& st, int64_t aux, uint64_t out_offset,
                          uint64_t out_bytes) {
  CompletionDesc c{};
  c.handle = handle;
  c.code = static_cast<int32_t>(st.code());
  const std::string& m = st.message();
  c.msg_len = static_cast<uint32_t>(std::min(m.size(), kMaxErrorBytes - 1));
  std::memcpy(c.msg, m.data(), c.msg_len);
  c.aux = aux;
  c.out_offset = out_offset;
  c.out_bytes = out_bytes;
  ++completed;
  if (!completions_.valid() || broken()) return;
  if (!overflow_.empty() || !completions_.tryPush(c)) {
    checkRings();
    if (!broken()) overflow_.push_back(c);
  }
}

bool ClientConn::flushCompletions() {
  if (broken()) return false;
  while (!overflow_.empty() && completions_.tryPush(overflow_.front())) overflow_.pop_front();
  checkRings();
  return !overflow_.empty();
}

ArenaHeader* ClientConn::header() const { return reinterpret_cast<ArenaHeader*>(arena_->data()); }

void ClientConn::signalClient() {
  if (!arena_) return;
  // After the completion's push: the client stores client_waiting, fences,
  // then looks at the ring (common/ipc_layout.h).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header()->client_waiting.load(std::memory_order_relaxed) == 0) return;
  uint64_t one = 1;
  ssize_t r = ::write(completion_.get(), &one, sizeof one);
  (void)r;
}

void ClientConn::setAgentPolling(bool polling) {
  if (arena_) header()->agent_polling.store(polling ? 1 : 0, std::memory_order_relaxed);
}

Status ClientConn::send(const google::protobuf::MessageLite& frame, const std::vector<int>& fds) {
  Status st = sendFrame(sock_.get(), frame, fds);
  if (arena_) header()->frames_sent.fetch_add(1, std::memory_order_release);
  return st;
}

}  // namespace kolo
