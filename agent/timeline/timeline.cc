#include "agent/timeline/timeline.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <unordered_map>

#include "agent/timeline/mpsc_queue.h"
#include "agent/timeline/timeline_file.h"
#include "common/log.h"

namespace kolo::timeline {

namespace {

int64_t steadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string shapeString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

class Timeline::Queue : public BoundedMpscQueue<TraceEvent> {
 public:
  using BoundedMpscQueue<TraceEvent>::BoundedMpscQueue;
};

// Owned by the writer thread while it runs.
struct Timeline::WriterState {
  explicit WriterState(TraceFile f) : file(std::move(f)) {}
  TraceFile file;
  std::unordered_map<std::string, int64_t> pids;
  int64_t next_pid = 1;

  void serialize(const TraceEvent& ev, std::vector<std::string>& out) {
    int64_t pid = 0;
    if (!ev.tensor.empty()) {
      auto [it, inserted] = pids.try_emplace(ev.tensor, next_pid);
      pid = it->second;
      if (inserted) {
        ++next_pid;
        out.push_back(nlohmann::json{{"name", "process_name"},
                                     {"ph", "M"},
                                     {"pid", pid},
                                     {"args", {{"name", ev.tensor}}}}
                          .dump());
        out.push_back(nlohmann::json{{"name", "process_sort_index"},
                                     {"ph", "M"},
                                     {"pid", pid},
                                     {"args", {{"sort_index", pid}}}}
                          .dump());
      }
    }
    nlohmann::json j;
    j["ph"] = std::string(1, ev.phase);
    if (ev.phase != 'E') j["name"] = ev.name;
    j["ts"] = ev.ts_us;
    j["pid"] = pid;
    j["tid"] = 0;
    if (ev.phase == 'X') j["dur"] = ev.dur_us;
    if (ev.phase == 'i') j["s"] = "g";
    if (!ev.args.empty()) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [k, v] : ev.args) args[k] = v;
      j["args"] = std::move(args);
    }
    // Names come from users: replace invalid UTF-8 instead of throwing.
    out.push_back(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
};

Timeline::Timeline(TimelineOptions options)
    : options_(std::move(options)),
      clock_(options_.clock_us ? options_.clock_us : std::function<int64_t()>(steadyMicros)) {}

Timeline::~Timeline() { (void)stop(); }

std::string Timeline::path() const {
  std::lock_guard<std::mutex> lk(mu_);
  return path_;
}

Status Timeline::start(const std::string& path, bool mark_cycles) {
  if (active()) return invalidArgument("timeline already recording to " + this->path());
  if (path.empty()) return invalidArgument("timeline: empty file name");
  auto file = TraceFile::create(options_.dir, path);
  if (!file.isOk()) return file.status();
  const std::string full_path = file.value().path();
  if (!queue_) {
    queue_ = std::make_unique<Queue>(options_.queue_capacity);
  } else {
    // Events that raced with the previous stop() belong to no recording.
    TraceEvent stale;
    while (queue_->tryPop(&stale)) {
    }
  }
  writer_state_ = std::make_unique<WriterState>(std::move(file).value());
  // First event: the clock anchor (metadata; viewers ignore it). It maps
  // this file's monotonic timestamps to wall-clock time for merging.
  // Event times are microseconds since start_us_, so the anchor says
  // ts 0 <=> unix_us.
  start_us_.store(clock_(), std::memory_order_relaxed);
  {
    const int64_t wall_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    std::string anchor = nlohmann::json{{"name", kClockAnchorName},
                                        {"ph", "M"},
                                        {"pid", 0},
                                        {"args", {{"ts_us", 0}, {"unix_us", wall_us}, {"label", options_.label}}}}
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    Status st = writer_state_->file.append({anchor});
    if (!st.isOk()) {
      writer_state_.reset();
      return st;
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = false;
    flush_requested_ = false;
    path_ = full_path;
    writer_status_ = okStatus();
  }
  dropped_.store(0, std::memory_order_relaxed);
  written_.store(0, std::memory_order_relaxed);
  flushes_.store(0, std::memory_order_relaxed);
  mark_cycles_.store(mark_cycles, std::memory_order_relaxed);
  writer_ = std::thread([this] { writerMain(); });
  active_.store(true, std::memory_order_release);
  log::get("agent.timeline")
      ->info("timeline recording to {}{}", full_path, mark_cycles ? " (marking cycles)" : "");
  return okStatus();
}

Status Timeline::stop() {
  if (!writer_.joinable()) return okStatus();
  active_.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  writer_.join();
  writer_state_.reset();
  Status st;
  std::string path;
  {
    std::lock_guard<std::mutex> lk(mu_);
    st = writer_status_;
    path = path_;
  }
  auto lg = log::get("agent.timeline");
  if (dropped() > 0) {
    lg->warn("timeline {}: {} events dropped (queue of {} full)", path, dropped(),
             queue_->capacity());
  }
  lg->info("timeline {} closed: {} events written", path, eventsWritten());
  return st;
}

void Timeline::requestFlush() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    flush_requested_ = true;
  }
  cv_.notify_all();
}

bool Timeline::waitWritten(uint64_t events, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  return written_cv_.wait_for(lk, timeout, [&] { return eventsWritten() >= events; });
}

void Timeline::record(TraceEvent&& ev) {
  if (!queue_->tryPush(std::move(ev))) dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::negotiateStart(std::string_view tensor, CollectiveType op) {
  if (!active()) return;
  record({'B', nowUs(), 0, std::string(tensor), "NEGOTIATE_" + upper(collectiveName(op)), {}});
}

void Timeline::negotiateRankReady(std::string_view tensor, int rank) {
  if (!active()) return;
  record({'X', nowUs(), 0, std::string(tensor), std::to_string(rank), {}});
}

void Timeline::negotiateEnd(std::string_view tensor) {
  if (!active()) return;
  record({'E', nowUs(), 0, std::string(tensor), {}, {}});
}

void Timeline::opStart(std::string_view tensor, CollectiveType op) {
  if (!active()) return;
  record({'B', nowUs(), 0, std::string(tensor), upper(collectiveName(op)), {}});
}

void Timeline::activityStart(std::string_view tensor, std::string_view activity, TraceArgs args) {
  if (!active()) return;
  record({'B', nowUs(), 0, std::string(tensor), std::string(activity), std::move(args)});
}

void Timeline::activityEnd(std::string_view tensor) {
  if (!active()) return;
  record({'E', nowUs(), 0, std::string(tensor), {}, {}});
}

void Timeline::activity(std::string_view tensor, std::string_view activity, int64_t start_us,
                        int64_t dur_us, TraceArgs args) {
  if (!active()) return;
  record({'X', start_us, dur_us, std::string(tensor), std::string(activity), std::move(args)});
}

void Timeline::opEnd(std::string_view tensor, DataType dtype, std::span<const int64_t> shape) {
  if (!active()) return;
  record({'E',
          nowUs(),
          0,
          std::string(tensor),
          {},
          {{"dtype", std::string(dataTypeName(dtype))}, {"shape", shapeString(shape)}}});
}

void Timeline::markCycleStart() {
  if (!active() || !markCycles()) return;
  record({'i', nowUs(), 0, {}, std::string(kCycleStart), {}});
}

void Timeline::writerMain() {
  log::setThreadName("kolo-timeline");
  auto lg = log::get("agent.timeline");
  std::vector<std::string> lines;
  TraceEvent ev;
  bool failed = false;
  uint64_t bytes = 0;
  for (;;) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, options_.flush_interval,
                   [this] { return stop_requested_ || flush_requested_; });
      stopping = stop_requested_;
      flush_requested_ = false;
    }
    lines.clear();
    uint64_t n = 0;
    while (queue_->tryPop(&ev)) {
      ++n;
      if (!failed) writer_state_->serialize(ev, lines);
    }
    if (failed) {
      dropped_.fetch_add(n, std::memory_order_relaxed);
    } else if (!lines.empty()) {
      uint64_t add = 0;
      for (const std::string& l : lines) add += l.size() + 2;
      Status st = okStatus();
      if (options_.max_bytes > 0 && bytes + add > options_.max_bytes) {
        st = Status(Code::kUnavailable,
                    "timeline " + writer_state_->file.path() + " reached its cap of " +
                        std::to_string(options_.max_bytes) + " bytes (--timeline-max-mb)");
      } else {
        st = writer_state_->file.append(lines);
        bytes += add;
      }
      if (!st.isOk()) {
        lg->error("{}; no more events will be written", st.toString());
        failed = true;
        dropped_.fetch_add(n, std::memory_order_relaxed);
        std::lock_guard<std::mutex> lk(mu_);
        writer_status_ = st;
      } else {
        written_.fetch_add(n, std::memory_order_release);
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      flushes_.fetch_add(1, std::memory_order_release);
    }
    written_cv_.notify_all();
    if (stopping) break;
  }
}

}  // namespace kolo::timeline
