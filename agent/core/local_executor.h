// Runs the node-local part of a collective: the reduction of the k local
// ranks' slots, written back into every slot. Small tensors run inline on
// the loop (a round trip must not pay a thread hop); large ones are split
// across the worker pool, and completion is posted back to the loop.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "agent/core/cross_memory.h"
#include "common/dtype.h"
#include "common/event_loop.h"
#include "common/shm.h"
#include "common/status.h"
#include "common/worker_pool.h"

namespace kolo {

// The first error of a reduction whose parts run on several threads (the
// direct path's cross-memory reads and writes can fail: a trainer's bad
// address, a trainer that died).
class FirstError {
 public:
  void set(Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (st_.isOk()) st_ = std::move(st);
  }
  Status get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return st_;
  }
  bool failed() const { return !get().isOk(); }

 private:
  mutable std::mutex mu_;
  Status st_;
};

// A rank's input that its trainer is still copying into the arena
// (streamed copy-in, agent/core/streamed_input.h).
struct StreamedSource {
  const std::atomic<uint64_t>* copied = nullptr;  // bytes copied so far, in the rank's arena
  int local_rank = 0;
  // Streamed copy-out: the count of the result's bytes final in the rank's
  // slot (ipc_layout.h kStreamedFinalOffset); null when its result goes
  // elsewhere (out of place in the arena).
  std::atomic<uint64_t>* final_bytes = nullptr;
};

struct LocalReduce {
  DataType dtype;
  ReduceOp op;
  size_t count = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<void*> slots;                              // sources: one per local rank
  std::vector<void*> dsts;                               // destinations; empty = the slots (in place)
  std::vector<std::shared_ptr<SharedRegion>> keepalive;  // arenas stay mapped while we work
  std::shared_ptr<void> scratch;                         // e.g. a zero source for joined ranks
  // Direct user memory (agent/core/cross_memory.h): where remote_slots[j]
  // names a process, source j is read from that process's memory (slots[j]
  // is unused); where remote_dsts[d] does, destination d (of dsts, or of
  // slots when dsts is empty) is written there. Empty: all local. The
  // ranges are then reduced chunk by chunk through buffers that stay in
  // this core's cache. Errors land in `error` (set it to see them).
  std::vector<RemoteSpan> remote_slots;
  std::vector<RemoteSpan> remote_dsts;
  std::shared_ptr<FirstError> error;
  // Sources still being copied in (their op is published first): only the
  // cross-agent leg reads them, after StreamedInput::await (never
  // reduceRange on its own).
  std::vector<StreamedSource> streamed;
  // Cross-agent path only: runs on the loop once the agents' result is in
  // the slots, before the completions; its status is the op's (the device
  // path copies the staged result back to the GPU here).
  std::function<Status()> before_finish;
};

// Elements [begin, begin + n) of `r`, on the calling thread (dsts empty =
// the slots, in place). A failed cross-memory transfer stops the range and
// is recorded in r.error.
void reduceRange(const LocalReduce& r, size_t begin, size_t n);

// Bytes per chunk of a direct reduction: each source's chunk and the
// result fit a core's L2 together for a few local ranks.
inline constexpr size_t kDirectChunkBytes = size_t{256} << 10;

class LocalExecutor {
 public:
  LocalExecutor(EventLoop& loop, WorkerPool& pool, size_t inline_bytes)
      : loop_(loop), pool_(pool), inline_bytes_(inline_bytes) {}

  // Loop thread. `done` runs on the loop thread.
  void reduceOnLoop(LocalReduce r, std::function<void()> done);

 private:
  EventLoop& loop_;
  WorkerPool& pool_;
  size_t inline_bytes_;
};

}  // namespace kolo
