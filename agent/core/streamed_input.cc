#include "agent/core/streamed_input.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace kolo {

StreamedInput::StreamedInput(std::string name, uint64_t bytes, std::vector<Source> sources,
                             std::shared_ptr<FirstError> error)
    : name_(std::move(name)),
      bytes_(bytes),
      sources_(std::move(sources)),
      error_(std::move(error)) {}

uint64_t StreamedInput::copied() const {
  uint64_t least = bytes_;
  for (const Source& s : sources_) {
    least = std::min(least, s.copied->load(std::memory_order_acquire));
  }
  return least;
}

void StreamedInput::await(uint64_t end, const std::atomic<bool>& stop,
                          std::chrono::milliseconds stall, std::chrono::microseconds spin) const {
  using Clock = std::chrono::steady_clock;
  end = std::min(end, bytes_);
  uint64_t seen = copied();
  if (seen >= end) return;
  const auto start = Clock::now();
  auto moved_at = start;
  for (;;) {
    if (stop.load(std::memory_order_relaxed) || (error_ && error_->failed())) return;
    const auto now = Clock::now();
    if (now - start < spin) {
      ::sched_yield();  // a chunk takes tens of microseconds to copy: no futex round trip
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    const uint64_t c = copied();
    if (c >= end) return;
    if (c != seen) {
      seen = c;
      moved_at = Clock::now();
    } else if (Clock::now() - moved_at >= stall) {
      // Name the first rank that is behind.
      int rank = sources_.empty() ? 0 : sources_[0].local_rank;
      uint64_t at = 0;
      for (const Source& s : sources_) {
        const uint64_t v = s.copied->load(std::memory_order_acquire);
        if (v < end) {
          rank = s.local_rank;
          at = v;
          break;
        }
      }
      if (error_) {
        error_->set(
            timedOut("local rank " + std::to_string(rank) + " copied " + std::to_string(at) +
                     " of the " + std::to_string(bytes_) + " bytes of tensor '" + name_ +
                     "' into the arena and then nothing for " + std::to_string(stall.count()) +
                     " ms (the trainer died or hung inside its submission)"));
      }
      return;
    }
  }
}

}  // namespace kolo
