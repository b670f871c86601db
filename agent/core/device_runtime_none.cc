// DeviceRuntime of a build without CUDA: no grants (docs/gpu.md).
#include <atomic>

#include "agent/core/device_runtime.h"

namespace kolo {

namespace {

class NoDeviceRuntime final : public DeviceRuntime {
 public:
  StatusOr<std::shared_ptr<DeviceGrant>> grant(uint64_t, int, const std::string&, const std::string&) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  Status enqueueLocal(const DeviceLocalOp&) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  StatusOr<DeviceFusedLaunches> enqueueFused(const std::vector<DeviceLocalOp>&,
                                             const std::vector<uint64_t>&, uint64_t) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  DeviceFusedLaunches launchTotals() const override { return {}; }
  StatusOr<std::shared_ptr<char>> stagingBuffer(const DeviceLocalOp&, size_t) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  Status stageToHost(const DeviceLocalOp&, void*, int64_t, const std::atomic<bool>*) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  Status stageFromHost(const DeviceLocalOp&, const void*) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  bool canAccessPeer(int, int) override { return false; }
  bool nodeNcclBuilt() override { return false; }
  Status enqueueSeveralGpus(const DeviceLocalOp&, const gpu::GpuGroupPlan&, const std::string&,
                            int64_t) override {
    return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
  }
  void dropNodeComms(const std::string&) override {}
};

}  // namespace

GpuInventory gpuInventory() {
  GpuInventory inv;
  inv.none_reason = "built without CUDA";
  return inv;
}

std::unique_ptr<DeviceRuntime> DeviceRuntime::create() { return std::make_unique<NoDeviceRuntime>(); }

}  // namespace kolo
