// WatchJob plumbing. Each WatchJob stream has a WatchQueue shared by the
// loop (which pushes Worlds) and the gRPC handler thread (which writes them
// out). The WatchHub, owned by the loop, knows the queues of every job and
// delivers each World change to all of them in order.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator {

class WatchQueue {
 public:
  enum class Next { kWorld, kClosed, kTimeout };

  // Producer side (the loop).
  void push(coord::World world);
  // Ends the stream with `why` once the queued Worlds have been taken.
  void close(grpc::Status why);

  // Consumer side (the handler thread): waits up to `timeout` for a World.
  Next next(coord::World* out, std::chrono::milliseconds timeout);
  grpc::Status closeStatus() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<coord::World> worlds_;
  bool closed_ = false;
  grpc::Status close_status_;
};

// How many WatchJob streams the coordinator serves at once (each holds a
// gRPC thread while open): past them a new stream is RESOURCE_EXHAUSTED.
struct WatchLimits {
  size_t total = 1024;
  size_t per_job = 512;
};

// Loop-only.
class WatchHub {
 public:
  void add(const std::string& job_id, std::shared_ptr<WatchQueue> queue);
  void remove(const std::string& job_id, const WatchQueue* queue);
  // Delivers the World to every watcher of its job.
  void publish(const coord::World& world);
  void closeJob(const std::string& job_id, const grpc::Status& why);
  void closeAll(const grpc::Status& why);
  size_t watcherCount(const std::string& job_id) const;
  size_t totalCount() const { return total_; }

 private:
  std::map<std::string, std::vector<std::shared_ptr<WatchQueue>>> watchers_;
  size_t total_ = 0;  // queues in watchers_
};

// True for a World after which nothing changes (FAILED / FINISHED).
bool isTerminal(const coord::World& world);

}  // namespace kolo::coordinator
