// The NCCL backend: collectives among agents over buffers in device memory
// (one NCCL rank per agent, on the agent's GPU). Bootstrapped through the
// KvStore (rank 0 publishes the ncclUniqueId under "<key_prefix>/0"). See
// docs/gpu.md and docs/backends.md.
//
// Differences from the ucx backend: every pointer handed to a collective is
// a device pointer on the backend's device (or memory the device can
// address, e.g. a mapped VMM arena); options.timeout bounds each whole
// collective, not the time without progress (NCCL reports no progress); the
// tuning knobs (chunk, pipeline, small-message) are NCCL's own business.
#pragma once

#include <memory>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"

namespace kolo {

namespace gpu {
class DevEvent;
}

// On the calling thread's current CUDA device.
StatusOr<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions& options, KvStore& kv);
// On CUDA device `device`. Blocks until the communicator is up on every rank
// (bounded by options.timeout). Unavailable "not viable: ..." without a GPU
// or without NCCL in this build; PeerFailure when a peer does not show up.
StatusOr<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions& options, KvStore& kv,
                                                     int device);

// True when this build has the NCCL backend.
bool ncclBackendCompiled();
// Whether this process can use NCCL (libnccl, or the emulation with the
// host-emulated device): Unavailable "not viable: ..." with the reason.
Status ncclUsable();

// Device tensors across agents (agent/ops/device_cross_nccl.cc): the next
// collective posted on `nccl` (made by createNcclBackend) first makes the
// backend's stream wait for `ready`, an event recorded on another stream of
// its device (no host wait). Call it from the thread that posts, right
// before that post. InvalidArgument when `nccl` is not an nccl backend.
Status ncclWaitBeforeNext(Backend& nccl, std::shared_ptr<gpu::DevEvent> ready);

}  // namespace kolo
