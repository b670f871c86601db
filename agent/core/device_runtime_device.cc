// DeviceRuntime over the device seam (docs/gpu.md, "The device data path"
// and "The device seam"): the same protocol on CUDA and on the host
// emulation (agent/gpu/device_api.h).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "agent/core/device_collectives.h"
#include "agent/core/device_fused.h"
#include "agent/core/device_grant.h"
#include "agent/core/device_runtime.h"
#include "agent/core/device_several_gpus.h"
#include "agent/gpu/device_ipc.h"
#include "agent/gpu/mps_probe.h"
#include "common/log.h"

namespace kolo {

namespace {

auto devLog() { return log::get("agent.device"); }

Status noDevice() {
  return unavailable("this kolo-agent was built without CUDA (KOLO_WITH_CUDA=OFF)");
}

SeamGrant* seam(DeviceGrant* g) { return static_cast<SeamGrant*>(g); }

// Allgather, reducescatter, alltoall: inputs and outputs apart (device_collectives.h).
bool isLayoutCollective(CollectiveType c) {
  return c == CollectiveType::kAllgather || c == CollectiveType::kReducescatter ||
         c == CollectiveType::kAlltoall;
}

// Records every rank's out_ready on `s`: after anything was enqueued for
// the op, even when a later step failed, so a client's copy-out (and its
// slot's reuse) is ordered behind whatever the agent stream still does.
Status recordOutputs(const DeviceLocalOp& op, void* s) {
  Status first;
  for (size_t i = 0; i < op.grants.size(); ++i) {
    Status st = seam(op.grants[i])->out_[op.events[i]]->record(s);
    if (!st.isOk() && first.isOk()) first = st;
  }
  return first;
}

class SeamDeviceRuntime final : public DeviceRuntime {
 public:
  StatusOr<std::shared_ptr<DeviceGrant>> grant(uint64_t bytes, int cuda_device,
                                               const std::string& gpu_uuid,
                                               const std::string& client_events) override {
    gpu::DeviceApi* api = gpu::deviceApi();
    if (api == nullptr) return noDevice();
    ASSIGN_OR_RETURN(int n, api->deviceCount());
    int dev = -1;
    if (gpu_uuid.size() == 16) {
      for (int i = 0; i < n && dev < 0; ++i) {
        auto u = api->deviceUuid(i);
        if (u.isOk() && *u == gpu_uuid) dev = i;
      }
      if (dev < 0)
        return unavailable("the trainer's GPU (by UUID) is not visible to the kolo agent");
    } else {
      if (cuda_device < 0 || cuda_device >= n) {
        return invalidArgument("CUDA device " + std::to_string(cuda_device) +
                               " is not one of the agent's " + std::to_string(n));
      }
      dev = cuda_device;
    }
    RETURN_IF_ERROR(api->setDevice(dev));
    ASSIGN_OR_RETURN(auto ctx, ctxFor(*api, dev));
    ASSIGN_OR_RETURN(auto g, makeSeamGrant(*api, std::move(ctx), bytes, client_events));
    return std::shared_ptr<DeviceGrant>(std::move(g));
  }

  StatusOr<std::shared_ptr<char>> stagingBuffer(const DeviceLocalOp& op, size_t bytes) override {
    if (gpu::deviceApi() == nullptr) return noDevice();
    if (op.grants.empty()) return internalError("device op without ranks");
    return seam(op.grants[0])->ctx_->staging->acquire(bytes);
  }
  Status stageToHost(const DeviceLocalOp& op, void* host, int64_t timeout_ms,
                     const std::atomic<bool>* cancel) override;
  Status stageFromHost(const DeviceLocalOp& op, const void* host) override;
  Status enqueueLocal(const DeviceLocalOp& op) override;
  StatusOr<DeviceFusedLaunches> enqueueFused(const std::vector<DeviceLocalOp>& ops,
                                             const std::vector<uint64_t>& offsets,
                                             uint64_t buffer_bytes) override {
    gpu::DeviceApi* api = gpu::deviceApi();
    if (api == nullptr) return noDevice();
    if (ops.empty() || ops[0].grants.empty()) return internalError("device op without ranks");
    auto n = enqueueFusedOnCtx(*api, *seam(ops[0].grants[0])->ctx_, ops, offsets, buffer_bytes);
    if (n.isOk()) {
      reduces_ += n->reduce;
      batched_copies_ += n->batched_copy;
    }
    return n;
  }
  DeviceFusedLaunches launchTotals() const override {
    return {reduces_.load(), batched_copies_.load()};
  }

  bool canAccessPeer(int a, int b) override;
  bool nodeNcclBuilt() override { return nccl::nodeCommBuilt(); }
  Status enqueueSeveralGpus(const DeviceLocalOp& op, const gpu::GpuGroupPlan& plan,
                            const std::string& comm_key, int64_t timeout_ms) override;
  void dropNodeComms(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(comms_mu_);
    for (auto it = comms_.lower_bound(prefix);
         it != comms_.end() && it->first.compare(0, prefix.size(), prefix) == 0;)
      it = comms_.erase(it);
  }

 private:
  // The agent stream of the op's GPU, made to wait for every rank's
  // in_ready; `slots` receives the ranks' slot addresses (agent mapping).
  // `on_loop`: the retired grants are swept too (the loop thread owns them).
  StatusOr<DeviceCtx*> waitInputs(const DeviceLocalOp& op, std::vector<void*>* slots,
                                  bool on_loop) {
    const size_t k = op.grants.size();
    if (k == 0 || op.offsets.size() != k || op.events.size() != k)
      return internalError("device op without ranks");
    if (k > static_cast<size_t>(gpu::kMaxDeviceSources)) {
      return invalidArgument("device tensors of " + std::to_string(k) +
                             " ranks on one GPU: at most " +
                             std::to_string(gpu::kMaxDeviceSources) + " are wired");
    }
    DeviceCtx* ctx = seam(op.grants[0])->ctx_.get();
    RETURN_IF_ERROR(gpu::deviceApi()->setDevice(ctx->device));
    if (on_loop) ctx->sweep();
    slots->resize(k);
    for (size_t i = 0; i < k; ++i) {
      SeamGrant* g = seam(op.grants[i]);
      if (g->ctx_.get() != ctx) return internalError("device op over two GPUs");
      RETURN_IF_ERROR(g->in_[op.events[i]]->streamWait(ctx->s()));
      (*slots)[i] = g->slot(op.offsets[i]);
    }
    return ctx;
  }

  Status enqueueWork(const DeviceLocalOp& op, const std::vector<void*>& slots, void* s);

  StatusOr<std::shared_ptr<DeviceCtx>> ctxFor(gpu::DeviceApi& api, int dev) {
    auto& c = ctxs_[dev];
    if (c) return c;
    auto ctx = std::make_shared<DeviceCtx>();
    ctx->device = dev;
    ASSIGN_OR_RETURN(ctx->stream, api.createStream());
    ctx->staging = PinnedStaging::create(api, dev, ctx->s());
    c = std::move(ctx);
    devLog()->info("device path: agent stream on {} device {}", api.name(), dev);
    // The agent works on the trainers' GPU from another process: without
    // MPS the GPU switches contexts between them for every op (measured
    // on an H200: 287 us per small allreduce with one trainer, 740 us with
    // four; 24-47 us under MPS; docs/gpu.md).
    const std::string pipe = gpu::defaultMpsPipeDirectory();
    struct stat st {};
    if (std::strcmp(api.name(), "cuda") == 0 && ::stat((pipe + "/control").c_str(), &st) != 0) {
      devLog()->warn(
          "device path: CUDA MPS does not seem to run (no {}/control): every device op will switch "
          "GPU "
          "contexts between the trainer and the agent, about 250 us each; start "
          "nvidia-cuda-mps-control -d "
          "for the agent and the trainers (docs/gpu.md, \"CUDA MPS\")",
          pipe);
    }
    return c;
  }

  std::map<int, std::shared_ptr<DeviceCtx>> ctxs_;
  std::map<std::pair<int, int>, bool> peer_;  // (a, b): a's kernels read b's memory
  SeveralGpus several_;
  std::mutex comms_mu_;  // the staging threads create them
  std::map<std::string, std::shared_ptr<nccl::NodeComm>> comms_;
  std::atomic<uint64_t> reduces_{0};  // reduction launches (the staging thread's too)
  std::atomic<uint64_t> batched_copies_{0};
};

bool SeamDeviceRuntime::canAccessPeer(int a, int b) {
  gpu::DeviceApi* api = gpu::deviceApi();
  if (api == nullptr) return false;
  auto it = peer_.find({a, b});
  if (it != peer_.end()) return it->second;
  auto can = api->canAccessPeer(a, b);
  bool yes = can.isOk() && *can;
  if (yes) {
    Status st = api->enablePeerAccess(a, b);
    if (!st.isOk()) {
      devLog()->warn("device path: GPU {} can access GPU {}, but enabling it failed: {}", a, b,
                     st.message());
      yes = false;
    }
  }
  devLog()->info("device path: GPU {} {} GPU {}'s memory", a, yes ? "reads" : "cannot read", b);
  peer_[{a, b}] = yes;
  return yes;
}

Status SeamDeviceRuntime::enqueueSeveralGpus(const DeviceLocalOp& op, const gpu::GpuGroupPlan& plan,
                                             const std::string& comm_key, int64_t timeout_ms) {
  gpu::DeviceApi* api = gpu::deviceApi();
  if (api == nullptr) return noDevice();
  std::shared_ptr<nccl::NodeComm> comm;
  if (plan.route == gpu::NodeRoute::kNodeNccl) {
    std::vector<int> gpus;
    for (const gpu::GpuGroup& g : plan.groups) gpus.push_back(g.gpu);
    std::lock_guard<std::mutex> lock(comms_mu_);
    auto& c = comms_[comm_key];
    if (c && c->devices() != gpus) c.reset();
    if (!c) {
      auto made = nccl::createNodeComm(gpus, std::chrono::milliseconds(timeout_ms));
      if (!made.isOk()) {
        comms_.erase(comm_key);
        return made.status();  // nothing enqueued: the clients' out_ready waits pass
      }
      c = std::move(*made);
    }
    comm = c;
  }
  return several_.enqueue(*api, op, plan, comm.get());
}

Status SeamDeviceRuntime::enqueueWork(const DeviceLocalOp& op, const std::vector<void*>& slots,
                                      void* s) {
  gpu::DeviceApi& api = *gpu::deviceApi();
  if (isLayoutCollective(op.collective)) {
    if (op.out_offsets.size() != slots.size()) return internalError("device op without outputs");
    std::vector<void*> outs;
    for (size_t i = 0; i < slots.size(); ++i)
      outs.push_back(seam(op.grants[i])->slot(op.out_offsets[i]));
    return enqueueDeviceCollective(api, op, slots, outs, s).status();
  }
  const size_t k = slots.size();
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  if (bytes == 0) return okStatus();
  if (op.broadcast) {
    for (size_t i = 0; i < k; ++i) {
      if (static_cast<int>(i) == op.broadcast_root) continue;
      RETURN_IF_ERROR(api.copyAsync(slots[i], slots[op.broadcast_root], bytes, s));
    }
    return okStatus();
  }
  const int nd = static_cast<int>(std::min<size_t>(k, gpu::kMaxDeviceOutputs));
  RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, slots.data(), static_cast<int>(k), slots.data(),
                                   nd, op.count, op.prescale, op.postscale, s));
  ++reduces_;
  for (size_t i = static_cast<size_t>(nd); i < k; ++i)
    RETURN_IF_ERROR(api.copyAsync(slots[i], slots[0], bytes, s));
  return okStatus();
}

Status SeamDeviceRuntime::enqueueLocal(const DeviceLocalOp& op) {
  if (gpu::deviceApi() == nullptr) return noDevice();
  if (op.broadcast &&
      (op.broadcast_root < 0 || op.broadcast_root >= static_cast<int>(op.grants.size()))) {
    return internalError("broadcast root is not a local rank");
  }
  std::vector<void*> slots;
  auto ctx = waitInputs(op, &slots, true);
  if (!ctx.isOk()) {
    // Some waits may be enqueued: out_ready still goes after them.
    if (!op.grants.empty() && op.events.size() == op.grants.size()) {
      (void)recordOutputs(op, seam(op.grants[0])->ctx_->s());
    }
    return ctx.status();
  }
  void* s = (*ctx)->s();
  Status st = enqueueWork(op, slots, s);
  Status rec = recordOutputs(op, s);
  return st.isOk() ? rec : st;
}

Status SeamDeviceRuntime::stageToHost(const DeviceLocalOp& op, void* host, int64_t timeout_ms,
                                      const std::atomic<bool>* cancel) {
  gpu::DeviceApi* api = gpu::deviceApi();
  if (api == nullptr) return noDevice();
  std::vector<void*> slots;
  ASSIGN_OR_RETURN(DeviceCtx * ctx, waitInputs(op, &slots, false));
  void* s = ctx->s();
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  if (bytes == 0) return okStatus();
  const void* src = nullptr;
  if (!op.broadcast) {
    RETURN_IF_ERROR(api->launchReduce(op.dtype, op.op, slots.data(), static_cast<int>(slots.size()),
                                      slots.data(), 1, op.count, op.prescale, 1.0, s));
    ++reduces_;
    src = slots[0];
  } else if (op.broadcast_root >= 0 && op.broadcast_root < static_cast<int>(slots.size())) {
    src = slots[op.broadcast_root];
  }
  if (src == nullptr) return okStatus();
  RETURN_IF_ERROR(api->copyAsync(host, src, bytes, s));
  // Wait for this copy only (not for later work on the stream).
  ASSIGN_OR_RETURN(auto done, api->createEvent(false));
  RETURN_IF_ERROR(done->record(s));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    Status q = done->query();
    if (q.code() != Code::kInProgress) return q;
    if (std::chrono::steady_clock::now() >= deadline) {
      return timedOut("the GPU did not copy it to the host within " +
                      std::to_string(timeout_ms / 1000) +
                      " s (--device-staging-timeout-s): a trainer's stream never reached its "
                      "copy-in (a trainer stuck before the collective, or its stream waiting on "
                      "something that never happens)");
    }
    if (cancel != nullptr && cancel->load()) return aborted("the kolo agent is stopping");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status SeamDeviceRuntime::stageFromHost(const DeviceLocalOp& op, const void* host) {
  gpu::DeviceApi* api = gpu::deviceApi();
  if (api == nullptr) return noDevice();
  if (op.grants.empty()) return internalError("device op without ranks");
  DeviceCtx& ctx = *seam(op.grants[0])->ctx_;
  RETURN_IF_ERROR(api->setDevice(ctx.device));
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  Status st;
  for (size_t i = 0; i < op.grants.size() && st.isOk() && bytes > 0; ++i) {
    st = api->copyAsync(seam(op.grants[i])->slot(op.offsets[i]), host, bytes, ctx.s());
  }
  Status rec = recordOutputs(op, ctx.s());
  return st.isOk() ? rec : st;
}

}  // namespace

GpuInventory gpuInventory() {
  GpuInventory inv;
  gpu::DeviceApi* api = gpu::deviceApi();
  if (api == nullptr) {
    inv.none_reason = "built without CUDA";
    return inv;
  }
  auto n = api->deviceCount();
  if (!n.isOk()) {
    inv.none_reason = n.status().message();
    return inv;
  }
  inv.count = *n;
  for (int i = 0; i < inv.count; ++i) inv.mps_client.push_back(api->mpsClient(i));
  return inv;
}

std::unique_ptr<DeviceRuntime> DeviceRuntime::create() {
  return std::make_unique<SeamDeviceRuntime>();
}

}  // namespace kolo
