// The NCCL call table (nccl_api.h): libnccl's functions, or the host
// emulation's when the device seam is host-emulated.
#include "agent/backends/nccl/nccl_api.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "agent/gpu/device_api.h"
#include "common/log.h"

namespace kolo::nccl {

const NcclApi& realNccl() {
  static const NcclApi api{
      "libnccl",     ncclGetUniqueId, ncclCommInitRankConfig, ncclCommGetAsyncError,
      ncclCommAbort, ncclGroupStart,  ncclGroupEnd,           ncclAllReduce,
      ncclBroadcast, ncclAllGather,   ncclReduceScatter,      ncclReduce,
      ncclSend,      ncclRecv,        ncclGetErrorString,     ncclGetLastError,
  };
  return api;
}

#ifndef KOLO_DEVICE_EMULATION
const NcclApi* emulatedNccl() { return nullptr; }
#endif

StatusOr<const NcclApi*> processNccl() {
  gpu::DeviceApi* dev = gpu::deviceApi();
  if (dev == nullptr || std::strcmp(dev->name(), "host-emulated") != 0) return &realNccl();
  // Tests: an agent whose NCCL is missing (KOLO_NCCL_EMU_FAULTS=absent).
  const char* faults = std::getenv("KOLO_NCCL_EMU_FAULTS");
  if (faults != nullptr && std::strstr(faults, "absent") != nullptr)
    return unavailable("not viable: NCCL is absent (injected: KOLO_NCCL_EMU_FAULTS=absent)");
  const NcclApi* emu = emulatedNccl();
  if (emu == nullptr)
    return unavailable(
        "not viable: the device is host-emulated but this build has no NCCL emulation");
  static std::once_flag warned;
  std::call_once(warned, [] {
    const char* text =
        "THE NCCL BACKEND IS HOST-EMULATED (the device seam is host-emulated): NCCL's calls run "
        "over TCP loopback between the ranks, libnccl is not used; this is for tests only";
    log::get("agent.nccl")->warn("{}", text);
    std::fprintf(stderr, "kolo: WARNING: %s\n", text);
  });
  return emu;
}

}  // namespace kolo::nccl
