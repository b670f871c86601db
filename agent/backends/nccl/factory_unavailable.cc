// Built instead of the NCCL backend when CUDA or NCCL was not found at
// configure time.
#include "agent/backends/nccl/factory.h"

namespace kolo {

StatusOr<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions& options, KvStore& kv) {
  return createNcclBackend(options, kv, 0);
}

StatusOr<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions&, KvStore&, int) {
  return unavailable(
      "not viable: this build has no NCCL (configure with KOLO_WITH_CUDA=ON KOLO_WITH_NCCL=ON "
      "and CUDA + NCCL under /usr/local/cuda)");
}

bool ncclBackendCompiled() { return false; }

Status ncclUsable() { return unavailable("not viable: this build has no NCCL"); }

Status ncclWaitBeforeNext(Backend&, std::shared_ptr<gpu::DevEvent>) {
  return unavailable("not viable: this build has no NCCL");
}

}  // namespace kolo
