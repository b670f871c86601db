// Tells a callback when a record is durable, without a thread per waiter.
// A mutating RPC answers only once its records are on disk (or in etcd);
// a blocking waitDurable would hold one gRPC thread per call in flight, and
// with thousands of agents joining at once the calls then queue for those
// threads (docs/coordinator.md, "Scale"). Here the callbacks wait in one
// list, ordered by seq; one thread ("coord-durable") waits on the sink for
// the smallest seq and runs every callback whose record is durable by then.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "coordinator/persist/record_sink.h"

namespace kolo::coordinator::persist {

class DurableNotifier {
 public:
  using Done = std::function<void(Status)>;

  // `sink` must outlive stop().
  explicit DurableNotifier(RecordSink* sink);
  ~DurableNotifier();
  DurableNotifier(const DurableNotifier&) = delete;
  DurableNotifier& operator=(const DurableNotifier&) = delete;

  // Calls `done` (on the notifier's thread) with Ok once record `seq` is
  // durable, with the sink's error, or with TimedOut after `timeout`. A
  // waiter whose seq is above a slower one's may be told up to the slower
  // one's wait late (all callers use the same timeout: the order of seqs is
  // the order of deadlines).
  void notify(uint64_t seq, std::chrono::milliseconds timeout, Done done);
  // Tells every waiter left Unavailable and stops the thread. Idempotent.
  void stop();

 private:
  struct Waiter {
    std::chrono::steady_clock::time_point deadline;
    Done done;
  };
  void main();

  RecordSink* sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<uint64_t, Waiter> waiters_;  // by seq
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kolo::coordinator::persist
