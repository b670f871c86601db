// The process's device seam implementation (device_api.h): CUDA unless the
// host emulation was selected explicitly.
#include <atomic>
#include <cstdio>
#include <mutex>

#include "agent/gpu/device_api.h"
#include "common/log.h"

namespace kolo::gpu {

#ifdef KOLO_HAVE_CUDA
std::unique_ptr<DeviceApi> makeCudaDeviceApi();
#endif
#ifdef KOLO_DEVICE_EMULATION
std::unique_ptr<DeviceApi> makeHostDeviceApi();
#endif

namespace {

struct Selected {
  std::mutex mu;
  bool chosen = false;
  DeviceKind kind = DeviceKind::kCuda;
  DeviceApi* api = nullptr;                    // never destroyed (used until exit)
  std::atomic<DeviceApi*> published{nullptr};  // api once chosen: read without the lock
};

Selected& selected() {
  static Selected* s = new Selected;
  return *s;
}

DeviceApi* makeLocked(Selected& s) {
  s.chosen = true;
  if (s.kind == DeviceKind::kHostEmulated) {
#ifdef KOLO_DEVICE_EMULATION
    s.api = makeHostDeviceApi().release();
#endif
  } else {
#ifdef KOLO_HAVE_CUDA
    s.api = makeCudaDeviceApi().release();
#endif
  }
  s.published.store(s.api, std::memory_order_release);
  return s.api;
}

}  // namespace

Status selectDeviceApi(DeviceKind kind) {
  Selected& s = selected();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.chosen) {
    if (s.kind == kind) return okStatus();
    return internalError("the device implementation was already chosen");
  }
  if (kind == DeviceKind::kHostEmulated && !deviceEmulationBuilt()) {
    return parseDeviceKind("host-emulated").status();
  }
  s.kind = kind;
  makeLocked(s);
  if (kind == DeviceKind::kHostEmulated) {
    const char* text =
        "THE DEVICE PATH IS HOST-EMULATED (KOLO_DEVICE=host-emulated): device tensors live in "
        "host memory and no GPU is used; this is for tests only";
    log::get("device")->warn("{}", text);
    std::fprintf(stderr, "kolo: WARNING: %s\n", text);
  }
  return okStatus();
}

DeviceApi* deviceApi() {
  Selected& s = selected();
  if (DeviceApi* api = s.published.load(std::memory_order_acquire)) return api;
  std::lock_guard<std::mutex> lock(s.mu);
  return s.chosen ? s.api : makeLocked(s);
}

}  // namespace kolo::gpu
