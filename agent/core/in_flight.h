// The count of a job's collectives handed to executors, the negotiation
// thread or a worker and not yet complete (a job is removed only when it is
// zero), kept by tokens instead of by hand.
//
// `InFlightCount::begin()` counts one op and returns its `InFlight` token.
// The token travels with the op's state (a lambda's capture, a
// Job::CrossPending); the op is uncounted exactly once: by `end()` on any
// copy (where the op's completion must see the count already lowered, e.g.
// before finishOnLoop looks at whether the job can go), or else when the
// last copy is destroyed, so a dropped op cannot hold its job forever.
// Copies share one claim (std::function needs copyable captures).
//
// Loop-owned like the Job; the count is atomic only because the last copy of
// a token may die on another thread (a worker that dropped a task), and it
// is shared with the tokens so that one may outlive its job.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

namespace kolo {

class InFlight {
 public:
  InFlight() = default;  // counts nothing

  // Uncounts the op now; later calls (on any copy) do nothing.
  void end() {
    if (claim_) claim_->release();
    claim_.reset();
  }
  // Whether this token still counts its op.
  bool counting() const {
    return claim_ != nullptr && !claim_->released.load(std::memory_order_acquire);
  }

 private:
  friend class InFlightCount;
  struct Claim {
    explicit Claim(std::shared_ptr<std::atomic<int>> n) : count(std::move(n)) {
      count->fetch_add(1, std::memory_order_relaxed);
    }
    ~Claim() { release(); }
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    void release() {
      if (!released.exchange(true, std::memory_order_acq_rel))
        count->fetch_sub(1, std::memory_order_acq_rel);
    }
    std::shared_ptr<std::atomic<int>> count;
    std::atomic<bool> released{false};
  };
  explicit InFlight(std::shared_ptr<Claim> c) : claim_(std::move(c)) {}
  std::shared_ptr<Claim> claim_;
};

class InFlightCount {
 public:
  // Counts one more op; it stays counted until its token ends.
  [[nodiscard]] InFlight begin() { return InFlight(std::make_shared<InFlight::Claim>(n_)); }
  int value() const { return n_->load(std::memory_order_acquire); }

 private:
  std::shared_ptr<std::atomic<int>> n_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace kolo
