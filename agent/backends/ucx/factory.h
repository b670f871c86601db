// The UCX backend: host-memory collectives among agents over UCX tag
// matching (TCP, shared memory, RDMA: whatever UCX finds, UCX_TLS unset).
// See docs/backends.md for the algorithms and the failure behaviour.
#pragma once

#include <memory>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"

namespace kolo {

// Publishes this agent's UCX worker address under "<key_prefix>/<rank>",
// reads every peer's, connects, and runs one barrier so that every peer is
// known to be reachable before it returns (blocking, bounded by
// options.timeout). Unavailable "not viable: ..." when UCX cannot run here
// (or this build has no UCX); PeerFailure when a peer does not show up.
StatusOr<std::unique_ptr<Backend>> createUcxBackend(const BackendOptions& options, KvStore& kv);

}  // namespace kolo
