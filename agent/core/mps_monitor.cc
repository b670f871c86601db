#include "agent/core/mps_monitor.h"

#include "common/log.h"

namespace kolo {

namespace {
auto mpsLog() { return log::get("agent.mps"); }
}  // namespace

MpsMonitor::MpsMonitor(std::string pipe_dir, metrics::Registry* metrics,
                       std::chrono::milliseconds period)
    : pipe_dir_(std::move(pipe_dir)), metrics_(metrics), period_(period) {
  snap_.mps.pipe_dir = pipe_dir_;
  snap_.mps.reason = "not probed yet";
  thread_ = std::thread([this] { run(); });
}

MpsMonitor::~MpsMonitor() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

MpsMonitor::Snapshot MpsMonitor::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  return snap_;
}

void MpsMonitor::publish(const gpu::MpsProbe& p, const GpuInventory& inv) {
  if (metrics_ == nullptr) return;
  const char* help =
      "1 while the CUDA MPS control daemon accepts connections on the agent's pipe directory, 0 "
      "when it is "
      "down or did not answer; per GPU the agent serves (gpu=\"none\": an agent without a GPU)";
  const double v = p.state == gpu::MpsState::kUp ? 1 : 0;
  if (inv.count == 0) {
    metrics_->gauge("kolo_mps_up", help, {{"gpu", "none"}}).set(v);
    return;
  }
  for (int i = 0; i < inv.count; ++i)
    metrics_->gauge("kolo_mps_up", help, {{"gpu", std::to_string(i)}}).set(v);
}

void MpsMonitor::run() {
  log::setThreadName("agent-mps");
  const GpuInventory inv = gpuInventory();
  gpu::MpsState last = gpu::MpsState::kUnknown;
  bool first = true;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    lk.unlock();
    gpu::MpsProbe p = gpu::probeMps(pipe_dir_);
    if (first || p.state != last) {
      if (p.state == gpu::MpsState::kUp) {
        mpsLog()->info("CUDA MPS is up (pipe directory {})", p.pipe_dir);
      } else if (inv.count > 0) {
        // A GPU node without MPS: every device op switches GPU contexts.
        mpsLog()->warn("CUDA MPS is {}: {} (docs/gpu.md, \"CUDA MPS\")", gpu::mpsStateName(p.state),
                       p.reason);
      } else {
        mpsLog()->debug("CUDA MPS is {}: {} (no GPU here)", gpu::mpsStateName(p.state), p.reason);
      }
      first = false;
      last = p.state;
    }
    publish(p, inv);
    lk.lock();
    snap_.probed = true;
    snap_.mps = std::move(p);
    snap_.gpus = inv;
    cv_.wait_for(lk, period_, [this] { return stop_; });
  }
}

}  // namespace kolo
