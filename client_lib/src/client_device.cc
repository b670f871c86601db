// Client: the device path's submission (docs/gpu.md, "The device data
// path"; the copies and events are in device_client.h).
#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>

#include "agent/gpu/device_ipc.h"
#include "client.h"
#include "common/log.h"

namespace kolo {

bool Client::wantsDevice(const OpArgs& a) const {
  if (a.device == 1) return true;
  if (a.device == 0 || !device_ || !device_->asked()) return false;
  return device_->isDevicePointer(a.input) || device_->isDevicePointer(a.output);
}

Status Client::deviceAdmits(const OpArgs& a, const std::string& what) const {
  if (!device_ || !device_->ready()) {
    return unavailable(what + ": this rank has no device arena (" +
                       (device_ ? device_->why() : std::string("not connected")) +
                       "); hand kolo host tensors instead");
  }
  if (!gpu::deviceCollectiveWired(static_cast<uint8_t>(a.collective)) || a.compressed) {
    return invalidArgument(
        what + ": " +
        (a.compressed ? std::string("a compressed allreduce of device tensors is not wired (cast "
                                    "the tensor to float16/bfloat16 on the device instead)")
                      : std::string("this collective is not wired for device tensors")) +
        "; copy the tensor to the host for this");
  }
  // The GPU: the device arena is on the device that was current at
  // kolo_init; the stream (kolo_set_stream) and the tensors must be there.
  const int arena = device_->device();
  const ThreadStream& ts = threadStream();
  auto where = [arena] {  // built only for a refusal
    return "this rank's device arena is on CUDA device " + std::to_string(arena) +
           " (the current device when kolo_init ran)";
  };
  if (a.stream == nullptr && ts.device >= 0 && ts.device != arena) {
    return invalidArgument(what + ": its stream is on CUDA device " + std::to_string(ts.device) +
                           " (kolo_set_stream), but " + where() +
                           "; name a stream of that device, or make the tensors' device current before kolo_init");
  }
  const void* ptrs[2] = {a.input, a.output != a.input ? a.output : nullptr};  // in place: asked once
  for (const void* p : ptrs) {
    const int d = p != nullptr ? device_->pointerDevice(p) : -1;
    if (d >= 0 && d != arena) {
      return invalidArgument(what + ": the tensor is on CUDA device " + std::to_string(d) + ", but " + where() +
                             "; make that device current before kolo_init (torch.cuda.set_device), or copy the "
                             "tensor to CUDA device " + std::to_string(arena));
    }
  }
  return okStatus();
}

// The stream of a device op: the one in OpArgs, else the calling thread's
// (kolo_set_stream), else NULL (the legacy default stream).
void* Client::deviceStream(const OpArgs& a) {
  return a.stream != nullptr ? a.stream : threadStream().stream;
}

StatusOr<DeviceClient::Staged> Client::stageDraining(
    const std::function<StatusOr<DeviceClient::Staged>()>& stage, Clock::time_point deadline) {
  auto staged = stage();
  while (!staged.isOk() && staged.status().code() == Code::kInProgress) {
    // Every event pair in flight: ask the agent for more (the ops in flight
    // may be waiting for ops not submitted yet, a group's later members or
    // other ranks' orders), else wait for completions as below.
    if (device_->eventsExhausted() && growDeviceEvents()) {
      staged = stage();
      continue;
    }
    // Ops in flight hold the device arena space or the event pairs: let
    // their completions free them (bounded by the op timeout).
    uint64_t before = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      before = in_flight_;
    }
    if (before == 0) return internalError(staged.status().message() + ", but nothing is in flight");
    if (Clock::now() >= deadline) {
      return timedOut(staged.status().message() +
                      " and none of them completed within the op timeout "
                      "(KOLO_OP_TIMEOUT); raise KOLO_DEVICE_ARENA_MB or wait on handles sooner");
    }
    progressUntil([&] { return in_flight_ < before || !failed_.isOk(); }, deadline,
                  std::chrono::milliseconds(1000));
    {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
    }
    staged = stage();
  }
  return staged;
}

Status Client::prepareDevice(const OpArgs& a, uint64_t bytes, const std::string& what,
                             Clock::time_point deadline, SubmitDesc* d, Op* op) {
  void* const stream = deviceStream(a);
  // The host path's slot layout (common/slot_plan.h), placed in the device
  // arena: [input] for allreduce and broadcast (in place), [input | output]
  // for reducescatter, [header room | output | input] for allgather and
  // alltoall, whose header itself goes to the shared arena (meta_offset).
  SlotRequest r = slotRequest(a, bytes);
  r.has_output = a.output != nullptr;
  SlotPlan plan;
  const auto coll = static_cast<CollectiveType>(a.collective);
  const bool layout = coll == CollectiveType::kAllgather || coll == CollectiveType::kAlltoall ||
                      coll == CollectiveType::kReducescatter;
  if (!layout) {  // zero copy: the tensor lives in the device arena (kolo_device_alloc)
    void* target = a.output != nullptr ? a.output : const_cast<void*>(a.input);
    if (auto at = device_->residentOffset(target, bytes))
      return prepareResident(a, bytes, *at, what, deadline, d, op);
  }
  if (layout) {
    static const std::map<uint64_t, uint64_t> kNoShared;
    const WorldView w = world();
    ASSIGN_OR_RETURN(plan, planSlots(r, SlotGeometry{&kNoShared, w.rank, w.size, 0}));
  } else {
    plan.slot_bytes = bytes;
    plan.input = SlotPiece{0, bytes, true};
    plan.result = plan.input;
    plan.result_bytes = bytes;
  }
  if (plan.header.bytes > 0) {  // the agent reads it on the host
    ASSIGN_OR_RETURN(uint64_t meta, allocateSlot(plan.header.bytes, what, deadline));
    op->slot = meta;
    std::memcpy(arena_.data() + meta, plan.header_src, plan.header.bytes);
  }
  const uint64_t slot_bytes = std::max<uint64_t>(plan.slot_bytes, 1);
  auto staged = stageDraining(
      [&] { return device_->stageIn(a.input, bytes, slot_bytes, plan.input.at, stream, deadline); },
      deadline);
  if (!staged.isOk())
    return Status(staged.status().code(), what + ": " + staged.status().message());
  // Offsets are device-arena offsets (the slot's), the header's a shared-arena one.
  *d = describeSubmit(r, plan, staged->offset);
  if (!layout) d->out_offset = d->out_bytes = 0;  // in place, as before
  if (op->slot) d->meta_offset = *op->slot;
  gpu::markDevice(d, staged->event);
  op->bytes = plan.result_bytes;
  op->device = true;
  op->device_result_at = plan.result ? plan.result->at : 0;
  op->gather = plan.gather;
  op->gather_dim0 = plan.gather_dim0;
  op->staged = *staged;
  op->stream = stream;
  return okStatus();
}

bool Client::beginDeviceGroup(const std::vector<OpArgs>& members) {
  if (!device_ || !device_->ready() || members.size() < 2) return false;
  void* const stream = deviceStream(members[0]);
  for (const OpArgs& a : members) {
    if (a.collective != static_cast<int>(CollectiveType::kAllreduce) || a.compressed ||
        !wantsDevice(a) || deviceStream(a) != stream) {
      return false;
    }
  }
  device_->beginBatch(stream, members.size());
  return true;
}

void Client::endDeviceGroup(size_t members) {
  Status st = device_->endBatch();
  static auto logger = log::get("client.device");
  if (!st.isOk()) {
    logger->warn("the copy-in of a device group of {} tensors: {}", members, st.message());
    return;
  }
  logger->debug("device group of {} tensors copied in by {} batched copy launches", members,
                device_->lastBatchLaunches());
}

StatusOr<uint64_t> Client::submitDeviceDescForTest(const char* name, uint64_t bytes) {
  const size_t len = std::strlen(name);
  if (len == 0 || len > kMaxNameBytes) return invalidArgument("bad name");
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usableLocked());
    if (!names_in_flight_.insert(name).second) return invalidArgument("name in flight");
  }
  SubmitDesc d{};
  d.handle = freshHandle();
  d.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
  d.dtype = static_cast<uint8_t>(DataType::kUint8);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  d.ndim = 1;
  d.shape[0] = static_cast<int64_t>(bytes);
  d.data_bytes = bytes;
  d.prescale = d.postscale = 1.0;
  d.name_len = static_cast<uint32_t>(len);
  std::memcpy(d.name, name, len);
  gpu::markDevice(&d, 0);
  Op op;
  op.name = name;
  Status st = publish(d, op, Clock::now() + opts_.op_timeout,
                      describeTensor(CollectiveType::kAllreduce, name));
  if (!st.isOk()) {
    std::lock_guard<std::mutex> lock(mu_);
    names_in_flight_.erase(name);
    return st;
  }
  return d.handle;
}

}  // namespace kolo
