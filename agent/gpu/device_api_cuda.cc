// The device seam's CUDA implementation: forwards to agent/gpu's CUDA
// wrappers (device.h, vmm_arena.h, reduce.h); see device_api.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

#include "agent/gpu/batched_copy.h"
#include "agent/gpu/cuda_status.h"
#include "agent/gpu/device.h"
#include "agent/gpu/device_api.h"
#include "agent/gpu/reduce.h"
#include "agent/gpu/vmm_arena.h"

namespace kolo::gpu {

namespace {

static_assert(sizeof(IpcEventBytes) == sizeof(cudaIpcEventHandle_t));
static_assert(kMaxDeviceSources == kMaxReduceSources && kMaxDeviceOutputs == kMaxReduceOutputs);

cudaStream_t cs(void* s) { return static_cast<cudaStream_t>(s); }

class CudaEvent final : public DevEvent {
 public:
  explicit CudaEvent(Event e) : plain_(std::move(e)) {}
  explicit CudaEvent(InterprocessEvent e) : ipc_(std::move(e)), is_ipc_(true) {}
  Status record(void* s) override { return ev().record(cs(s)); }
  Status query() override { return ev().query(); }
  Status streamWait(void* s) override {
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs(s), ev().get(), 0));
    return okStatus();
  }
  StatusOr<IpcEventBytes> exportHandle() override {
    if (!is_ipc_) return internalError("exporting an event that is not interprocess");
    return ipc_.exportHandle();
  }

 private:
  const Event& ev() const { return is_ipc_ ? static_cast<const Event&>(ipc_) : plain_; }
  Event plain_;
  InterprocessEvent ipc_;
  bool is_ipc_ = false;
};

class CudaStream final : public DevStream {
 public:
  explicit CudaStream(Stream s) : s_(std::move(s)) {}
  void* get() const override { return s_.get(); }

 private:
  Stream s_;
};

template <typename A>
class CudaArena final : public DevArena {
 public:
  explicit CudaArena(std::unique_ptr<A> a) : a_(std::move(a)) {}
  void* data() const override { return a_->data(); }
  size_t size() const override { return a_->size(); }
  StatusOr<UniqueFd> exportFd() const override {
    if constexpr (std::is_same_v<A, DeviceArena>) {
      return a_->exportFd();
    } else {
      return internalError("an imported device arena is not exported again");
    }
  }

 private:
  std::unique_ptr<A> a_;
};

class CudaHostBuffer final : public DevHostBuffer {
 public:
  CudaHostBuffer(void* p, size_t n) : p_(p), n_(n) {}
  ~CudaHostBuffer() override { (void)cudaFreeHost(p_); }
  void* data() const override { return p_; }
  size_t size() const override { return n_; }

 private:
  void* p_;
  size_t n_;
};

class CudaDeviceApi final : public DeviceApi {
 public:
  const char* name() const override { return "cuda"; }
  StatusOr<int> deviceCount() override { return gpu::deviceCount(); }
  Status setDevice(int d) override { return gpu::setDevice(d); }
  StatusOr<int> currentDevice() override {
    int d = 0;
    KOLO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&d));
    return d;
  }
  StatusOr<std::string> deviceUuid(int d) override {
    cudaDeviceProp prop{};
    KOLO_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    return std::string(prop.uuid.bytes, sizeof prop.uuid.bytes);
  }
  StatusOr<std::unique_ptr<DevStream>> createStream() override {
    ASSIGN_OR_RETURN(Stream s, Stream::create());
    return std::unique_ptr<DevStream>(std::make_unique<CudaStream>(std::move(s)));
  }
  StatusOr<std::unique_ptr<DevEvent>> createEvent(bool interprocess) override {
    if (interprocess) {
      ASSIGN_OR_RETURN(InterprocessEvent e, InterprocessEvent::create());
      return std::unique_ptr<DevEvent>(std::make_unique<CudaEvent>(std::move(e)));
    }
    ASSIGN_OR_RETURN(Event e, Event::create());
    return std::unique_ptr<DevEvent>(std::make_unique<CudaEvent>(std::move(e)));
  }
  StatusOr<std::unique_ptr<DevEvent>> openEvent(const IpcEventBytes& h) override {
    ASSIGN_OR_RETURN(InterprocessEvent e, InterprocessEvent::open(h));
    return std::unique_ptr<DevEvent>(std::make_unique<CudaEvent>(std::move(e)));
  }
  StatusOr<std::unique_ptr<DevArena>> createArena(int device, size_t min_bytes) override {
    ASSIGN_OR_RETURN(auto a, DeviceArena::create(device, min_bytes));
    return std::unique_ptr<DevArena>(std::make_unique<CudaArena<DeviceArena>>(std::move(a)));
  }
  StatusOr<std::unique_ptr<DevArena>> importArena(int fd, size_t bytes, int device) override {
    ASSIGN_OR_RETURN(auto a, ImportedDeviceArena::import(fd, bytes, device));
    return std::unique_ptr<DevArena>(
        std::make_unique<CudaArena<ImportedDeviceArena>>(std::move(a)));
  }
  Status copyAsync(void* dst, const void* src, size_t bytes, void* s) override {
    KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs(s)));
    return okStatus();
  }
  Status launchReduce(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                      void* const* dsts, int ndst, size_t count, double pre, double post,
                      void* s) override {
    return gpu::launchReduce(dtype, op, srcs, nsrc, dsts, ndst, count, pre, post, cs(s));
  }
  StatusOr<int> batchedCopy(const CopySegment* segs, size_t n, void* s) override {
    return gpu::batchedCopy(std::vector<CopySegment>(segs, segs + n), cs(s));
  }
  PointerInfo pointerInfo(const void* p) override {
    PointerInfo info;
    cudaPointerAttributes a{};
    if (p == nullptr || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return info;
    }
    info.device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    info.ordinal = a.type == cudaMemoryTypeDevice ? a.device : -1;  // managed memory migrates
    return info;
  }
  StatusOr<bool> canAccessPeer(int device, int peer) override {
    if (device == peer) return false;
    int v = 0;
    KOLO_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&v, device, peer));
    return v != 0;
  }
  Status enablePeerAccess(int device, int peer) override {
    RETURN_IF_ERROR(gpu::setDevice(device));
    cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return okStatus();
    }
    KOLO_CUDA_RETURN_IF_ERROR(err);
    return okStatus();
  }
  StatusOr<void*> allocDevice(size_t bytes) override {
    void* p = nullptr;
    KOLO_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    return p;
  }
  StatusOr<std::unique_ptr<DevHostBuffer>> allocPinned(size_t bytes) override {
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 1);
    KOLO_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, n, cudaHostAllocPortable));
    return std::unique_ptr<DevHostBuffer>(new CudaHostBuffer(p, n));
  }
  void freeDevice(void* p) override { (void)cudaFree(p); }
  int mpsClient(int d) override {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, d) == cudaSuccess) return v != 0 ? 1 : 0;
    (void)cudaGetLastError();  // a driver without the attribute: not this thread's later error
    return -1;
  }
  Status streamSynchronize(void* s, int64_t timeout_ms) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      cudaError_t err = cudaStreamQuery(cs(s));
      if (err == cudaSuccess) return okStatus();
      if (err != cudaErrorNotReady) return cudaStatus(err, "cudaStreamQuery");
      if (std::chrono::steady_clock::now() >= deadline) {
        return timedOut("the CUDA stream was not done after " + std::to_string(timeout_ms) + " ms");
      }
      std::this_thread::yield();
    }
  }
};

}  // namespace

std::unique_ptr<DeviceApi> makeCudaDeviceApi() { return std::make_unique<CudaDeviceApi>(); }

}  // namespace kolo::gpu
