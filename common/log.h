// Logging: spdlog, one named logger per subsystem ("agent.ipc", "coord", ...).
// KOLO_LOG_LEVEL sets the level: "info", or per subsystem "warn,agent.ipc=debug".
// KOLO_LOG_FORMAT=json writes JSON lines. Each line carries host:pid:tid.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace kolo::log {

// Configures sinks/pattern once per process. `level_spec` overrides
// KOLO_LOG_LEVEL when non-empty; `json` forces JSON lines.
void init(const std::string& process_name, const std::string& level_spec = "", bool json = false);
// The logger for a subsystem (created on first use with the configured level).
std::shared_ptr<spdlog::logger> get(const std::string& subsystem);
// Names the calling thread (visible in top/gdb; 15 chars max).
void setThreadName(const std::string& name);

}  // namespace kolo::log
