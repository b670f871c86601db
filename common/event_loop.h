// The one loop thread that owns a daemon's mutable state. Other threads
// (gRPC handlers, worker pools, coordinator client) never touch that state:
// they post() closures to the loop. Functions that may only run on the loop
// end in ...OnLoop by convention.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace kolo {

class EventLoop {
 public:
  using Clock = std::chrono::steady_clock;
  using FdCallback = std::function<void(uint32_t events)>;
  using TimerId = uint64_t;

  explicit EventLoop(std::string name);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Runs the loop on a new thread / on the calling thread until stop().
  void start();
  void run();
  // Thread-safe; returns once the loop thread has exited (if started).
  void stop();
  bool inLoop() const { return std::this_thread::get_id() == loop_thread_id_.load(); }

  // Thread-safe: runs `fn` on the loop thread soon.
  void post(std::function<void()> fn);
  // Thread-safe: runs `fn` on the loop and waits for its result up to `timeout`.
  template <typename T>
  StatusOr<T> call(std::function<T()> fn, std::chrono::milliseconds timeout) {
    if (inLoop()) return fn();
    auto p = std::make_shared<std::promise<T>>();
    auto f = p->get_future();
    post([p, fn = std::move(fn)]() { p->set_value(fn()); });
    if (f.wait_for(timeout) != std::future_status::ready) {
      return timedOut("the " + name_ + " loop did not answer within " +
                      std::to_string(timeout.count()) + " ms");
    }
    return f.get();
  }

  // Loop thread only. `events` are EPOLLIN/EPOLLOUT/... The callback runs on the loop.
  Status addFd(int fd, uint32_t events, FdCallback cb);
  void modifyFd(int fd, uint32_t events);
  void removeFd(int fd);
  TimerId addTimer(std::chrono::microseconds delay, std::function<void()> fn,
                   std::chrono::microseconds period = std::chrono::microseconds(0));
  void cancelTimer(TimerId id);
  // Runs before each blocking wait (e.g. to drain rings once more).
  void setBeforeSleep(std::function<bool()> fn) { before_sleep_ = std::move(fn); }
  // Runs after each wait that could have blocked (the hook above said no
  // work is pending), once epoll_wait returns.
  void setAfterSleep(std::function<void()> fn) { after_sleep_ = std::move(fn); }
  // Any thread: whether closures were post()ed and have not run yet (a
  // before-sleep hook polls it so that a post within its spin needs no
  // wake-up).
  bool hasPosted() const { return has_posted_.load(std::memory_order_acquire); }

  const std::string& name() const { return name_; }

 private:
  void wake();
  void runPosted();
  int runTimers();  // returns ms until the next timer, -1 if none

  std::string name_;
  UniqueFd epfd_;
  UniqueFd wakefd_;
  std::atomic<bool> stop_{false};
  std::atomic<std::thread::id> loop_thread_id_{};
  std::thread thread_;

  std::mutex post_mu_;
  std::vector<std::function<void()>> posted_;
  std::atomic<bool> has_posted_{false};

  std::unordered_map<int, std::shared_ptr<FdCallback>> fds_;
  struct Timer {
    std::function<void()> fn;
    std::chrono::microseconds period;
  };
  std::multimap<Clock::time_point, TimerId> timer_queue_;
  std::unordered_map<TimerId, std::pair<Clock::time_point, Timer>> timers_;
  TimerId next_timer_ = 1;
  std::function<bool()> before_sleep_;
  std::function<void()> after_sleep_;
};

}  // namespace kolo
