// The CUDA MPS state `kolo status` and /metrics report (docs/gpu.md, "CUDA
// MPS"): a thread of its own probes the control daemon's socket every few
// seconds (gpu::probeMps, bounded by a short connect deadline) and keeps the
// last answer, so the loop thread never waits on it. The GPUs are looked up
// once (gpuInventory). snapshot() from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "agent/core/device_runtime.h"
#include "agent/gpu/mps_probe.h"
#include "common/metrics.h"

namespace kolo {

class MpsMonitor {
 public:
  struct Snapshot {
    bool probed = false;  // false until the first probe finished
    gpu::MpsProbe mps;
    GpuInventory gpus;
  };

  // `metrics` (may be null) gets kolo_mps_up{gpu="N"} per GPU, or
  // {gpu="none"} with the node's state on an agent without a GPU.
  MpsMonitor(std::string pipe_dir, metrics::Registry* metrics,
             std::chrono::milliseconds period = std::chrono::seconds(3));
  ~MpsMonitor();
  MpsMonitor(const MpsMonitor&) = delete;
  MpsMonitor& operator=(const MpsMonitor&) = delete;

  Snapshot snapshot() const;

 private:
  void run();
  void publish(const gpu::MpsProbe& p, const GpuInventory& inv);

  const std::string pipe_dir_;
  metrics::Registry* metrics_;
  const std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Snapshot snap_;
  std::thread thread_;
};

}  // namespace kolo
