// The device seam (docs/gpu.md, "The device seam"): the few device
// operations the device protocol needs (streams; event record, wait and
// query; interprocess events; arenas created, exported and imported; async
// copies; the reduction launch; pointer attributes). The protocol code (the
// agent's device runtime, libkolo's device client, the device test ranks)
// is written against it, and no CUDA header is needed to compile it.
//
// Two implementations:
//  - "cuda" (device_api_cuda.cc, CUDA builds): forwards to the CUDA
//    wrappers of agent/gpu (device.h, vmm_arena.h, reduce.h).
//  - "host-emulated" (emu/, builds with KOLO_DEVICE_EMULATION=ON, the test
//    builds): CUDA's documented semantics on the host, memfd arenas across
//    processes, one FIFO worker per stream, injectable faults. For tests
//    only: selected explicitly (kolo-agent --device, libkolo KOLO_DEVICE).
//
// Streams are opaque `void*` (a cudaStream_t, or the emulation's stream;
// nullptr: the legacy default stream), since trainers hand theirs in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "agent/gpu/device_ipc.h"
#include "agent/gpu/plan.h"
#include "common/dtype.h"
#include "common/fd.h"
#include "common/status.h"

namespace kolo::gpu {

using IpcEventBytes = std::array<unsigned char, kIpcEventHandleBytes>;

// An event: record on a stream, query, make a stream wait for it (for the
// latest record enqueued before the wait, as cudaStreamWaitEvent).
class DevEvent {
 public:
  virtual ~DevEvent() = default;
  virtual Status record(void* stream) = 0;
  // Ok when the latest record has passed (or none was made), InProgress
  // while pending, an error otherwise.
  virtual Status query() = 0;
  virtual Status streamWait(void* stream) = 0;
  // Interprocess events only.
  virtual StatusOr<IpcEventBytes> exportHandle() = 0;
};

class DevStream {
 public:
  virtual ~DevStream() = default;
  virtual void* get() const = 0;
};

// Device memory shared between the agent (creates, exports) and a trainer
// (imports): the VMM arena on CUDA, a memfd under the emulation.
class DevArena {
 public:
  virtual ~DevArena() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  virtual StatusOr<UniqueFd> exportFd() const = 0;
};

// Page-locked host memory (cudaHostAlloc): copies to and from it are
// asynchronous. A copy between the device and pageable host memory is not:
// CUDA returns from a device-to-pageable copy only once it is done.
class DevHostBuffer {
 public:
  virtual ~DevHostBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

struct PointerInfo {
  bool device = false;  // device or managed memory
  int ordinal = -1;     // device memory: its device; -1 for host or managed
};

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  virtual const char* name() const = 0;
  virtual StatusOr<int> deviceCount() = 0;
  virtual Status setDevice(int device) = 0;
  virtual StatusOr<int> currentDevice() = 0;
  // 16 bytes naming the GPU (cudaDeviceProp::uuid).
  virtual StatusOr<std::string> deviceUuid(int device) = 0;

  virtual StatusOr<std::unique_ptr<DevStream>> createStream() = 0;
  virtual StatusOr<std::unique_ptr<DevEvent>> createEvent(bool interprocess) = 0;
  // A handle exported by another process.
  virtual StatusOr<std::unique_ptr<DevEvent>> openEvent(const IpcEventBytes& handle) = 0;

  virtual StatusOr<std::unique_ptr<DevArena>> createArena(int device, size_t min_bytes) = 0;
  virtual StatusOr<std::unique_ptr<DevArena>> importArena(int fd, size_t bytes, int device) = 0;

  // Pinned host memory, portable across devices (cudaHostAllocPortable).
  virtual StatusOr<std::unique_ptr<DevHostBuffer>> allocPinned(size_t bytes) = 0;

  // Any direction (cudaMemcpyDefault), ordered on `stream`. From the device
  // into pageable host memory it blocks until the copy is done (as CUDA).
  virtual Status copyAsync(void* dst, const void* src, size_t bytes, void* stream) = 0;
  // agent/gpu/reduce.h's launchReduce.
  virtual Status launchReduce(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                              void* const* dsts, int ndst, size_t count, double prescale,
                              double postscale, void* stream) = 0;
  // agent/gpu/batched_copy.h's batchedCopy: `n` device-to-device copies
  // (none overlapping within a segment) in as few kernel launches as
  // planBatchedCopy makes of them (items of kDefaultCopyChunkBytes, at most
  // kMaxCopyItemsPerLaunch per launch), ordered on `stream`. Returns the
  // number of launches (0 when every segment is empty).
  virtual StatusOr<int> batchedCopy(const CopySegment* segments, size_t n, void* stream) = 0;
  virtual PointerInfo pointerInfo(const void* p) = 0;
  // Several GPUs in one process (docs/gpu.md, "Several GPUs per node"):
  // cudaDeviceCanAccessPeer(device, peer) (false for device == peer), and
  // cudaDeviceEnablePeerAccess from `device` to `peer` (already enabled: ok).
  // A kernel on `device` may read `peer`'s memory only once enabled.
  virtual StatusOr<bool> canAccessPeer(int device, int peer) = 0;
  virtual Status enablePeerAccess(int device, int peer) = 0;

  // For test programs (never on a daemon's loop thread).
  virtual StatusOr<void*> allocDevice(size_t bytes) = 0;
  virtual void freeDevice(void* p) = 0;
  virtual Status streamSynchronize(void* stream, int64_t timeout_ms) = 0;

  // 1 when contexts created on `device` go through CUDA MPS, 0 when not,
  // -1 when unknown.
  virtual int mpsClient(int /*device*/) { return -1; }
};

constexpr int kMaxDeviceSources = 16;  // launchReduce's k
constexpr int kMaxDeviceOutputs = 8;

enum class DeviceKind { kCuda, kHostEmulated };
// "cuda" or "host-emulated"; the latter only in builds with
// KOLO_DEVICE_EMULATION=ON (the error says so). Pure.
StatusOr<DeviceKind> parseDeviceKind(const std::string& s);
bool deviceEmulationBuilt();

// The daemon's loop thread marks itself; the host emulation refuses (and
// logs as a bug) any call that would block on the device from it.
void markLoopThread();
bool onLoopThread();

// Chooses the process's implementation; before the first deviceApi() call
// (a later call with another kind is refused). The host emulation logs a
// loud warning.
Status selectDeviceApi(DeviceKind kind);
// The selected implementation (CUDA by default), or nullptr when this build
// has none (no CUDA and the emulation not selected).
DeviceApi* deviceApi();

}  // namespace kolo::gpu
