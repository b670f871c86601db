// Streamed copy-in (common/ipc_layout.h kSubmitFlagStreamed): a large
// allreduce across agents whose trainers publish it first and copy their
// tensors into the arena while the agents negotiate and run the ring. Each
// such rank counts the bytes it has copied in the cache line before its
// input; the job's negotiation thread waits here, chunk by chunk, before it
// reads (or lets the backend read) any of them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/core/local_executor.h"

namespace kolo {

class StreamedInput {
 public:
  using Source = StreamedSource;
  // `error` receives why a wait failed (a rank whose copy stopped); the op
  // then fails the job (its bytes may already be in the other agents' sums).
  StreamedInput(std::string name, uint64_t bytes, std::vector<Source> sources,
                std::shared_ptr<FirstError> error);

  // Blocks until every source has copied its first `end` bytes, `stop`
  // turns true, or no source moved for `stall` (then `error` is set: the
  // trainer died or hung inside its submission). Polls, yielding, for the
  // first `spin`, then sleeps in short steps.
  void await(uint64_t end, const std::atomic<bool>& stop, std::chrono::milliseconds stall,
             std::chrono::microseconds spin = std::chrono::microseconds(50)) const;

  // Bytes every source has copied so far (at most `bytes`).
  uint64_t copied() const;

 private:
  std::string name_;
  uint64_t bytes_;
  std::vector<Source> sources_;
  std::shared_ptr<FirstError> error_;
};

}  // namespace kolo
