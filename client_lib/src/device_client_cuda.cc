// DeviceClient with CUDA (see device_client.h and docs/gpu.md).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "agent/gpu/cuda_status.h"
#include "agent/gpu/device.h"
#include "agent/gpu/device_ipc.h"
#include "agent/gpu/vmm_arena.h"
#include "arena_allocator.h"
#include "device_client.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {

constexpr uint32_t kEventPairs = kMaxDeviceEvents;

// Makes `device` current on this (the caller's) thread for the scope and
// restores the caller's device after: libkolo must not move a trainer's
// thread to another GPU behind its back.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) st_ = gpu::cudaStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (prev_ >= 0 && st_.isOk()) (void)cudaSetDevice(prev_);
  }
  const Status& status() const { return st_; }

 private:
  int prev_ = -1;
  Status st_;
};

class CudaDeviceClient final : public DeviceClient {
 public:
  CudaDeviceClient() {
    auto b = parseDeviceArenaMb(std::getenv("KOLO_DEVICE_ARENA_MB"));
    if (!b.isOk()) {
      asked_ = true;
      why_ = b.status().message();
    } else {
      bytes_ = *b;
      asked_ = bytes_ > 0;
      why_ = asked_ ? "the kolo agent did not answer the request for a device arena"
                    : "this process asked for none: set KOLO_DEVICE_ARENA_MB before kolo_init";
    }
  }

  ~CudaDeviceClient() override {
    // Our copies may still run on the callers' streams: let them finish
    // (bounded) before the arena is unmapped.
    if (arena_) {
      DeviceScope scope(device_);
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      auto pending = [](const gpu::Event& e) { return e.query().code() == Code::kInProgress; };
      for (size_t i = 0; i < done_.size(); ++i) {  // copy-ins (in_) and copy-outs (done_)
        while ((pending(done_[i]) || pending(in_[i])) && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
    }
  }

  void prepareHello(ipc::Hello* h) override {
    if (!asked_ || bytes_ == 0) return;
    Status st = createEvents(h);
    if (!st.isOk()) {
      why_ = "this process cannot use the device path: " + st.message();
      in_.clear();
      return;
    }
    h->set_device_arena_bytes(bytes_);
  }

  void attach(const ipc::Welcome& w, UniqueFd fd) override {
    if (in_.empty()) return;
    if (w.device_arena_bytes() == 0 || !fd.valid()) {
      why_ = w.device_error().empty() ? "the kolo agent granted no device arena" : w.device_error();
      return;
    }
    Status st = importArena(w, fd.get());
    if (!st.isOk()) {
      why_ = "mapping the device arena from the kolo agent failed: " + st.message();
      arena_.reset();
      out_.clear();
      return;
    }
    alloc_ = std::make_unique<ArenaAllocator>(0, arena_->size());
  }

  bool asked() const override { return asked_; }
  bool ready() const override { return alloc_ != nullptr; }
  std::string why() const override { return why_; }

  bool isDevicePointer(const void* p) override {
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  int pointerDevice(const void* p) override {
    cudaPointerAttributes a{};
    if (p == nullptr || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    // Managed memory migrates: any device may read it.
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
  }

  int device() const override { return ready() ? device_ : -1; }

  StatusOr<Staged> stageIn(const void* src, uint64_t bytes, void* stream, Clock::time_point deadline) override {
    if (!ready()) return unavailable(why_);
    DeviceScope scope(device_);
    RETURN_IF_ERROR(scope.status());
    if (bytes > alloc_->capacity()) {
      return invalidArgument("its " + std::to_string(bytes) + " bytes are more than the whole device arena (" +
                             std::to_string(alloc_->capacity()) + " bytes); raise KOLO_DEVICE_ARENA_MB");
    }
    Staged s;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        sweepLocked();
        auto e = pool_.acquire();
        if (e) {
          auto off = alloc_->allocate(bytes);
          if (off) {
            s.offset = *off;
            s.event = *e;
            break;
          }
          pool_.release(*e);
          if (retiring_.empty()) {
            return Status(Code::kInProgress, "its " + std::to_string(bytes) + " bytes do not fit in the device arena (" +
                                                 std::to_string(alloc_->capacity()) + " bytes, " +
                                                 std::to_string(alloc_->usedBytes()) + " held by ops in flight)");
          }
        } else if (retiring_.empty()) {
          return Status(Code::kInProgress, "all " + std::to_string(kEventPairs) +
                                               " device event pairs are held by ops in flight");
        }
      }
      if (Clock::now() >= deadline) {
        return timedOut("waited for device arena space or an event pair until the op timeout (KOLO_OP_TIMEOUT); "
                        "the copies of earlier results are still queued on their streams");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    auto cs = static_cast<cudaStream_t>(stream);
    Status st = bytes == 0 ? okStatus()
                           : gpu::cudaStatus(cudaMemcpyAsync(static_cast<char*>(arena_->data()) + s.offset, src,
                                                             bytes, cudaMemcpyDefault, cs),
                                             "cudaMemcpyAsync");
    if (st.isOk()) st = in_[s.event].record(cs);
    if (!st.isOk()) {
      (void)finish(s, nullptr, 0, stream, false);
      return st;
    }
    return s;
  }

  Status finish(const Staged& s, void* dst, uint64_t bytes, void* stream, bool copy) override {
    DeviceScope scope(device_);
    Status st = scope.status();
    auto cs = static_cast<cudaStream_t>(stream);
    if (st.isOk() && copy && bytes > 0) {
      st = out_[s.event].streamWait(cs);
      if (st.isOk()) {
        st = gpu::cudaStatus(cudaMemcpyAsync(dst, static_cast<char*>(arena_->data()) + s.offset, bytes,
                                             cudaMemcpyDefault, cs),
                             "cudaMemcpyAsync");
      }
    }
    Status rec = done_[s.event].record(cs);
    std::lock_guard<std::mutex> lock(mu_);
    if (rec.isOk()) {
      retiring_.push_back(s);
    } else {  // cannot order the reuse: never reuse them
      leaked_ = true;
    }
    return st;
  }

 private:
  Status createEvents(ipc::Hello* h) {
    ASSIGN_OR_RETURN(int n, gpu::deviceCount());
    (void)n;
    int dev = 0;
    KOLO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    RETURN_IF_ERROR(gpu::setDevice(dev));
    device_ = dev;
    cudaDeviceProp prop{};
    KOLO_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, dev));
    h->set_cuda_device(dev);
    h->set_gpu_uuid(std::string(prop.uuid.bytes, sizeof prop.uuid.bytes));
    std::string handles;
    for (uint32_t i = 0; i < kEventPairs; ++i) {
      ASSIGN_OR_RETURN(gpu::InterprocessEvent e, gpu::InterprocessEvent::create());
      ASSIGN_OR_RETURN(gpu::IpcEventHandleBytes hb, e.exportHandle());
      handles.append(reinterpret_cast<const char*>(hb.data()), hb.size());
      in_.push_back(std::move(e));
      ASSIGN_OR_RETURN(gpu::Event d, gpu::Event::create());
      done_.push_back(std::move(d));
    }
    h->set_device_events(handles);
    return okStatus();
  }

  Status importArena(const ipc::Welcome& w, int fd) {
    ASSIGN_OR_RETURN(uint32_t n, gpu::countEventHandles(w.device_events().size()));
    if (n != in_.size()) {
      return internalError("the agent sent " + std::to_string(n) + " event handles for our " +
                           std::to_string(in_.size()));
    }
    ASSIGN_OR_RETURN(arena_, gpu::ImportedDeviceArena::import(fd, w.device_arena_bytes(), device_));
    for (uint32_t i = 0; i < n; ++i) {
      gpu::IpcEventHandleBytes hb;
      std::memcpy(hb.data(), w.device_events().data() + i * hb.size(), hb.size());
      ASSIGN_OR_RETURN(gpu::InterprocessEvent e, gpu::InterprocessEvent::open(hb));
      out_.push_back(std::move(e));
    }
    return okStatus();
  }

  // Gives back the slots and event pairs whose copy-out has passed.
  void sweepLocked() {
    while (!retiring_.empty()) {
      const Staged& s = retiring_.front();
      if (done_[s.event].query().code() == Code::kInProgress) break;
      alloc_->free(s.offset);
      pool_.release(s.event);
      retiring_.pop_front();
    }
  }

  bool asked_ = false;
  uint64_t bytes_ = 0;
  std::string why_;
  int device_ = 0;
  std::vector<gpu::InterprocessEvent> in_;   // ours, exported
  std::vector<gpu::InterprocessEvent> out_;  // the agent's, opened
  std::vector<gpu::Event> done_;             // copy-out passed, per pair
  std::unique_ptr<gpu::ImportedDeviceArena> arena_;

  std::mutex mu_;
  std::unique_ptr<ArenaAllocator> alloc_;
  gpu::EventSlotPool pool_{kEventPairs};
  std::deque<Staged> retiring_;  // in finish order
  bool leaked_ = false;
};

}  // namespace

std::unique_ptr<DeviceClient> DeviceClient::create() { return std::make_unique<CudaDeviceClient>(); }

}  // namespace kolo
