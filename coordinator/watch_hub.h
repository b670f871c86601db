// WatchJob plumbing. Each WatchJob stream has a WatchQueue shared by the
// loop (which pushes Worlds) and the stream's gRPC reactor (which writes them
// out without holding a thread: service.cc). The WatchHub, owned by the loop,
// knows the queues of every job and delivers each World change to all of
// them in order.
//
// Scale: a World lists every agent of its job, so with N watchers a change
// is O(N) bytes N times. The hub builds and serializes each World once
// (PublishedWorld) and every queue holds a reference to it: the loop's cost
// of a change is O(N) pointer pushes plus one serialization, and the bytes
// go out as a shared, reference-counted slice. A watcher that asked for
// brief Worlds (WatchJobRequest.brief: what kolo-agent asks for) gets the
// brief form, also built once per change for all of them; for a job of more
// agents than WatchLimits::brief_world_slots that form is compact (local
// sizes, no slots: job.h) and each watcher's copy is the shared bytes plus
// its own slot (PublishedWorld::selves), so a change costs O(N) bytes per
// watcher instead of O(N) slots.
#pragma once

#include <grpcpp/support/slice.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/membership/job.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo {
class WorkerPool;
}

namespace kolo::coordinator {

// One World as published to every watcher of its job: the message and its
// wire bytes, built once.
struct PublishedWorld {
  explicit PublishedWorld(coord::World w);
  // A compact brief World and, by agent id, the suffix that sets each
  // agent's World.self (selfSuffix).
  PublishedWorld(coord::World w, std::unordered_map<std::string, grpc::Slice> selves);
  coord::World world;
  grpc::Slice bytes;  // world serialized; slices share one buffer
  bool terminal = false;
  std::unordered_map<std::string, grpc::Slice> selves;
};

class WatchQueue : public std::enable_shared_from_this<WatchQueue> {
 public:
  enum class Next { kWorld, kClosed, kTimeout };

  // Producer side (the loop).
  void push(coord::World world);
  void push(std::shared_ptr<const PublishedWorld> world);
  // Ends the stream with `why` once the queued Worlds have been taken.
  void close(grpc::Status why);

  // Consumer side: waits up to `timeout` for a World.
  // (A compact World comes without its self: PublishedWorld::selves.)
  Next next(coord::World* out, std::chrono::milliseconds timeout);
  // Without waiting, by reference (what the stream reactor writes).
  Next take(std::shared_ptr<const PublishedWorld>* out);
  grpc::Status closeStatus() const;

  // `fn` runs (on the producer's thread) after every push and close, so an
  // asynchronous consumer can take() without polling. Clearing it (nullptr)
  // waits for a running call to return: after that `fn` is never called.
  void setListener(std::function<void()> fn);
  // With `writers` (set before the first push; the queue is then owned by a
  // shared_ptr), the listener runs on one of the writers' threads instead of
  // the producer's: the loop hands a seal's thousands of writes to them and
  // goes on (docs/coordinator.md, "Scale").
  void setWriters(WorkerPool* writers) { writers_ = writers; }

 private:
  void wake();
  void notify();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const PublishedWorld>> worlds_;
  bool closed_ = false;
  grpc::Status close_status_;
  std::mutex listener_mu_;  // held while the listener runs
  std::function<void()> listener_;
  WorkerPool* writers_ = nullptr;
};

// How many WatchJob streams the coordinator serves at once: past them a new
// stream is RESOURCE_EXHAUSTED. A stream costs no thread (a callback
// reactor), only its connection's memory, so the bounds are sized to the
// agents a coordinator serves (docs/coordinator.md, "Scale").
struct WatchLimits {
  size_t total = 16384;
  size_t per_job = 8192;
  // Brief Worlds list slots for jobs of at most this many agents (job.h).
  int brief_world_slots = kBriefWorldSlotsDefault;
};

// Loop-only.
class WatchHub {
 public:
  explicit WatchHub(int brief_world_slots = kBriefWorldSlotsDefault)
      : brief_world_slots_(brief_world_slots) {}
  // `brief`: the queue gets briefWorld(w) of each World w published; `runs`:
  // its compact form with local_size_runs (WatchJobRequest.local_size_runs).
  void add(const std::string& job_id, std::shared_ptr<WatchQueue> queue, bool brief = false,
           bool runs = false);
  void remove(const std::string& job_id, const WatchQueue* queue);
  // Delivers the World to every watcher of its job (each form built and
  // serialized once).
  void publish(const coord::World& world);
  void closeJob(const std::string& job_id, const grpc::Status& why);
  void closeAll(const grpc::Status& why);
  size_t watcherCount(const std::string& job_id) const;
  size_t totalCount() const { return total_; }

 private:
  struct Watcher {
    std::shared_ptr<WatchQueue> queue;
    bool brief = false;
    bool runs = false;
  };
  const int brief_world_slots_;
  std::map<std::string, std::vector<Watcher>> watchers_;
  size_t total_ = 0;  // queues in watchers_
};

// True for a World after which nothing changes (FAILED / FINISHED).
bool isTerminal(const coord::World& world);

}  // namespace kolo::coordinator
