// The device path's wire rules, shared by libkolo and kolo-agent: pure
// logic, built in every configuration (also without CUDA) and unit-tested
// everywhere (tests/gpu/device_ipc_test.cc). See docs/gpu.md, "The device
// data path".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/ipc_layout.h"
#include "common/status.h"

namespace kolo::gpu {

constexpr size_t kIpcEventHandleBytes = 64;  // sizeof(cudaIpcEventHandle_t)
constexpr uint64_t kDefaultDeviceArenaBytes = 256ull << 20;
// A trainer starts with kMaxDeviceEvents (64) event pairs and asks for more
// (the DeviceEvents frame, doubling) while all are in flight, up to this.
constexpr uint32_t kMaxDeviceEventPairs = 4096;

// Which interprocess event pairs are free: the client takes one per device op
// at submission and gives it back once the result's copy-out is enqueued.
class EventSlotPool {
 public:
  explicit EventSlotPool(uint32_t size = kMaxDeviceEvents);
  std::optional<uint32_t> acquire();
  // False for an index that is out of range or not taken.
  bool release(uint32_t slot);
  uint32_t size() const { return static_cast<uint32_t>(taken_.size()); }
  // `n` more free pairs, numbered after the existing ones.
  void grow(uint32_t n) { taken_.resize(taken_.size() + n, false); }
  uint32_t inUse() const { return in_use_; }

 private:
  std::vector<bool> taken_;
  uint32_t next_ = 0;
  uint32_t in_use_ = 0;
};

// The number of event handles in a Hello/Welcome `device_events` field, or
// InvalidArgument when it is not a whole number of handles in 1..max.
StatusOr<uint32_t> countEventHandles(size_t bytes, uint32_t max = kMaxDeviceEvents);

// Marks a descriptor as a device op using event pair `event`.
void markDevice(SubmitDesc* d, uint32_t event);
inline bool isDevice(const SubmitDesc& d) { return (d.flags & kSubmitFlagDevice) != 0; }

// The agent's check of a device descriptor against the client's grant:
// `arena_bytes` (0: none, and `no_arena_reason` says why) and `events`
// (pairs registered at Hello). Offsets are relative to the device arena.
Status validateDeviceDesc(const SubmitDesc& d, uint64_t arena_bytes, uint32_t events,
                          const std::string& no_arena_reason);

// The collectives the device path carries (allreduce, broadcast, allgather,
// reducescatter, alltoall; others are refused with deviceNotWired()).
bool deviceCollectiveWired(uint8_t collective);
Status deviceNotWired(const SubmitDesc& d);

// What the agent does with one ready device op (all local ranks' descriptors).
enum class DeviceRoute {
  kLocalKernel,  // one GPU, one agent: the reduction kernel over the slots
  kStagedCross,  // one GPU, several agents: kernel, then host staging over the host backend
  kSeveralGpus,  // several GPUs, one agent: per-GPU groups, then across them (gpu_groups.h)
  kNcclCross,    // one GPU, several agents: kernel, then the generation's NCCL communicator
                 // (when the agents chose it;
                 // agent/ops/device_cross_nccl.cc; planDeviceOp itself never answers it)
  kRefuse,       // mixed host/device ranks, several GPUs across agents: `why`
};
struct DevicePlan {
  DeviceRoute route = DeviceRoute::kRefuse;
  std::string why;
};
// `device_flags[i]`: local rank i submitted a device tensor; `gpu[i]`: the
// agent's ordinal of that rank's GPU (-1: unknown). `name`: the tensor.
DevicePlan planDeviceOp(const std::string& name, const std::vector<bool>& device_flags,
                        const std::vector<int>& gpu, int cross_size);

}  // namespace kolo::gpu
