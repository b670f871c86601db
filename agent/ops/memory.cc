#include "agent/ops/memory.h"

#include "agent/gpu/device_ipc.h"

namespace kolo {

const OpMemory& memoryOf(const ReadyOp& op) {
  for (const SubmitDesc& d : op.descs) {
    if (gpu::isDevice(d)) return deviceMemory();
  }
  return hostMemory();
}

}  // namespace kolo
