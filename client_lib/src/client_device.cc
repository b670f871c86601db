// Client: the device path's submission (docs/gpu.md, "The device data
// path"; the copies and events are in device_client.h).
#include <cassert>
#include <chrono>
#include <cstring>

#include "agent/gpu/device_ipc.h"
#include "client.h"

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
        what + ": device tensors are wired for allreduce and broadcast only so far" +
        (a.compressed ? " (not compressed)" : "") + "; copy the tensor to the host for this");
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
static void* deviceStream(const OpArgs& a) { return a.stream != nullptr ? a.stream : threadStream().stream; }

Status Client::prepareDevice(const OpArgs& a, uint64_t bytes, const std::string& what,
                             Clock::time_point deadline, SubmitDesc* d, Op* op) {
  void* const stream = deviceStream(a);
  auto staged = device_->stageIn(a.input, bytes, stream, deadline);
  while (!staged.isOk() && staged.status().code() == Code::kInProgress) {
    // Ops in flight hold the device arena space or the event pairs: let
    // their completions free them (bounded by the op timeout).
    uint64_t before = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      before = in_flight_;
    }
    if (before == 0) {
      staged = internalError(staged.status().message() + ", but nothing is in flight");
      break;
    }
    if (Clock::now() >= deadline) {
      staged = timedOut(staged.status().message() +
                        " and none of them completed within the op timeout "
                        "(KOLO_OP_TIMEOUT); raise KOLO_DEVICE_ARENA_MB or wait on handles sooner");
      break;
    }
    progressUntil([&] { return in_flight_ < before || !failed_.isOk(); }, deadline,
                  std::chrono::milliseconds(1000));
    {
      std::lock_guard<std::mutex> lock(mu_);
      Status u = usableLocked();
      if (!u.isOk()) {
        staged = u;
        break;
      }
    }
    staged = device_->stageIn(a.input, bytes, stream, deadline);
  }
  if (!staged.isOk())
    return Status(staged.status().code(), what + ": " + staged.status().message());
  // The descriptor as the slot plan describes one: the input at its
  // device-arena offset, in place.
  SlotRequest r = slotRequest(a, bytes);
  SlotPlan plan;
  plan.input = SlotPiece{staged->offset, bytes, false};
  *d = describeSubmit(r, plan, 0);
  gpu::markDevice(d, staged->event);
  op->bytes = bytes;
  op->device = true;
  op->staged = *staged;
  op->stream = stream;
  return okStatus();
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
