#include "common/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <cerrno>

#include "common/log.h"

namespace kolo {

EventLoop::EventLoop(std::string name)
    : name_(std::move(name)),
      epfd_(::epoll_create1(EPOLL_CLOEXEC)),
      wakefd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  struct epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wakefd_.get();
  ::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, wakefd_.get(), &ev);
}

EventLoop::~EventLoop() { stop(); }

void EventLoop::start() {
  thread_ = std::thread([this] {
    log::setThreadName(name_);
    run();
  });
  while (loop_thread_id_.load() == std::thread::id()) std::this_thread::yield();
}

void EventLoop::stop() {
  stop_.store(true);
  wake();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void EventLoop::wake() {
  uint64_t one = 1;
  ssize_t r = ::write(wakefd_.get(), &one, sizeof one);
  (void)r;
}

void EventLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    posted_.push_back(std::move(fn));
    has_posted_.store(true, std::memory_order_release);
  }
  wake();
}

void EventLoop::runPosted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    batch.swap(posted_);
    has_posted_.store(false, std::memory_order_relaxed);
  }
  for (auto& fn : batch) fn();
}

Status EventLoop::addFd(int fd, uint32_t events, FdCallback cb) {
  struct epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return errnoStatus("epoll_ctl add", errno);
  fds_[fd] = std::make_shared<FdCallback>(std::move(cb));
  return okStatus();
}

void EventLoop::modifyFd(int fd, uint32_t events) {
  struct epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  ::epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::removeFd(int fd) {
  ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  fds_.erase(fd);
}

EventLoop::TimerId EventLoop::addTimer(std::chrono::microseconds delay, std::function<void()> fn,
                                       std::chrono::microseconds period) {
  TimerId id = next_timer_++;
  auto when = Clock::now() + delay;
  timers_[id] = {when, Timer{std::move(fn), period}};
  timer_queue_.emplace(when, id);
  return id;
}

void EventLoop::cancelTimer(TimerId id) {
  auto it = timers_.find(id);
  if (it == timers_.end()) return;
  auto range = timer_queue_.equal_range(it->second.first);
  for (auto q = range.first; q != range.second; ++q) {
    if (q->second == id) {
      timer_queue_.erase(q);
      break;
    }
  }
  timers_.erase(it);
}

int EventLoop::runTimers() {
  auto now = Clock::now();
  while (!timer_queue_.empty() && timer_queue_.begin()->first <= now) {
    TimerId id = timer_queue_.begin()->second;
    timer_queue_.erase(timer_queue_.begin());
    auto it = timers_.find(id);
    if (it == timers_.end()) continue;
    Timer t = it->second.second;
    if (t.period.count() > 0) {
      auto next = now + t.period;
      it->second.first = next;
      timer_queue_.emplace(next, id);
    } else {
      timers_.erase(it);
    }
    t.fn();
    now = Clock::now();
  }
  if (timer_queue_.empty()) return -1;
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(timer_queue_.begin()->first - now);
  return static_cast<int>(std::max<int64_t>(0, d.count() + 1));
}

void EventLoop::run() {
  loop_thread_id_.store(std::this_thread::get_id());
  constexpr int kMaxEvents = 64;
  struct epoll_event evs[kMaxEvents];
  while (!stop_.load()) {
    runPosted();
    // Timers after posted work: a posted task may have added one.
    int timeout = runTimers();
    {
      std::lock_guard<std::mutex> lock(post_mu_);
      if (!posted_.empty()) timeout = 0;  // a timer posted more work
    }
    if (stop_.load()) break;
    if (before_sleep_ && before_sleep_()) timeout = 0;  // more work is pending: don't block
    int n = ::epoll_wait(epfd_.get(), evs, kMaxEvents, timeout);
    if (timeout != 0 && after_sleep_) after_sleep_();
    if (n < 0) {
      if (errno == EINTR) continue;
      log::get("loop")->error("{}: epoll_wait failed: {}", name_, std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == wakefd_.get()) {
        uint64_t v;
        while (::read(wakefd_.get(), &v, sizeof v) > 0) {
        }
        continue;
      }
      auto it = fds_.find(fd);
      if (it == fds_.end()) continue;
      auto cb = it->second;  // keep alive even if the callback removes itself
      (*cb)(evs[i].events);
    }
  }
  runPosted();
}

}  // namespace kolo
