// The tcp backend: host-memory collectives among agents over plain TCP
// sockets, one connection per pair of agents. Messages are sent from the
// collective's buffer and received into it (no copy besides the kernel's),
// which is what Gloo does and UCX over tcp does not; see docs/backends.md.
#pragma once

#include <memory>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"

namespace kolo {

// Listens on options.tcp_address (every interface when empty), publishes
// "<key_prefix>/<rank>" = this agent's addresses, port and a nonce, connects
// to every peer (each rank dials the lower ranks), and runs one barrier so
// that every peer is known to be reachable before it returns (blocking,
// bounded by options.timeout). PeerFailure when a peer does not show up.
StatusOr<std::unique_ptr<Backend>> createTcpBackend(const BackendOptions& options, KvStore& kv);

}  // namespace kolo
