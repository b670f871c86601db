#include "agent/gpu/device.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "agent/gpu/cuda_status.h"

namespace kolo::gpu {

Status setDevice(int device) {
  KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  KOLO_CUDA_RETURN_IF_ERROR(cudaFree(nullptr));  // creates the primary context now
  return okStatus();
}

// --- DeviceBuffer -------------------------------------------------------------

StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  KOLO_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.ptr_, bytes));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// --- Stream -------------------------------------------------------------------

StatusOr<Stream> Stream::create() {
  Stream s;
  KOLO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
  return s;
}

Stream::~Stream() {
  if (s_ != nullptr) (void)cudaStreamDestroy(s_);
}

Stream::Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

Status Stream::synchronize(int64_t timeout_ms) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const cudaError_t err = cudaStreamQuery(s_);
    if (err == cudaSuccess) return okStatus();
    if (err != cudaErrorNotReady) return cudaStatus(err, "cudaStreamQuery");
    if (std::chrono::steady_clock::now() >= deadline)
      return timedOut("CUDA stream not done after " + std::to_string(timeout_ms) + " ms");
    std::this_thread::yield();
  }
}

// --- Event --------------------------------------------------------------------

StatusOr<Event> Event::create(unsigned flags) {
  cudaEvent_t e = nullptr;
  KOLO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
  return Event(e);
}

Event::~Event() {
  if (e_ != nullptr) (void)cudaEventDestroy(e_);
}

Event::Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

Status Event::record(cudaStream_t stream) const {
  KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(e_, stream));
  return okStatus();
}

Status Event::query() const {
  const cudaError_t err = cudaEventQuery(e_);
  if (err == cudaSuccess) return okStatus();
  if (err == cudaErrorNotReady) return Status(Code::kInProgress, "CUDA event pending");
  return cudaStatus(err, "cudaEventQuery");
}

// --- InterprocessEvent --------------------------------------------------------

StatusOr<InterprocessEvent> InterprocessEvent::create() {
  cudaEvent_t e = nullptr;
  KOLO_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
  return InterprocessEvent(e);
}

StatusOr<InterprocessEvent> InterprocessEvent::open(const IpcEventHandleBytes& handle) {
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t e = nullptr;
  KOLO_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&e, h));
  return InterprocessEvent(e);
}

StatusOr<IpcEventHandleBytes> InterprocessEvent::exportHandle() const {
  cudaIpcEventHandle_t h;
  KOLO_CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&h, e_));
  IpcEventHandleBytes out;
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

Status InterprocessEvent::streamWait(cudaStream_t stream) const {
  KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, e_, 0));
  return okStatus();
}

}  // namespace kolo::gpu
