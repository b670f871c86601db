#include "agent/gpu/device_ipc.h"

#include <algorithm>

#include "common/dtype.h"

namespace kolo::gpu {

namespace {

std::string what(const SubmitDesc& d) {
  std::string name(d.name, std::min<size_t>(d.name_len, kMaxNameBytes));
  std::string coll = isValidCollective(d.collective) ? std::string(collectiveName(static_cast<CollectiveType>(d.collective)))
                                                     : "collective " + std::to_string(d.collective);
  return coll + " of device tensor '" + name + "'";
}

}  // namespace

EventSlotPool::EventSlotPool(uint32_t size) : taken_(size, false) {}

std::optional<uint32_t> EventSlotPool::acquire() {
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t s = (next_ + i) % n;
    if (!taken_[s]) {
      taken_[s] = true;
      next_ = (s + 1) % n;
      ++in_use_;
      return s;
    }
  }
  return std::nullopt;
}

bool EventSlotPool::release(uint32_t slot) {
  if (slot >= size() || !taken_[slot]) return false;
  taken_[slot] = false;
  --in_use_;
  return true;
}

StatusOr<uint32_t> countEventHandles(size_t bytes, uint32_t max) {
  if (bytes == 0 || bytes % kIpcEventHandleBytes != 0 || bytes / kIpcEventHandleBytes > max) {
    return invalidArgument("device_events is " + std::to_string(bytes) + " bytes; it must hold 1.." +
                           std::to_string(max) + " event handles of " + std::to_string(kIpcEventHandleBytes) +
                           " bytes");
  }
  return static_cast<uint32_t>(bytes / kIpcEventHandleBytes);
}

void markDevice(SubmitDesc* d, uint32_t event) {
  d->flags |= kSubmitFlagDevice;
  d->device_event = event;
}

bool deviceCollectiveWired(uint8_t collective) {
  switch (static_cast<CollectiveType>(collective)) {
    case CollectiveType::kAllreduce:
    case CollectiveType::kBroadcast:
    case CollectiveType::kAllgather:
    case CollectiveType::kReducescatter:
    case CollectiveType::kAlltoall:
      return true;
    default:
      return false;
  }
}

Status deviceNotWired(const SubmitDesc& d) {
  return invalidArgument(
      what(d) +
      ": device tensors are wired for allreduce, broadcast, allgather, reducescatter and "
      "alltoall; copy the tensor to the host for this collective (docs/gpu.md)");
}

Status validateDeviceDesc(const SubmitDesc& d, uint64_t arena_bytes, uint32_t events,
                          const std::string& no_arena_reason) {
  if (arena_bytes == 0) {
    return unavailable(what(d) + ": this rank has no device arena on the kolo agent (" +
                              (no_arena_reason.empty()
                                   ? std::string("it did not ask for one: KOLO_DEVICE_ARENA_MB unset, or no usable GPU in the trainer")
                                   : no_arena_reason) +
                              "); hand kolo host tensors instead");
  }
  if (!deviceCollectiveWired(d.collective)) return deviceNotWired(d);
  if (d.device_event >= events) {
    return invalidArgument("malformed descriptor: device event " + std::to_string(d.device_event) +
                           " is not one of the " + std::to_string(events) + " registered at Hello");
  }
  auto within = [&](uint64_t off, uint64_t len) {
    return len == 0 || (len <= arena_bytes && off <= arena_bytes - len);
  };
  if (!within(d.data_offset, d.data_bytes) || !within(d.out_offset, d.out_bytes)) {
    return invalidArgument("malformed descriptor: device data [" + std::to_string(d.data_offset) + ", +" +
                           std::to_string(d.data_bytes) + ") is outside the device arena of " +
                           std::to_string(arena_bytes) + " bytes");
  }
  return okStatus();
}

DevicePlan planDeviceOp(const std::string& name, const std::vector<bool>& device_flags, const std::vector<int>& gpu,
                        int cross_size) {
  DevicePlan p;
  const size_t k = device_flags.size();
  for (size_t i = 0; i < k; ++i) {
    if (!device_flags[i]) {
      p.why = "tensor '" + name + "': local rank " + std::to_string(i) +
              " submitted a host tensor and another a device tensor; on one agent all ranks must hand the "
              "same kind (mixing is not wired yet)";
      return p;
    }
  }
  for (size_t i = 0; i < k; ++i) {
    if (i < gpu.size() && gpu[i] < 0) {
      p.why = "tensor '" + name + "': local rank " + std::to_string(i) + "'s GPU is not known to the agent";
      return p;
    }
  }
  bool several = false;
  for (size_t i = 1; i < k && i < gpu.size(); ++i) several = several || gpu[i] != gpu[0];
  if (several) {
    if (cross_size > 1) {
      p.why = "tensor '" + name +
              "': device tensors of ranks on several GPUs of one node are wired for jobs on one "
              "agent only so far (this job spans " +
              std::to_string(cross_size) +
              " agents); put a node's ranks on one GPU, or copy the tensor to the host";
      return p;
    }
    p.route = DeviceRoute::kSeveralGpus;
    return p;
  }
  p.route = cross_size > 1 ? DeviceRoute::kStagedCross : DeviceRoute::kLocalKernel;
  return p;
}

}  // namespace kolo::gpu
