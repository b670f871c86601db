// Built instead of the UCX backend when UCX was not found at configure time.
#include "agent/backends/ucx/factory.h"

namespace kolo {

StatusOr<std::unique_ptr<Backend>> createUcxBackend(const BackendOptions&, KvStore&) {
  return unavailable(
      "not viable: this build has no UCX (configure with KOLO_WITH_UCX=ON and "
      "libucx-dev installed)");
}

}  // namespace kolo
