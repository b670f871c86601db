// The NCCL calls the nccl backend makes, as a table: the real libnccl's
// (default), or the host emulation's (agent/backends/nccl/emu/, built only
// with KOLO_DEVICE_EMULATION) when the process's device seam is the host
// emulation (kolo-agent --device=host-emulated, KOLO_DEVICE=host-emulated):
// real NCCL cannot touch emulated device memory, so the two go together.
// The emulation says so loudly (stderr and the agent.nccl log) when chosen.
// docs/gpu.md, "The NCCL emulation".
#pragma once

#include <nccl.h>

#include "common/status.h"

namespace kolo::nccl {

struct NcclApi {
  const char* name;  // "libnccl" or "host-emulated"
  ncclResult_t (*getUniqueId)(ncclUniqueId* id);
  ncclResult_t (*commInitRankConfig)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config);
  ncclResult_t (*commGetAsyncError)(ncclComm_t comm, ncclResult_t* state);
  ncclResult_t (*commAbort)(ncclComm_t comm);
  ncclResult_t (*groupStart)();
  ncclResult_t (*groupEnd)();
  ncclResult_t (*allReduce)(const void* in, void* out, size_t count, ncclDataType_t t,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
  ncclResult_t (*broadcast)(const void* in, void* out, size_t count, ncclDataType_t t, int root,
                            ncclComm_t comm, cudaStream_t s);
  ncclResult_t (*allGather)(const void* in, void* out, size_t count, ncclDataType_t t,
                            ncclComm_t comm, cudaStream_t s);
  ncclResult_t (*reduceScatter)(const void* in, void* out, size_t recv_count, ncclDataType_t t,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
  ncclResult_t (*reduce)(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t s);
  ncclResult_t (*send)(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                       cudaStream_t s);
  ncclResult_t (*recv)(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                       cudaStream_t s);
  const char* (*getErrorString)(ncclResult_t r);
  const char* (*getLastError)(ncclComm_t comm);
};

// libnccl.so.2's functions.
const NcclApi& realNccl();
// The emulation's table; nullptr in builds without KOLO_DEVICE_EMULATION.
const NcclApi* emulatedNccl();
// The table that goes with the process's device seam (gpu::deviceApi()):
// the emulation with "host-emulated" (logged loudly, once), libnccl
// otherwise. Unavailable when the seam is host-emulated in a build without
// the NCCL emulation (cannot happen: both come with KOLO_DEVICE_EMULATION).
StatusOr<const NcclApi*> processNccl();

}  // namespace kolo::nccl
