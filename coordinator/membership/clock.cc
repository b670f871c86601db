#include "coordinator/membership/clock.h"

#include <chrono>

namespace kolo::coordinator {

int64_t SystemClock::steadyMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t SystemClock::wallMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const SystemClock* SystemClock::get() {
  static const SystemClock clock;
  return &clock;
}

}  // namespace kolo::coordinator
