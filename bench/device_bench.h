// kolo-bench --device cuda|host-emulated (docs/bench-tools.md, docs/gpu.md
// "kolo-bench --device"): the device half of kolo-bench. The buffers are
// device memory on the device seam (agent/gpu/device_api.h): user memory
// (allocDevice, i.e. cudaMalloc) or, with --zero-copy, kolo_device_alloc
// buffers in the rank's device arena; every collective runs on one stream
// named with kolo_set_stream, and each timed operation ends with a stream
// synchronize, so its time includes the device work. The check data are
// written and read through host mirrors (upload/download, outside the timed
// region).
//
// The seam instance is this process's (kolo-bench links libkolo statically
// for this: the host emulation's device memory is known to its own
// instance only). host-emulated is the test emulation: its times are the
// CPU's, never GPU figures, and kolo-bench says so in its output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace kolo::bench {

class DeviceBench {
 public:
  // Before kolo_init: selects the seam (`kind`: cuda | host-emulated) in
  // this process and for libkolo (KOLO_DEVICE), and asks for a device arena
  // (KOLO_DEVICE_ARENA_MB, unless set) that holds `buffer_bytes` of
  // kolo_device_alloc buffers (zero copy) and the staging slots.
  static StatusOr<std::unique_ptr<DeviceBench>> prepare(const std::string& kind,
                                                        uint64_t buffer_bytes, bool zero_copy);
  // After kolo_init: the rank has a device arena (else the reason and what
  // to start the agent with), a stream, and kolo_set_stream names it.
  Status attach();
  ~DeviceBench();

  StatusOr<void*> alloc(uint64_t bytes);  // freed by the destructor
  Status upload(void* dst, const void* src, uint64_t bytes);
  Status download(void* dst, const void* src, uint64_t bytes);
  // Waits (bounded: 600 s) for the stream.
  Status sync();

  bool emulated() const { return kind_ == "host-emulated"; }
  bool zeroCopy() const { return zero_copy_; }
  // "cuda device 0, zero copy (kolo_device_alloc), device arena 1088 MiB".
  std::string describe() const;
  // What rank 0 prints first and last under the emulation.
  static const char* emulationWarning();

  // KoloSession's copy of a library-owned (device) allgather / alltoall result.
  static Status copyResult(void* dst, const void* src, uint64_t bytes);

 private:
  DeviceBench() = default;
  std::string kind_;
  bool zero_copy_ = false;
  uint64_t arena_mb_ = 0;
  int device_ = -1;
  void* stream_ = nullptr;
  struct Holder;
  std::unique_ptr<Holder> holder_;  // the stream object
  std::vector<void*> buffers_;
};

}  // namespace kolo::bench
