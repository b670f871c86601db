// device_nccl_steps.h in a build without a device implementation.
#include "agent/core/device_nccl_steps.h"

namespace kolo {

StatusOr<NcclCrossBuffer> enqueueNcclCrossInput(const DeviceLocalOp&) {
  return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
}

Status enqueueNcclCrossOutput(const DeviceLocalOp&, const NcclCrossBuffer&, bool) {
  return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
}

StatusOr<NcclCrossBuffer> enqueueNcclLayoutInput(const DeviceLocalOp&, const NcclCrossLayout&) {
  return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
}

Status enqueueNcclLayoutOutput(const DeviceLocalOp&, const NcclCrossLayout&, NcclCrossBuffer&,
                               bool) {
  return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
}

}  // namespace kolo
