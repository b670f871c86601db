#include "common/job_settings.h"

#include <cerrno>
#include <cstdlib>

namespace kolo {

namespace {

struct Twin {
  const char* kolo;
  const char* horovod;
};
constexpr Twin kFusion{"KOLO_FUSION_THRESHOLD_MB", "HOROVOD_FUSION_THRESHOLD"};
constexpr Twin kCache{"KOLO_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"};
constexpr Twin kAutotune{"KOLO_AUTOTUNE", "HOROVOD_AUTOTUNE"};
constexpr Twin kCycle{"KOLO_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME"};

// The variable that applies (KOLO_* first) and its value, if either is set.
std::optional<std::pair<std::string, std::string>> pick(
    const std::map<std::string, std::string>& vars, const Twin& t) {
  for (const char* name : {t.kolo, t.horovod}) {
    auto it = vars.find(name);
    if (it != vars.end() && !it->second.empty()) return std::make_pair(std::string(name), it->second);
  }
  return std::nullopt;
}

Status bad(const std::string& name, const std::string& value, const std::string& want) {
  return invalidArgument(name + "=" + value + " in the trainer's environment: " + want);
}

StatusOr<int64_t> integer(const std::string& name, const std::string& value, int64_t max) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || end == value.c_str() || *end != '\0' || v < 0 || v > max) {
    return bad(name, value, "expected an integer from 0 to " + std::to_string(max));
  }
  return static_cast<int64_t>(v);
}

}  // namespace

const std::vector<std::string>& jobSettingVariables() {
  static const std::vector<std::string> names = {kFusion.kolo,   kFusion.horovod, kCache.kolo,
                                                 kCache.horovod, kAutotune.kolo,  kAutotune.horovod,
                                                 kCycle.kolo,    kCycle.horovod};
  return names;
}

StatusOr<JobSettings> parseJobSettings(const std::map<std::string, std::string>& vars) {
  JobSettings s;
  if (auto v = pick(vars, kFusion)) {
    const bool mib = v->first == kFusion.kolo;
    const int64_t max = static_cast<int64_t>(mib ? kMaxJobFusionThresholdBytes >> 20
                                                 : kMaxJobFusionThresholdBytes);
    ASSIGN_OR_RETURN(int64_t n, integer(v->first, v->second, max));
    s.fusion_threshold_bytes = static_cast<uint64_t>(n) << (mib ? 20 : 0);
  }
  if (auto v = pick(vars, kCache)) {
    ASSIGN_OR_RETURN(int64_t n, integer(v->first, v->second, kMaxJobCacheCapacity));
    s.cache_capacity = n;
  }
  if (auto v = pick(vars, kAutotune)) {
    const std::string& x = v->second;
    if (x == "1" || x == "true" || x == "yes" || x == "on") {
      s.autotune = true;
    } else if (x == "0" || x == "false" || x == "no" || x == "off") {
      s.autotune = false;
    } else {
      return bad(v->first, x, "expected 1 or 0 (true/false, yes/no, on/off)");
    }
  }
  if (auto v = pick(vars, kCycle)) {
    errno = 0;
    char* end = nullptr;
    double ms = std::strtod(v->second.c_str(), &end);
    if (errno != 0 || end == v->second.c_str() || *end != '\0' || !(ms >= 0) || ms > 1e6) {
      return bad(v->first, v->second, "expected milliseconds (a number from 0)");
    }
    s.cycle_time_ms = ms;
  }
  return s;
}

std::string JobSettings::describe() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (fusion_threshold_bytes) add("fusion threshold " + std::to_string(*fusion_threshold_bytes) + " bytes");
  if (cache_capacity) add("cache capacity " + std::to_string(*cache_capacity));
  if (autotune) add(std::string("autotune ") + (*autotune ? "on" : "off"));
  if (cycle_time_ms) add("cycle time " + std::to_string(*cycle_time_ms) + " ms (no effect)");
  return out.empty() ? "none" : out;
}

}  // namespace kolo
