// DeviceClient of a libkolo built without CUDA: never ready.
#include <cstdlib>

#include "device_client.h"

namespace kolo {

namespace {

class NoDeviceClient final : public DeviceClient {
 public:
  NoDeviceClient() {
    auto b = parseDeviceArenaMb(std::getenv("KOLO_DEVICE_ARENA_MB"));
    asked_ = !b.isOk() || *b > 0;
  }
  void prepareHello(ipc::Hello*) override {}
  void attach(const ipc::Welcome&, UniqueFd) override {}
  bool asked() const override { return asked_; }
  bool ready() const override { return false; }
  std::string why() const override { return "this libkolo was built without CUDA (KOLO_WITH_CUDA=OFF)"; }
  bool isDevicePointer(const void*) override { return false; }
  int pointerDevice(const void*) override { return -1; }
  int device() const override { return -1; }
  StatusOr<Staged> stageIn(const void*, uint64_t, uint64_t, uint64_t, void*,
                           Clock::time_point) override {
    return unavailable(why());
  }
  Status finish(const Staged&, void*, uint64_t, uint64_t, void*, bool, bool) override {
    return unavailable(why());
  }
  void retire(const Staged&, void*) override {}
  void* address(const Staged&, uint64_t) const override { return nullptr; }
  bool eventsExhausted() override { return false; }
  StatusOr<std::string> newEvents() override { return unavailable(why()); }
  Status attachEvents(const std::string&) override { return unavailable(why()); }
  void dropNewEvents() override {}
  uint32_t eventPairs() override { return 0; }
  void beginBatch(void*, size_t) override {}
  Status endBatch() override { return okStatus(); }
  int lastBatchLaunches() const override { return 0; }

 private:
  bool asked_ = false;
};

}  // namespace

std::unique_ptr<DeviceClient> DeviceClient::create() { return std::make_unique<NoDeviceClient>(); }

}  // namespace kolo
