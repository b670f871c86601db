// The host emulation's stream (docs/gpu.md, "The host emulation"): one FIFO
// worker thread per stream, as a CUDA stream runs its work in order.
// Tasks may block (an event wait); they get the stream's stop flag and
// must return soon once it is set (at destruction).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/status.h"

namespace kolo::gpu::emu {

class HostStream {
 public:
  using Task = std::function<void(const std::atomic<bool>& stop)>;
  HostStream();
  ~HostStream();
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  void enqueue(Task t);
  bool idle();
  // Waits until everything enqueued so far ran; TimedOut after `timeout_ms`.
  Status synchronize(int64_t timeout_ms);

  // nullptr (the legacy default stream) maps to one process-wide stream.
  static HostStream* of(void* stream);
  // Every live stream synchronised (bounded each), as cudaFree and
  // cudaDeviceSynchronize wait for the whole device.
  static void synchronizeAll(int64_t timeout_ms);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> q_;
  uint64_t enqueued_ = 0;
  uint64_t done_ = 0;
  std::atomic<bool> stop_{false};
  std::thread worker_;
};

}  // namespace kolo::gpu::emu
