// DeviceRuntime with CUDA (docs/gpu.md, "The device data path").
#include <cuda_runtime_api.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "agent/core/device_runtime.h"
#include "agent/gpu/cuda_status.h"
#include "agent/gpu/device.h"
#include "agent/gpu/device_ipc.h"
#include "agent/gpu/mps_probe.h"
#include "agent/gpu/reduce.h"
#include "agent/gpu/vmm_arena.h"
#include "common/log.h"

namespace kolo {

namespace {

constexpr int64_t kDrainTimeoutMs = 10'000;

auto devLog() { return log::get("agent.device"); }

// One GPU's agent stream (every device op on that GPU runs on it, in order).
struct DeviceCtx {
  int device = 0;
  gpu::Stream stream;
};

class CudaGrant final : public DeviceGrant {
 public:
  ~CudaGrant() override {
    // No kernel may still read the arena when it is unmapped.
    if (ctx_ && ctx_->stream.get() != nullptr) {
      (void)gpu::setDevice(ctx_->device);
      Status s = ctx_->stream.synchronize(kDrainTimeoutMs);
      if (!s.isOk()) devLog()->warn("dropping a device arena: the agent stream did not drain: {}", s.message());
    }
  }
  uint64_t bytes() const override { return arena_->size(); }
  uint32_t events() const override { return static_cast<uint32_t>(in_.size()); }
  int device() const override { return ctx_->device; }
  StatusOr<UniqueFd> exportFd() const override { return arena_->exportFd(); }
  const std::string& agentEvents() const override { return agent_events_; }

  std::shared_ptr<DeviceCtx> ctx_;
  std::unique_ptr<gpu::DeviceArena> arena_;
  std::vector<gpu::InterprocessEvent> in_;   // the client's, opened here
  std::vector<gpu::InterprocessEvent> out_;  // ours, exported
  std::string agent_events_;
};

class CudaDeviceRuntime final : public DeviceRuntime {
 public:
  StatusOr<std::shared_ptr<DeviceGrant>> grant(uint64_t bytes, int cuda_device, const std::string& gpu_uuid,
                                               const std::string& client_events) override {
    ASSIGN_OR_RETURN(int n, gpu::deviceCount());
    ASSIGN_OR_RETURN(uint32_t nevents, gpu::countEventHandles(client_events.size()));
    int dev = -1;
    if (gpu_uuid.size() == sizeof(cudaUUID_t)) {
      for (int i = 0; i < n && dev < 0; ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) == cudaSuccess &&
            std::memcmp(prop.uuid.bytes, gpu_uuid.data(), sizeof(cudaUUID_t)) == 0) {
          dev = i;
        }
      }
      if (dev < 0) return unavailable("the trainer's GPU (by UUID) is not visible to the kolo agent");
    } else {
      if (cuda_device < 0 || cuda_device >= n) {
        return invalidArgument("CUDA device " + std::to_string(cuda_device) + " is not one of the agent's " +
                               std::to_string(n));
      }
      dev = cuda_device;
    }
    RETURN_IF_ERROR(gpu::setDevice(dev));
    auto g = std::make_shared<CudaGrant>();
    ASSIGN_OR_RETURN(g->ctx_, ctxFor(dev));
    ASSIGN_OR_RETURN(g->arena_, gpu::DeviceArena::create(dev, bytes));
    for (uint32_t i = 0; i < nevents; ++i) {
      gpu::IpcEventHandleBytes h;
      std::memcpy(h.data(), client_events.data() + i * h.size(), h.size());
      ASSIGN_OR_RETURN(gpu::InterprocessEvent e, gpu::InterprocessEvent::open(h));
      g->in_.push_back(std::move(e));
      ASSIGN_OR_RETURN(gpu::InterprocessEvent o, gpu::InterprocessEvent::create());
      ASSIGN_OR_RETURN(gpu::IpcEventHandleBytes oh, o.exportHandle());
      g->agent_events_.append(reinterpret_cast<const char*>(oh.data()), oh.size());
      g->out_.push_back(std::move(o));
    }
    return std::shared_ptr<DeviceGrant>(std::move(g));
  }

  Status stageToHost(const DeviceLocalOp& op, void* host, int64_t timeout_ms) override {
    std::vector<void*> slots;
    ASSIGN_OR_RETURN(DeviceCtx * ctx, waitInputs(op, &slots));
    cudaStream_t s = ctx->stream.get();
    const size_t bytes = op.count * dataTypeSize(op.dtype);
    if (bytes > 0) {
      const void* src = nullptr;
      if (!op.broadcast) {
        RETURN_IF_ERROR(gpu::launchReduce(op.dtype, op.op, slots.data(), static_cast<int>(slots.size()), slots.data(),
                                          1, op.count, op.prescale, 1.0, s));
        src = slots[0];
      } else if (op.broadcast_root >= 0 && op.broadcast_root < static_cast<int>(slots.size())) {
        src = slots[op.broadcast_root];
      }
      if (src != nullptr) {
        KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, s));
        // Wait for this copy only (not for later work on the stream).
        ASSIGN_OR_RETURN(gpu::Event done, gpu::Event::create());
        RETURN_IF_ERROR(done.record(s));
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
          Status q = done.query();
          if (q.code() != Code::kInProgress) return q;
          if (std::chrono::steady_clock::now() >= deadline) {
            return timedOut("staging a device tensor to the host: the copy did not finish within " +
                            std::to_string(timeout_ms / 1000) + " s (a trainer's stream never reached the copy-in?)");
          }
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
    }
    return okStatus();
  }

  Status stageFromHost(const DeviceLocalOp& op, const void* host) override {
    if (op.grants.empty()) return internalError("device op without ranks");
    DeviceCtx& ctx = *static_cast<CudaGrant*>(op.grants[0])->ctx_;
    RETURN_IF_ERROR(gpu::setDevice(ctx.device));
    cudaStream_t s = ctx.stream.get();
    const size_t bytes = op.count * dataTypeSize(op.dtype);
    for (size_t i = 0; i < op.grants.size(); ++i) {
      auto* g = static_cast<CudaGrant*>(op.grants[i]);
      if (bytes > 0) {
        KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(g->arena_->data()) + op.offsets[i], host, bytes,
                                                  cudaMemcpyHostToDevice, s));
      }
    }
    for (size_t i = 0; i < op.grants.size(); ++i) {
      RETURN_IF_ERROR(static_cast<CudaGrant*>(op.grants[i])->out_.at(op.events[i]).record(s));
    }
    return okStatus();
  }

  Status enqueueLocal(const DeviceLocalOp& op) override {
    std::vector<void*> slots;
    ASSIGN_OR_RETURN(DeviceCtx * ctxp, waitInputs(op, &slots));
    const size_t k = slots.size();
    cudaStream_t s = ctxp->stream.get();
    const size_t bytes = op.count * dataTypeSize(op.dtype);
    if (op.broadcast && (op.broadcast_root < 0 || op.broadcast_root >= static_cast<int>(k))) {
      return internalError("broadcast root is not a local rank");
    }
    if (bytes > 0) {
      if (op.broadcast) {
        for (size_t i = 0; i < k; ++i) {
          if (static_cast<int>(i) == op.broadcast_root) continue;
          KOLO_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(slots[i], slots[op.broadcast_root], bytes, cudaMemcpyDeviceToDevice, s));
        }
      } else {
        const int nd = static_cast<int>(std::min<size_t>(k, gpu::kMaxReduceOutputs));
        RETURN_IF_ERROR(gpu::launchReduce(op.dtype, op.op, slots.data(), static_cast<int>(k), slots.data(), nd,
                                          op.count, op.prescale, op.postscale, s));
        for (size_t i = static_cast<size_t>(nd); i < k; ++i) {
          KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slots[i], slots[0], bytes, cudaMemcpyDeviceToDevice, s));
        }
      }
    }
    for (size_t i = 0; i < k; ++i) {
      RETURN_IF_ERROR(static_cast<CudaGrant*>(op.grants[i])->out_.at(op.events[i]).record(s));
    }
    return okStatus();
  }

 private:
  // The agent stream of the op's GPU, made to wait for every rank's
  // in_ready; `slots` receives the ranks' slot addresses (agent mapping).
  StatusOr<DeviceCtx*> waitInputs(const DeviceLocalOp& op, std::vector<void*>* slots) {
    const size_t k = op.grants.size();
    if (k == 0 || op.offsets.size() != k || op.events.size() != k) return internalError("device op without ranks");
    if (k > static_cast<size_t>(gpu::kMaxReduceSources)) {
      return invalidArgument("device tensors of " + std::to_string(k) + " ranks on one GPU: at most " +
                             std::to_string(gpu::kMaxReduceSources) + " are wired");
    }
    DeviceCtx* ctx = static_cast<CudaGrant*>(op.grants[0])->ctx_.get();
    RETURN_IF_ERROR(gpu::setDevice(ctx->device));
    slots->resize(k);
    for (size_t i = 0; i < k; ++i) {
      auto* g = static_cast<CudaGrant*>(op.grants[i]);
      if (g->ctx_.get() != ctx) return internalError("device op over two GPUs");
      RETURN_IF_ERROR(g->in_.at(op.events[i]).streamWait(ctx->stream.get()));
      (*slots)[i] = static_cast<char*>(g->arena_->data()) + op.offsets[i];
    }
    return ctx;
  }

  StatusOr<std::shared_ptr<DeviceCtx>> ctxFor(int dev) {
    auto& c = ctxs_[dev];
    if (!c) {
      auto ctx = std::make_shared<DeviceCtx>();
      ctx->device = dev;
      ASSIGN_OR_RETURN(ctx->stream, gpu::Stream::create());
      c = std::move(ctx);
      devLog()->info("device path: agent stream on CUDA device {}", dev);
      // The agent works on the trainers' GPU from another process: without
      // MPS the GPU switches contexts between them for every op (measured
      // on an H200: 287 us per small allreduce with one trainer, 740 us with
      // four; 24-47 us under MPS; docs/gpu.md).
      const std::string pipe = gpu::defaultMpsPipeDirectory();
      struct stat st {};
      if (::stat((pipe + "/control").c_str(), &st) != 0) {
        devLog()->warn(
            "device path: CUDA MPS does not seem to run (no {}/control): every device op will switch GPU "
            "contexts between the trainer and the agent, about 250 us each; start nvidia-cuda-mps-control -d "
            "for the agent and the trainers (docs/gpu.md, \"CUDA MPS\")",
            pipe);
      }
    }
    return c;
  }

  std::map<int, std::shared_ptr<DeviceCtx>> ctxs_;
};

}  // namespace

GpuInventory gpuInventory() {
  GpuInventory inv;
  auto n = gpu::deviceCount();
  if (!n.isOk()) {
    inv.none_reason = n.status().message();
    return inv;
  }
  inv.count = *n;
  for (int i = 0; i < inv.count; ++i) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, i) == cudaSuccess) {
      inv.mps_client.push_back(v != 0 ? 1 : 0);
    } else {
      (void)cudaGetLastError();  // a driver without the attribute: not this thread's later error
      inv.mps_client.push_back(-1);
    }
  }
  return inv;
}

std::unique_ptr<DeviceRuntime> DeviceRuntime::create() { return std::make_unique<CudaDeviceRuntime>(); }

}  // namespace kolo
