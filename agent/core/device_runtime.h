// The agent's side of the device path (docs/gpu.md, "The device data path"):
// per-client device arenas (VMM allocations exported as POSIX fds) with
// their interprocess event pairs, and the local reduction of device tensors
// on one agent stream per GPU, ordered by the clients' in_ready events and
// signalling the clients' out_ready events, with no host synchronisation.
//
// Built with CUDA or the host emulation: device_runtime_device.cc, the
// protocol over the device seam (agent/gpu/device_api.h: CUDA, or the host
// emulation when kolo-agent --device=host-emulated); without either:
// device_runtime_none.cc, whose grant() always answers why not (the trainer is admitted without a
// device arena and its device tensors are refused with that reason).
// Loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/gpu/gpu_groups.h"
#include "common/dtype.h"
#include "common/fd.h"
#include "common/status.h"

namespace kolo {

// One client's device arena and event pairs. Destroying it does not wait:
// the arena and events are kept until the agent's stream on that GPU has
// passed a marker recorded at the drop, so no kernel still reads the arena
// when it is unmapped (a trainer that died with work in flight).
class DeviceGrant {
 public:
  virtual ~DeviceGrant() = default;
  virtual uint64_t bytes() const = 0;
  virtual uint32_t events() const = 0;
  virtual int device() const = 0;  // the agent's CUDA ordinal of the client's GPU
  virtual StatusOr<UniqueFd> exportFd() const = 0;
  virtual const std::string& agentEvents() const = 0;  // out_ready handles, for Welcome
  // More event pairs (the DeviceEvents frame; at most gpu::kMaxDeviceEventPairs
  // in all): opens the client's new in_ready handles, creates as many
  // out_ready events; their handles, for DeviceEventsGranted.
  virtual StatusOr<std::string> addEvents(const std::string& client_events) = 0;
};

// A reduction (or broadcast) over the k local ranks' device slots, written
// back into every slot (as the host path does).
struct DeviceLocalOp {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  bool broadcast = false;   // copy the root's slot to the others instead of reducing
  int broadcast_root = -1;  // broadcast: the root's local rank (-1: on another agent)
  std::vector<DeviceGrant*> grants;  // one per local rank, all on one GPU
  std::vector<uint64_t> offsets;     // into each grant's arena
  std::vector<uint32_t> events;      // each rank's event pair
  // Allgather, reducescatter, alltoall (one agent, every rank of the job
  // local; agent/core/device_collectives.h): the op, its tensor's name (for
  // errors), each rank's output region (device-arena offsets, after the host
  // path's header room), the first dimension's rows and one row's bytes, and
  // the host copy of the ranks' first dimensions (allgather) or of the split
  // matrix (alltoall). Empty `collective`: allreduce or broadcast above.
  CollectiveType collective = CollectiveType::kAllreduce;
  std::string name;
  std::vector<uint64_t> out_offsets;
  int64_t dim0 = 0;
  uint64_t row_bytes = 0;
  std::vector<int64_t> meta;
};

// Kernel launches (a fused cycle's, or a runtime's totals).
struct DeviceFusedLaunches {
  uint64_t reduce = 0;
  uint64_t batched_copy = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  static std::unique_ptr<DeviceRuntime> create();

  // A grant of at least `bytes` on the trainer's GPU (`gpu_uuid`, 16 bytes,
  // wins over `cuda_device` when non-empty); `client_events`: its in_ready
  // handles. An error says why none (e.g. UNAVAILABLE "no CUDA device: ...").
  virtual StatusOr<std::shared_ptr<DeviceGrant>> grant(uint64_t bytes, int cuda_device,
                                                       const std::string& gpu_uuid,
                                                       const std::string& client_events) = 0;
  // Enqueues: every rank's in_ready wait, the kernel (or copies), every
  // rank's out_ready record. Returns once enqueued; the clients' streams
  // wait for out_ready before they copy the result out.
  virtual Status enqueueLocal(const DeviceLocalOp& op) = 0;
  // Device Tensor Fusion (docs/gpu.md, "Device Tensor Fusion"): allreduces
  // of one dtype, op and scale factors over the same local ranks on one GPU,
  // tensor j at byte offset `offsets[j]` (64-byte aligned) of a fusion
  // buffer of `buffer_bytes` per rank in the agent's device memory. Every
  // rank's in_ready waits, one batched copy packs every rank's tensors into
  // its part of the buffer, ONE reduction launch reduces the k parts into
  // the first, one batched copy unpacks it into every rank's slots, every
  // out_ready is recorded (also after a failed step). No host wait.
  virtual StatusOr<DeviceFusedLaunches> enqueueFused(const std::vector<DeviceLocalOp>& ops,
                                                     const std::vector<uint64_t>& offsets,
                                                     uint64_t buffer_bytes) = 0;
  // Every reduction and batched-copy launch this runtime enqueued.
  virtual DeviceFusedLaunches launchTotals() const = 0;

  // Device tensors across agents, staged through host memory (the host
  // backend carries them; docs/gpu.md). Step 0, on the staging thread:
  // pinned host memory for `bytes` on the op's GPU (reused once the GPU's
  // agent stream has passed everything enqueued before its release).
  virtual StatusOr<std::shared_ptr<char>> stagingBuffer(const DeviceLocalOp& op, size_t bytes) = 0;
  // Step 1, on the staging thread, blocks until done (bounded by
  // `timeout_ms`; into the pinned buffer of step 0 the copy is asynchronous,
  // so the deadline fires even when a trainer's stream never reaches its
  // copy-in): every rank's in_ready
  // wait, the reduction of the k slots into slot 0 with the prescale (no
  // postscale: it is applied after the agents' reduction), and the copy of
  // slot 0 (for a broadcast: the root's slot, when broadcast_root >= 0;
  // nothing otherwise) into `host` (op.count elements).
  virtual Status stageToHost(const DeviceLocalOp& op, void* host, int64_t timeout_ms,
                             const std::atomic<bool>* cancel) = 0;
  // Step 2, on the loop once the agents' result is in `host`: copies it into
  // every rank's slot and records every out_ready (no host wait; the pinned
  // buffer of step 0 waits for these copies when released).
  virtual Status stageFromHost(const DeviceLocalOp& op, const void* host) = 0;

  // Ranks on several GPUs of this agent (docs/gpu.md, "Several GPUs per
  // node"; `op.grants` on the plan's GPUs). Loop thread: whether GPU a's
  // kernels can read GPU b's memory (asked once per pair and cached; peer
  // access is enabled when they can).
  virtual bool canAccessPeer(int a, int b) = 0;
  // Whether this agent has a node-local NCCL (or its emulation).
  virtual bool nodeNcclBuilt() = 0;
  // kPeerKernel: on the loop thread, enqueues only. kNodeNccl: on the
  // staging thread, blocking: the node-local communicator `comm_key` over
  // the plan's GPUs is created on first use (bounded by `timeout_ms`).
  virtual Status enqueueSeveralGpus(const DeviceLocalOp& op, const gpu::GpuGroupPlan& plan,
                                    const std::string& comm_key, int64_t timeout_ms) = 0;
  // Drops the node-local communicators whose key starts with `prefix`
  // (a job removed). Loop thread.
  virtual void dropNodeComms(const std::string& prefix) = 0;
};

}  // namespace kolo

namespace kolo {
// The GPUs this agent can serve, for `kolo status` and /metrics. Any thread:
// CUDA queries only (the runtime's initialisation on the first call), no
// context or stream is created.
struct GpuInventory {
  int count = 0;
  std::string none_reason;  // count == 0: why, e.g. "built without CUDA"
  // Per GPU: 1 when contexts the agent creates there go through MPS
  // (cudaDevAttrMpsEnabled), 0 when not, -1 when the driver cannot say.
  std::vector<int> mps_client;
};
GpuInventory gpuInventory();

// The agent process's runtime, created on first use (by the loop thread) and
// never destroyed (CUDA objects must not be torn down after the runtime
// at exit). Grants keep what they need alive themselves.
DeviceRuntime& deviceRuntime();
}  // namespace kolo
