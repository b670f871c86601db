#include "agent/gpu/emu/host_stream.h"

#include <chrono>
#include <set>

#include "common/log.h"

namespace kolo::gpu::emu {

namespace {
struct Registry {
  std::mutex mu;
  std::set<HostStream*> live;
};
Registry& registry() {
  static Registry* r = new Registry;  // used until exit
  return *r;
}
}  // namespace

HostStream::HostStream() : worker_([this] { run(); }) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().live.insert(this);
}

void HostStream::synchronizeAll(int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(registry().mu);
  for (HostStream* s : registry().live) (void)s->synchronize(timeout_ms);
}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live.erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void HostStream::enqueue(Task t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(t));
    ++enqueued_;
  }
  cv_.notify_all();
}

bool HostStream::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ == enqueued_;
}

Status HostStream::synchronize(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = enqueued_;
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_ >= target; })) {
    return timedOut("the emulated device stream was not done after " + std::to_string(timeout_ms) +
                    " ms");
  }
  return okStatus();
}

void HostStream::run() {
  log::setThreadName("emu-stream");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
    if (stop_) return;
    Task t = std::move(q_.front());
    q_.pop_front();
    lock.unlock();
    t(stop_);
    lock.lock();
    ++done_;
    cv_.notify_all();
  }
}

HostStream* HostStream::of(void* stream) {
  if (stream != nullptr) return static_cast<HostStream*>(stream);
  static HostStream* legacy = new HostStream;  // used until exit
  return legacy;
}

}  // namespace kolo::gpu::emu
