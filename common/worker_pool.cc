#include "common/worker_pool.h"

#include "common/log.h"

namespace kolo {

WorkerPool::WorkerPool(std::string name, int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, name, i] {
      log::setThreadName(name + "-" + std::to_string(i));
      for (;;) {
        std::function<void()> t;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
          if (stop_ && tasks_.empty()) return;
          t = std::move(tasks_.front());
          tasks_.pop_front();
        }
        t();
      }
    });
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

}  // namespace kolo
