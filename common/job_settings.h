// Per-job tuning that a trainer's environment sets (Horovod users set
// HOROVOD_FUSION_THRESHOLD and friends in the training job, not on the
// node's daemon). libkolo sends the variables named here in its Hello; the
// agent parses them with Horovod's units and applies them to that job only,
// over its own configuration (docs/fusion-and-timeline.md, "Per job").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace kolo {

struct JobSettings {
  std::optional<uint64_t> fusion_threshold_bytes;  // 0: fusion off
  std::optional<int64_t> cache_capacity;           // 0: no response cache
  std::optional<bool> autotune;
  std::optional<double> cycle_time_ms;             // accepted, as the agent's: no effect

  bool empty() const {
    return !fusion_threshold_bytes && !cache_capacity && !autotune && !cycle_time_ms;
  }
  bool operator==(const JobSettings& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes &&
           cache_capacity == o.cache_capacity && autotune == o.autotune &&
           cycle_time_ms == o.cycle_time_ms;
  }
  bool operator!=(const JobSettings& o) const { return !(*this == o); }
  // "fusion threshold 65536 bytes, cache capacity 0" (what is set).
  std::string describe() const;
};

// Bounds a trainer may not pass (the agent's memory is shared by every job).
constexpr uint64_t kMaxJobFusionThresholdBytes = 1ull << 30;
constexpr int64_t kMaxJobCacheCapacity = 1 << 20;

// The variables libkolo forwards, KOLO_* before their HOROVOD_* twins.
const std::vector<std::string>& jobSettingVariables();

// Parses the variables (others are ignored). KOLO_FUSION_THRESHOLD_MB is in
// MiB, HOROVOD_FUSION_THRESHOLD in bytes (Horovod's unit, kept exact); a
// KOLO_* variable wins over its HOROVOD_* twin. Errors name the variable.
StatusOr<JobSettings> parseJobSettings(const std::map<std::string, std::string>& vars);

}  // namespace kolo
