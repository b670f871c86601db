// The device seam's selection text (device_api.h); pure, every build.
#include "agent/gpu/device_api.h"

namespace kolo::gpu {

bool deviceEmulationBuilt() {
#ifdef KOLO_DEVICE_EMULATION
  return true;
#else
  return false;
#endif
}

namespace {
thread_local bool t_loop = false;
}

void markLoopThread() { t_loop = true; }
bool onLoopThread() { return t_loop; }

StatusOr<DeviceKind> parseDeviceKind(const std::string& s) {
  if (s == "cuda") return DeviceKind::kCuda;
  if (s == "host-emulated") {
    if (!deviceEmulationBuilt()) {
      return invalidArgument(
          "device 'host-emulated' is the test emulation of the device path; this build does not "
          "have it "
          "(configure with -DKOLO_DEVICE_EMULATION=ON, test builds only)");
    }
    return DeviceKind::kHostEmulated;
  }
  return invalidArgument("device must be cuda or host-emulated (got '" + s + "')");
}

}  // namespace kolo::gpu
