#include "agent/gpu/emu/host_faults.h"

#include <cstdlib>
#include <sstream>

#include "common/log.h"

namespace kolo::gpu::emu {

StatusOr<Faults> parseFaults(const std::string& text) {
  Faults f;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    if (item == "fail-launch") {
      f.fail_launch = true;
    } else if (item == "fail-record") {
      f.fail_record = true;
    } else if (item == "sticky") {
      f.sticky = true;
    } else if (item == "hang-events") {
      f.hang_events = true;
    } else if (item.rfind("delay-us=", 0) == 0) {
      char* end = nullptr;
      const std::string v = item.substr(9);
      long long us = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || us < 0 || us > 10'000'000) {
        return invalidArgument("KOLO_DEVICE_EMU_FAULTS: delay-us must be 0..10000000 (got '" + v +
                               "')");
      }
      f.delay_us = us;
    } else {
      return invalidArgument("KOLO_DEVICE_EMU_FAULTS: unknown fault '" + item +
                             "' (delay-us=N, fail-launch, fail-record, sticky, hang-events)");
    }
  }
  return f;
}

const Faults& faults() {
  static const Faults f = [] {
    const char* env = std::getenv("KOLO_DEVICE_EMU_FAULTS");
    if (env == nullptr || *env == '\0') return Faults{};
    auto p = parseFaults(env);
    if (!p.isOk()) {
      log::get("device")->error("{} (ignored)", p.status().message());
      return Faults{};
    }
    log::get("device")->warn("host-emulated device: injecting faults '{}'", env);
    return *p;
  }();
  return f;
}

namespace {
std::atomic<bool> g_sticky{false};
}

Status stickyError() {
  if (!g_sticky.load()) return okStatus();
  return internalError(
      "cudaErrorIllegalAddress: an illegal memory access was encountered (sticky: the context is "
      "unusable; "
      "injected by the host emulation)");
}

void setStickyError() { g_sticky = true; }

Status injectedLaunchFailure() {
  return internalError(
      "cudaLaunchKernel: cudaErrorLaunchFailure: unspecified launch failure (injected by the host "
      "emulation)");
}

Status injectedRecordFailure() {
  return invalidArgument(
      "cudaEventRecord: cudaErrorInvalidResourceHandle: invalid resource handle (injected by the "
      "host emulation)");
}

}  // namespace kolo::gpu::emu
