#include "coordinator/persist/durable_notifier.h"

#include <algorithm>
#include <vector>

#include "common/log.h"

namespace kolo::coordinator::persist {

DurableNotifier::DurableNotifier(RecordSink* sink) : sink_(sink) {
  thread_ = std::thread([this] { main(); });
}

DurableNotifier::~DurableNotifier() { stop(); }

void DurableNotifier::notify(uint64_t seq, std::chrono::milliseconds timeout, Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      waiters_.emplace(seq, Waiter{std::chrono::steady_clock::now() + timeout, std::move(done)});
      cv_.notify_one();
      return;
    }
  }
  done(unavailable("the coordinator is shutting down"));
}

void DurableNotifier::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DurableNotifier::main() {
  log::setThreadName("coord-durable");
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !waiters_.empty(); });
    if (stopping_) break;
    const uint64_t seq = waiters_.begin()->first;
    const Clock::time_point deadline = waiters_.begin()->second.deadline;
    lock.unlock();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    // Bounded, so that a stop() is seen within 100 ms.
    Status st = sink_->waitDurable(
        seq, std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(100)));
    lock.lock();
    std::vector<std::pair<Done, Status>> ready;
    if (st.isOk()) {
      // Every waiter up to `seq`, and those after it already durable too.
      while (!waiters_.empty() &&
             (waiters_.begin()->first <= seq ||
              sink_->waitDurable(waiters_.begin()->first, std::chrono::milliseconds(0)).isOk())) {
        ready.emplace_back(std::move(waiters_.begin()->second.done), okStatus());
        waiters_.erase(waiters_.begin());
      }
    } else if (st.code() != Code::kTimedOut) {
      for (auto& [s, w] : waiters_) ready.emplace_back(std::move(w.done), st);  // the sink failed
      waiters_.clear();
    } else {
      const Clock::time_point now = Clock::now();
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        ready.emplace_back(std::move(it->second.done),
                           timedOut("the change did not reach the disk (or etcd) in time"));
        it = waiters_.erase(it);
      }
    }
    lock.unlock();
    for (auto& [done, status] : ready) done(status);
    lock.lock();
  }
  std::multimap<uint64_t, Waiter> left;
  left.swap(waiters_);
  lock.unlock();
  for (auto& [seq, w] : left) w.done(unavailable("the coordinator is shutting down"));
}

}  // namespace kolo::coordinator::persist
