// Runs the node-local part of a collective: the reduction of the k local
// ranks' slots, written back into every slot. Small tensors run inline on
// the loop (a round trip must not pay a thread hop); large ones are split
// across the worker pool, and completion is posted back to the loop.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/event_loop.h"
#include "common/shm.h"
#include "common/status.h"
#include "common/worker_pool.h"

namespace kolo {

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
  // Cross-agent path only: runs on the loop once the agents' result is in
  // the slots, before the completions; its status is the op's (the device
  // path copies the staged result back to the GPU here).
  std::function<Status()> before_finish;
};

// Elements [begin, begin + n) of `r`, on the calling thread (dsts empty =
// the slots, in place).
void reduceRange(const LocalReduce& r, size_t begin, size_t n);

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
