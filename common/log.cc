#include "common/log.h"

#include <pthread.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

namespace kolo::log {
namespace {

struct State {
  std::mutex mu;
  bool initialized = false;
  spdlog::level::level_enum default_level = spdlog::level::info;
  std::map<std::string, spdlog::level::level_enum> per_subsystem;
  std::string pattern;
  spdlog::sink_ptr sink;
};

State& state() {
  static State* s = new State();
  return *s;
}

// %* : the message as a JSON string body (quotes, backslashes, control characters escaped).
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\r': dest.append(std::string_view("\\r")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            dest.append(std::string_view(b));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonEscapedMessage>(); }
};

spdlog::level::level_enum parseLevel(const std::string& s, spdlog::level::level_enum dflt) {
  if (s == "trace") return spdlog::level::trace;
  if (s == "debug") return spdlog::level::debug;
  if (s == "info") return spdlog::level::info;
  if (s == "warn" || s == "warning") return spdlog::level::warn;
  if (s == "error") return spdlog::level::err;
  if (s == "critical" || s == "fatal") return spdlog::level::critical;
  if (s == "off") return spdlog::level::off;
  return dflt;
}

void applySpec(State& st, const std::string& spec) {
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      st.default_level = parseLevel(item, st.default_level);
    } else {
      st.per_subsystem[item.substr(0, eq)] = parseLevel(item.substr(eq + 1), st.default_level);
    }
  }
}

void initLocked(State& st, const std::string& process_name, const std::string& level_spec,
                bool json) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const char* fmt_env = std::getenv("KOLO_LOG_FORMAT");
  if (fmt_env != nullptr && std::string(fmt_env) == "json") json = true;
  if (json) {
    st.pattern = std::string(R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","host":")") + host +
                 R"(","proc":")" + process_name +
                 R"(","pid":%P,"tid":%t,"logger":"%n","level":"%l","msg":"%*"})";
  } else {
    st.pattern = std::string("[%Y-%m-%d %H:%M:%S.%e] [") + host + ":%P:%t] [%n] [%^%l%$] %v";
  }
  if (!st.sink) st.sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto formatter = std::make_unique<spdlog::pattern_formatter>(json ? spdlog::pattern_time_type::utc
                                                                     : spdlog::pattern_time_type::local);
  formatter->add_flag<JsonEscapedMessage>('*').set_pattern(st.pattern);
  st.sink->set_formatter(std::move(formatter));
  const char* env = std::getenv("KOLO_LOG_LEVEL");
  if (env != nullptr) applySpec(st, env);
  if (!level_spec.empty()) applySpec(st, level_spec);
  st.initialized = true;
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    auto it = st.per_subsystem.find(l->name());
    l->set_level(it != st.per_subsystem.end() ? it->second : st.default_level);
  });
}

}  // namespace

void init(const std::string& process_name, const std::string& level_spec, bool json) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  initLocked(st, process_name, level_spec, json);
}

std::shared_ptr<spdlog::logger> get(const std::string& subsystem) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.initialized) initLocked(st, "kolo", "", false);
  if (auto l = spdlog::get(subsystem)) return l;
  auto l = std::make_shared<spdlog::logger>(subsystem, st.sink);
  auto it = st.per_subsystem.find(subsystem);
  l->set_level(it != st.per_subsystem.end() ? it->second : st.default_level);
  l->flush_on(spdlog::level::warn);
  spdlog::register_logger(l);
  return l;
}

std::optional<uint64_t> RateLimiter::admit(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_start_ == Clock::time_point{} || now - window_start_ >= period_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++held_;
    ++held_total_;
    return std::nullopt;
  }
  ++in_window_;
  return std::exchange(held_, 0);
}

uint64_t RateLimiter::suppressedTotal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_total_;
}

void setThreadName(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace kolo::log
