// Logging: spdlog, one named logger per subsystem ("agent.ipc", "coord", ...).
// KOLO_LOG_LEVEL sets the level: "info", or per subsystem "warn,agent.ipc=debug".
// KOLO_LOG_FORMAT=json writes JSON lines. Each line carries host:pid:tid.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace kolo::log {

// Configures sinks/pattern once per process. `level_spec` overrides
// KOLO_LOG_LEVEL when non-empty; `json` forces JSON lines.
void init(const std::string& process_name, const std::string& level_spec = "", bool json = false);
// The logger for a subsystem (created on first use with the configured level).
std::shared_ptr<spdlog::logger> get(const std::string& subsystem);
// Names the calling thread (visible in top/gdb; 15 chars max).
void setThreadName(const std::string& name);

// Lets a repeated message through at most `burst` times per `period` and
// counts the ones it holds back, so that an error a peer can trigger in a
// loop (accept failing with EMFILE, a flood of bad frames) cannot fill the
// disk or starve the daemon. Thread-safe; one limiter per call site.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimiter(std::chrono::milliseconds period = std::chrono::seconds(10), int burst = 5)
      : period_(period), burst_(burst) {}
  // nullopt: hold this one back. Otherwise the number held back since the
  // last one let through (to be reported with it).
  std::optional<uint64_t> admit(Clock::time_point now = Clock::now());
  uint64_t suppressedTotal() const;

 private:
  mutable std::mutex mu_;
  std::chrono::milliseconds period_;
  int burst_;
  Clock::time_point window_start_{};
  int in_window_ = 0;
  uint64_t held_ = 0;
  uint64_t held_total_ = 0;
};

// Logs through `limiter`: the line that passes after some were held back
// ends with "(N similar messages suppressed)".
template <typename... Args>
void rateLimited(RateLimiter& limiter, spdlog::logger& logger, spdlog::level::level_enum level,
                 fmt::format_string<Args...> format, Args&&... args) {
  if (!logger.should_log(level)) return;
  std::optional<uint64_t> held = limiter.admit();
  if (!held) return;
  std::string msg = fmt::format(format, std::forward<Args>(args)...);
  if (*held > 0) msg += fmt::format(" ({} similar messages suppressed)", *held);
  logger.log(level, msg);
}

}  // namespace kolo::log
