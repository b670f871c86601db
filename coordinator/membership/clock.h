// The time source of the membership logic. Production uses SystemClock;
// tests inject a clock they step by hand, so lease expiry and retention are
// tested without sleeping.
#pragma once

#include <cstdint>

namespace kolo::coordinator {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds (leases, ages, retention).
  virtual int64_t steadyMs() const = 0;
  // Milliseconds since the Unix epoch (created_unix_ms in listings).
  virtual int64_t wallMs() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t steadyMs() const override;
  int64_t wallMs() const override;
  // A process-wide instance.
  static const SystemClock* get();
};

}  // namespace kolo::coordinator
