// A Clock the test steps by hand.
#pragma once

#include <cstdint>

#include "coordinator/membership/clock.h"

namespace kolo::coordinator {

class ManualClock final : public Clock {
 public:
  int64_t steadyMs() const override { return steady_ms_; }
  int64_t wallMs() const override { return 1'700'000'000'000 + steady_ms_; }
  void advance(int64_t ms) { steady_ms_ += ms; }

 private:
  int64_t steady_ms_ = 1000;
};

}  // namespace kolo::coordinator
