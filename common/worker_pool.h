// A fixed pool of named worker threads for data movement (reductions,
// copies). Work never blocks the loop: callers post a completion back to
// their loop from inside the task.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kolo {

class WorkerPool {
 public:
  WorkerPool(std::string name, int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(std::function<void()> task);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kolo
