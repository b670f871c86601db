// RAII owners of CUDA runtime objects. Creation returns StatusOr; the
// destructors release and ignore errors (a dead context at exit is not
// worth a crash). All of them are move-only.
//
// InterprocessEvent orders work across processes without host sync: the
// trainer records "copy-in done" on its own stream, the agent makes its
// stream wait on the opened handle (cudaStreamWaitEvent), and the other way
// round for "result ready" before the trainer's copy-out.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"

namespace kolo::gpu {

// Makes `device` current on this thread (and creates its primary context).
Status setDevice(int device);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream() = default;
  // A non-blocking stream (does not synchronise with the legacy default stream).
  static StatusOr<Stream> create();
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return s_; }
  // Waits for the stream with a deadline by polling cudaStreamQuery; TimedOut
  // after `timeout_ms` (the work stays queued).
  Status synchronize(int64_t timeout_ms) const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  // Timing events for benchmarks (flags = cudaEventDefault) or sync-only ones.
  static StatusOr<Event> create(unsigned flags = cudaEventDisableTiming);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return e_; }
  Status record(cudaStream_t stream) const;
  // Ok when done, InProgress while pending, an error otherwise.
  Status query() const;

 protected:
  explicit Event(cudaEvent_t e) : e_(e) {}
  cudaEvent_t e_ = nullptr;
};

// The opaque 64-byte cudaIpcEventHandle_t, as bytes for a control frame.
using IpcEventHandleBytes = std::array<unsigned char, sizeof(cudaIpcEventHandle_t)>;

class InterprocessEvent : public Event {
 public:
  InterprocessEvent() = default;
  // cudaEventInterprocess | cudaEventDisableTiming on the current device.
  static StatusOr<InterprocessEvent> create();
  // Opens a handle exported by another process (not this one: CUDA refuses
  // to open its own handles).
  static StatusOr<InterprocessEvent> open(const IpcEventHandleBytes& handle);
  StatusOr<IpcEventHandleBytes> exportHandle() const;

  // Makes `stream` wait (on the device, no host sync) for the last record.
  Status streamWait(cudaStream_t stream) const;

 private:
  explicit InterprocessEvent(cudaEvent_t e) : Event(e) {}
};

}  // namespace kolo::gpu
