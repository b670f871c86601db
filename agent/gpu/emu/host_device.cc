// The device seam's host emulation (device_api.h; docs/gpu.md, "The host
// emulation"): KOLO_DEVICE_EMU_GPUS emulated GPUs (host_gpus.h) whose memory is host memory
// registered as "device" (arenas are memfds shared across processes, test buffers are anonymous
// mappings), copies and reductions run on the streams' FIFO workers (the reduction through
// common/reduce, the CPU path's own code), events as host_event.h says, faults as host_faults.h
// says.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "agent/gpu/device_api.h"
#include "agent/gpu/emu/host_event.h"
#include "agent/gpu/emu/host_faults.h"
#include "agent/gpu/emu/host_gpus.h"
#include "agent/gpu/emu/host_stream.h"
#include "common/log.h"
#include "common/reduce.h"

namespace kolo::gpu::emu {

namespace {

constexpr size_t kGranularity = 2u << 20;  // as the VMM arenas

// Address ranges: the fake device heaps (each tagged with its device) and
// the pinned host buffers (copies to and from them stay asynchronous).
struct Ranges {
  std::mutex mu;
  std::map<uintptr_t, std::pair<size_t, int>> ranges;  // base -> bytes, device
  void add(void* p, size_t n, int device = -1) {
    std::lock_guard<std::mutex> lock(mu);
    ranges[reinterpret_cast<uintptr_t>(p)] = {n, device};
  }
  void remove(void* p) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.erase(reinterpret_cast<uintptr_t>(p));
  }
  // The range's device (-1 for pinned memory), or -2 when `p` is in none.
  int deviceOf(const void* p) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = ranges.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == ranges.begin()) return -2;
    --it;
    return reinterpret_cast<uintptr_t>(p) < it->first + it->second.first ? it->second.second : -2;
  }
  bool contains(const void* p) { return deviceOf(p) != -2; }
};
Ranges& heaps() {
  static Ranges* h = new Ranges;  // used until exit
  return *h;
}
Ranges& pinnedRanges() {
  static Ranges* h = new Ranges;
  return *h;
}
void registerHeap(void* p, size_t n, int device) { heaps().add(p, n, device); }
void unregisterHeap(void* p) { heaps().remove(p); }
bool inHeap(const void* p) { return heaps().contains(p); }
bool pinned(const void* p) { return pinnedRanges().contains(p); }

class HostPinned final : public DevHostBuffer {
 public:
  HostPinned(void* p, size_t n) : p_(p), n_(n) { pinnedRanges().add(p_, n_); }
  ~HostPinned() override {
    pinnedRanges().remove(p_);
    ::munmap(p_, n_);
  }
  void* data() const override { return p_; }
  size_t size() const override { return n_; }

 private:
  void* p_;
  size_t n_;
};

Status refuseOnLoopThread() {
  if (!onLoopThread()) return okStatus();
  log::get("device")->critical("a blocking device call on the agent's loop thread (a bug)");
  return internalError(
      "the host emulation refuses a blocking device call on the agent's loop thread");
}

class HostArena final : public DevArena {
 public:
  HostArena(UniqueFd fd, void* p, size_t n, int device) : fd_(std::move(fd)), p_(p), n_(n) {
    registerHeap(p_, n_, device);
  }
  ~HostArena() override {
    unregisterHeap(p_);
    ::munmap(p_, n_);
  }
  void* data() const override { return p_; }
  size_t size() const override { return n_; }
  StatusOr<UniqueFd> exportFd() const override {
    if (!fd_.valid()) return internalError("an imported device arena is not exported again");
    int d = ::dup(fd_.get());
    if (d < 0) return internalError("dup of the emulated device arena failed");
    return UniqueFd(d);
  }

 private:
  UniqueFd fd_;
  void* p_;
  size_t n_;
};

class HostStreamOwner final : public DevStream {
 public:
  explicit HostStreamOwner(int device) { tagStream(&s_, device); }
  ~HostStreamOwner() override { untagStream(&s_); }
  void* get() const override { return const_cast<HostStream*>(&s_); }

 private:
  HostStream s_;
};

// Runs `task` on `stream` after the injected delay.
void enqueueTask(void* stream, std::function<void()> task) {
  const int64_t delay = faults().delay_us;
  HostStream::of(stream)->enqueue([delay, task = std::move(task)](const std::atomic<bool>&) {
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    task();
  });
}

// A kernel on the stream's device reads or writes another device's memory
// only with peer access enabled (else CUDA faults: refused here).
template <typename P>
Status checkPeerReach(P const* ptrs, int n, void* stream) {
  const int on = streamDevice(stream);
  for (int i = 0; i < n; ++i) {
    const int dev = heaps().deviceOf(ptrs[i]);
    if (dev >= 0 && dev != on && !peerEnabled(on, dev)) {
      return invalidArgument("launchReduce on device " + std::to_string(on) + " touches device " +
                             std::to_string(dev) +
                             "'s memory without peer access (cudaDeviceEnablePeerAccess): "
                             "cudaErrorIllegalAddress");
    }
  }
  return okStatus();
}

class HostDeviceApi final : public DeviceApi {
 public:
  const char* name() const override { return "host-emulated"; }
  StatusOr<int> deviceCount() override {
    RETURN_IF_ERROR(emuGpus().status());
    return emuGpus()->count;
  }
  Status validDevice(int d) {
    RETURN_IF_ERROR(stickyError());
    ASSIGN_OR_RETURN(int n, deviceCount());
    if (d < 0 || d >= n) {
      return invalidArgument("cudaSetDevice: cudaErrorInvalidDevice: device " + std::to_string(d) +
                             " is not one of the emulation's " + std::to_string(n) +
                             " (KOLO_DEVICE_EMU_GPUS)");
    }
    return okStatus();
  }
  Status setDevice(int d) override {
    RETURN_IF_ERROR(validDevice(d));
    setCurrentDevice(d);
    return okStatus();
  }
  StatusOr<int> currentDevice() override { return emu::currentDevice(); }
  StatusOr<std::string> deviceUuid(int d) override {
    ASSIGN_OR_RETURN(int n, deviceCount());
    if (d < 0 || d >= n)
      return invalidArgument("cudaGetDeviceProperties: cudaErrorInvalidDevice: device " +
                             std::to_string(d));
    std::string u = "kolo-emu-gpu-" + std::to_string(d);
    u.resize(16, '\0');
    return u;
  }
  StatusOr<bool> canAccessPeer(int device, int peer) override {
    ASSIGN_OR_RETURN(int n, deviceCount());
    if (device < 0 || device >= n || peer < 0 || peer >= n)
      return invalidArgument("cudaDeviceCanAccessPeer: cudaErrorInvalidDevice");
    return device != peer && emuGpus()->p2p;
  }
  Status enablePeerAccess(int device, int peer) override {
    ASSIGN_OR_RETURN(bool can, canAccessPeer(device, peer));
    if (!can) {
      return unavailable("cudaDeviceEnablePeerAccess: cudaErrorPeerAccessUnsupported: device " +
                         std::to_string(device) + " cannot access device " + std::to_string(peer) +
                         " (KOLO_DEVICE_EMU_P2P=none)");
    }
    enablePeer(device, peer);
    return okStatus();
  }
  StatusOr<std::unique_ptr<DevStream>> createStream() override {
    RETURN_IF_ERROR(stickyError());
    return std::unique_ptr<DevStream>(std::make_unique<HostStreamOwner>(emu::currentDevice()));
  }
  StatusOr<std::unique_ptr<DevEvent>> createEvent(bool ipc) override {
    return createHostEvent(ipc);
  }
  StatusOr<std::unique_ptr<DevEvent>> openEvent(const IpcEventBytes& h) override {
    return openHostEvent(h);
  }

  StatusOr<std::unique_ptr<DevArena>> createArena(int device, size_t min_bytes) override {
    RETURN_IF_ERROR(validDevice(device));
    const size_t n =
        (std::max<size_t>(min_bytes, 1) + kGranularity - 1) / kGranularity * kGranularity;
    UniqueFd fd(::memfd_create("kolo-emu-device-arena", MFD_CLOEXEC));
    if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(n)) != 0) {
      return unavailable(
          "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY: the emulated device arena (memfd) of " +
          std::to_string(n) + " bytes");
    }
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED)
      return unavailable("cuMemMap: CUDA_ERROR_OUT_OF_MEMORY: mapping the emulated arena");
    return std::unique_ptr<DevArena>(std::make_unique<HostArena>(std::move(fd), p, n, device));
  }
  StatusOr<std::unique_ptr<DevArena>> importArena(int fd, size_t bytes, int device) override {
    RETURN_IF_ERROR(validDevice(device));
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      return invalidArgument(
          "cuMemImportFromShareableHandle: the emulated arena fd cannot be mapped");
    return std::unique_ptr<DevArena>(std::make_unique<HostArena>(UniqueFd(), p, bytes, device));
  }

  Status copyAsync(void* dst, const void* src, size_t bytes, void* stream) override {
    RETURN_IF_ERROR(stickyError());
    if (bytes == 0) return okStatus();
    if (!inHeap(src) && !pinned(src)) {
      // CUDA stages pageable host memory at enqueue time: the caller may
      // reuse the source once the call returns.
      auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
      enqueueTask(stream, [dst, copy] { std::memcpy(dst, copy->data(), copy->size()); });
      return okStatus();
    }
    if (!inHeap(dst) && !pinned(dst)) {
      // Into pageable host memory CUDA returns only once the copy is done,
      // however long the stream takes to reach it.
      RETURN_IF_ERROR(refuseOnLoopThread());
      auto done = std::make_shared<std::promise<void>>();
      auto f = done->get_future();
      enqueueTask(stream, [dst, src, bytes, done] {
        std::memmove(dst, src, bytes);
        done->set_value();
      });
      f.wait();
      return okStatus();
    }
    enqueueTask(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
    return okStatus();
  }
  StatusOr<std::unique_ptr<DevHostBuffer>> allocPinned(size_t bytes) override {
    const size_t n = std::max<size_t>(bytes, 1);
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return unavailable("cudaHostAlloc: cudaErrorMemoryAllocation: emulated pinned memory");
    return std::unique_ptr<DevHostBuffer>(std::make_unique<HostPinned>(p, n));
  }

  Status launchReduce(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                      void* const* dsts, int ndst, size_t count, double pre, double post,
                      void* stream) override {
    RETURN_IF_ERROR(stickyError());
    if (faults().sticky) setStickyError();
    if (faults().fail_launch) return injectedLaunchFailure();
    if (nsrc < 1 || nsrc > kMaxDeviceSources || ndst < 1 || ndst > kMaxDeviceOutputs) {
      return invalidArgument("launchReduce: " + std::to_string(nsrc) + " sources and " +
                             std::to_string(ndst) + " outputs (1.." +
                             std::to_string(kMaxDeviceSources) + " and 1.." +
                             std::to_string(kMaxDeviceOutputs) + ")");
    }
    RETURN_IF_ERROR(checkPeerReach(srcs, nsrc, stream));
    RETURN_IF_ERROR(checkPeerReach(dsts, ndst, stream));
    std::vector<const void*> s(srcs, srcs + nsrc);
    std::vector<void*> d(dsts, dsts + ndst);
    enqueueTask(stream,
                [=] { reduceBlocks(dtype, op, s.data(), nsrc, d.data(), ndst, count, pre, post); });
    return okStatus();
  }

  // The kernel's launches as planBatchedCopy cuts them, each one task on
  // the stream (its items copied in order, as one launch's blocks finish
  // before the next launch starts).
  StatusOr<int> batchedCopy(const CopySegment* segs, size_t n, void* stream) override {
    RETURN_IF_ERROR(stickyError());
    ASSIGN_OR_RETURN(auto launches,
                     planBatchedCopy(std::vector<CopySegment>(segs, segs + n),
                                     kDefaultCopyChunkBytes, kMaxCopyItemsPerLaunch));
    if (launches.empty()) return 0;
    if (faults().fail_launch) return injectedLaunchFailure();
    for (const CopyLaunch& l : launches) {
      for (const CopyItem& it : l.items) {
        if (!inHeap(reinterpret_cast<const void*>(it.src)) ||
            !inHeap(reinterpret_cast<void*>(it.dst))) {
          return invalidArgument(
              "batchedCopy: cudaErrorIllegalAddress: a segment outside device memory (the host "
              "emulation checks every item's source and destination)");
        }
      }
    }
    for (CopyLaunch& l : launches) {
      enqueueTask(stream, [items = std::move(l.items)] {
        for (const CopyItem& it : items) {
          std::memcpy(reinterpret_cast<void*>(it.dst), reinterpret_cast<const void*>(it.src),
                      it.bytes);
        }
      });
    }
    return static_cast<int>(launches.size());
  }

  PointerInfo pointerInfo(const void* p) override {
    PointerInfo info;
    const int dev = p != nullptr ? heaps().deviceOf(p) : -2;
    if (dev >= 0) {
      info.device = true;
      info.ordinal = dev;
    }
    return info;
  }

  StatusOr<void*> allocDevice(size_t bytes) override {
    RETURN_IF_ERROR(stickyError());
    const size_t n = std::max<size_t>(bytes, 1);
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return unavailable("cudaMalloc: cudaErrorMemoryAllocation: emulated device memory");
    registerHeap(p, n, emu::currentDevice());
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = n;
    return p;
  }
  void freeDevice(void* p) override {
    HostStream::synchronizeAll(10'000);  // cudaFree synchronises the device
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(p);
      if (it == sizes_.end()) return;
      n = it->second;
      sizes_.erase(it);
    }
    unregisterHeap(p);
    ::munmap(p, n);
  }
  Status streamSynchronize(void* stream, int64_t timeout_ms) override {
    RETURN_IF_ERROR(stickyError());
    RETURN_IF_ERROR(refuseOnLoopThread());
    return HostStream::of(stream)->synchronize(timeout_ms);
  }

 private:
  std::mutex mu_;
  std::map<void*, size_t> sizes_;
};

}  // namespace

}  // namespace kolo::gpu::emu

namespace kolo::gpu {
std::unique_ptr<DeviceApi> makeHostDeviceApi() { return std::make_unique<emu::HostDeviceApi>(); }
}  // namespace kolo::gpu
