// Client: the device path's submission (docs/gpu.md, "The device data
// path"; the copies and events are in device_client.h).
#include <cassert>
#include <chrono>
#include <cstring>

#include "agent/gpu/device_ipc.h"
#include "client.h"

namespace kolo {

namespace {

std::string quoted(std::string_view name) {
  constexpr size_t kShown = 64;
  return "'" + std::string(name.substr(0, kShown)) + (name.size() > kShown ? "...'" : "'");
}

}  // namespace

bool Client::wantsDevice(const AllreduceArgs& a) const {
  if (a.device == 1) return true;
  if (a.device == 0 || !device_ || !device_->asked()) return false;
  return device_->isDevicePointer(a.input) || device_->isDevicePointer(a.output);
}

StatusOr<uint64_t> Client::deviceAllreduceAsync(AllreduceArgs a) {
  a.device = 1;
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  const std::string name(a.name);
  const std::string what = std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
                           " of device tensor " + quoted(name);
  if (!device_ || !device_->ready()) {
    return unavailable(what + ": this rank has no device arena (" +
                       (device_ ? device_->why() : std::string("not connected")) +
                       "); hand kolo host tensors instead");
  }
  if (!gpu::deviceCollectiveWired(static_cast<uint8_t>(a.collective)) || a.compressed) {
    return invalidArgument(what + ": device tensors are wired for allreduce and broadcast only so far" +
                           (a.compressed ? " (not compressed)" : "") + "; copy the tensor to the host for this");
  }
  auto deadline = Clock::now() + opts_.op_timeout;
  {
    std::unique_lock<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usableLocked());
    if (names_in_flight_.count(name) != 0) {
      lock.unlock();
      progressUntil([&] { return names_in_flight_.count(name) == 0; }, Clock::now(), std::chrono::milliseconds(0));
      lock.lock();
      RETURN_IF_ERROR(usableLocked());
    }
    if (names_in_flight_.count(name) != 0) {
      return invalidArgument("Requested to " +
                             std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
                             " a tensor with the same name as another tensor that is currently being processed: " +
                             quoted(name) + ". If you want to request another tensor, use a different tensor name.");
    }
    names_in_flight_.insert(name);
  }
  auto staged = device_->stageIn(a.input, bytes, a.stream, deadline);
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
      staged = timedOut(staged.status().message() + " and none of them completed within the op timeout "
                        "(KOLO_OP_TIMEOUT); raise KOLO_DEVICE_ARENA_MB or wait on handles sooner");
      break;
    }
    progressUntil([&] { return in_flight_ < before || !failed_.isOk(); }, deadline, std::chrono::milliseconds(1000));
    {
      std::lock_guard<std::mutex> lock(mu_);
      Status u = usableLocked();
      if (!u.isOk()) {
        staged = u;
        break;
      }
    }
    staged = device_->stageIn(a.input, bytes, a.stream, deadline);
  }
  if (!staged.isOk()) {
    std::lock_guard<std::mutex> lock(mu_);
    names_in_flight_.erase(name);
    cv_.notify_all();
    return Status(staged.status().code(), what + ": " + staged.status().message());
  }
  SubmitDesc d{};
  d.handle = freshHandle();
  d.collective = static_cast<uint8_t>(a.collective);
  d.dtype = static_cast<uint8_t>(a.dtype);
  d.reduce_op = static_cast<uint8_t>(a.op);
  d.ndim = static_cast<uint8_t>(a.ndim);
  d.root = a.collective == static_cast<int>(CollectiveType::kBroadcast) ? a.root : -1;
  d.name_len = static_cast<uint32_t>(name.size());
  d.prescale = a.prescale;
  d.postscale = a.postscale;
  d.data_offset = staged->offset;
  d.data_bytes = bytes;
  for (int i = 0; i < a.ndim; ++i) d.shape[i] = a.shape[i];
  std::memcpy(d.name, name.data(), name.size());
  d.group_id = a.group_id;
  d.group_hash = a.group_hash;
  d.group_size = a.group_size;
  gpu::markDevice(&d, staged->event);
  Op op;
  op.name = name;
  op.output = a.output;
  op.bytes = bytes;
  op.device = true;
  op.staged = *staged;
  op.stream = a.stream;
  Status st = publishDevice(d, std::move(op), deadline);
  if (!st.isOk()) {
    (void)device_->finish(*staged, nullptr, 0, a.stream, false);
    std::lock_guard<std::mutex> lock(mu_);
    names_in_flight_.erase(name);
    cv_.notify_all();
    return st;
  }
  return d.handle;
}

Status Client::publishDevice(const SubmitDesc& d, Op op, Clock::time_point deadline) {
  const std::string name = op.name;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
      if (in_flight_ < maxInFlight()) {
        ops_.emplace(d.handle, std::move(op));
        ++in_flight_;
        bool pushed = submit_ring_.tryPush(d);  // we are the only producer
        assert(pushed);
        (void)pushed;
        break;
      }
    }
    bool room = progressUntil([&] { return in_flight_ < maxInFlight() || !failed_.isOk(); }, deadline,
                              std::chrono::milliseconds(1000));
    if (!room && Clock::now() >= deadline) {
      return timedOut("allreduce of device tensor " + quoted(name) + ": none of the " +
                      std::to_string(maxInFlight()) + " collectives this process has in flight completed in time "
                      "(KOLO_OP_TIMEOUT)");
    }
  }
  ringDoorbell();
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
  Status st = publishDevice(d, std::move(op), Clock::now() + opts_.op_timeout);
  if (!st.isOk()) {
    std::lock_guard<std::mutex> lock(mu_);
    names_in_flight_.erase(name);
    return st;
  }
  return d.handle;
}

}  // namespace kolo
