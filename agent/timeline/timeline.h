// Timeline: a Chrome trace (Perfetto / chrome://tracing) of every
// collective, like Horovod's timeline.
//
// Each tensor name is a trace "process" (a stable pid per name for the
// life of one recording, with process_name metadata). Per name:
//   B NEGOTIATE_<OP> ... X "<rank>" per rank arrival ... E
//   B <OP>
//     B QUEUE / MEMCPY_IN_FUSION_BUFFER / LOCAL_REDUCE /
//       CROSS_ALLREDUCE (args: backend) / MEMCPY_OUT_FUSION_BUFFER ... E
//   E (args: dtype, shape)
// and, with mark_cycles, a global CYCLE_START instant each cycle.
// Timestamps are microseconds since start().
//
// Threads: record calls may come from any thread (normally the agent's
// loop); they never block: events go into a bounded MPSC queue and are
// dropped (and counted) when it is full. A writer thread drains the queue
// and appends to the file every flush interval (~100 ms); the file is
// valid JSON after every flush (timeline_file.h). start()/stop() come from
// one controlling thread (the loop).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kolo::timeline {

// Activity names (Horovod's where the meaning is the same).
inline constexpr std::string_view kQueue = "QUEUE";
inline constexpr std::string_view kMemcpyInFusionBuffer = "MEMCPY_IN_FUSION_BUFFER";
inline constexpr std::string_view kLocalReduce = "LOCAL_REDUCE";
inline constexpr std::string_view kCrossAllreduce = "CROSS_ALLREDUCE";
inline constexpr std::string_view kMemcpyOutFusionBuffer = "MEMCPY_OUT_FUSION_BUFFER";
inline constexpr std::string_view kCycleStart = "CYCLE_START";

using TraceArgs = std::vector<std::pair<std::string, std::string>>;

struct TraceEvent {
  char phase = 0;       // 'B' 'E' 'X' 'i'
  int64_t ts_us = 0;
  int64_t dur_us = 0;   // 'X' only
  std::string tensor;   // empty for global events
  std::string name;
  TraceArgs args;
};

// Name of the metadata event that opens every file (see TimelineOptions::label).
inline constexpr const char* kClockAnchorName = "kolo_clock_anchor";

struct TimelineOptions {
  size_t queue_capacity = size_t{1} << 16;  // events; rounded up to a power of two
  std::chrono::milliseconds flush_interval{100};
  // Monotonic clock in microseconds (any epoch). Tests inject their own.
  std::function<int64_t()> clock_us;
  // Who records (the agent id): written, with the clock anchor, into each
  // file's first event so that `kolo timeline merge` can label and align
  // several agents' files.
  std::string label;
  // The only directory files are written in (--timeline-dir): start()'s
  // name is taken inside it, refused outside it (timeline_file.h,
  // openTimelineFile). Empty: start() refuses every name.
  std::string dir;
  // The most bytes one file may grow to (--timeline-max-mb): past it the
  // writer stops, logs it once and counts the rest as dropped; the file
  // stays valid JSON. 0: no cap.
  uint64_t max_bytes = 0;
};

class Timeline {
 public:
  explicit Timeline(TimelineOptions options = {});
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Creates `path` inside options.dir (a relative name inside it, an
  // absolute one only below it) and starts recording; fails if already
  // recording or the file is refused or cannot be created. path() is then
  // the file's full path.
  Status start(const std::string& path, bool mark_cycles = false);
  // Writes everything recorded so far and closes the file. No-op when idle.
  Status stop();
  bool active() const { return active_.load(std::memory_order_acquire); }
  bool markCycles() const { return mark_cycles_.load(std::memory_order_relaxed); }
  std::string path() const;

  // --- recording (never blocks; no-op when not active) ---
  void negotiateStart(std::string_view tensor, CollectiveType op);
  void negotiateRankReady(std::string_view tensor, int rank);
  void negotiateEnd(std::string_view tensor);
  void opStart(std::string_view tensor, CollectiveType op);
  void activityStart(std::string_view tensor, std::string_view activity, TraceArgs args = {});
  void activityEnd(std::string_view tensor);
  // A finished activity measured elsewhere (e.g. on a worker thread), with
  // times from nowUs().
  void activity(std::string_view tensor, std::string_view activity, int64_t start_us,
                int64_t dur_us, TraceArgs args = {});
  void opEnd(std::string_view tensor, DataType dtype, std::span<const int64_t> shape);
  void markCycleStart();

  // Microseconds since start().
  int64_t nowUs() const { return clock_() - start_us_.load(std::memory_order_relaxed); }

  // Wakes the writer now instead of at the next interval.
  void requestFlush();

  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t eventsWritten() const { return written_.load(std::memory_order_acquire); }
  uint64_t flushes() const { return flushes_.load(std::memory_order_acquire); }
  // Waits (at most `timeout`) until at least `events` recorded events are in
  // the file; returns whether they are.
  bool waitWritten(uint64_t events, std::chrono::milliseconds timeout);

 private:
  class Queue;
  void record(TraceEvent&& ev);
  void writerMain();

  TimelineOptions options_;
  std::function<int64_t()> clock_;
  std::unique_ptr<Queue> queue_;  // created on the first start(), kept until destruction

  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};
  std::atomic<int64_t> start_us_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> flushes_{0};

  mutable std::mutex mu_;  // writer wake-ups and path_; never taken by record()
  std::condition_variable cv_;          // wakes the writer
  std::condition_variable written_cv_;  // signalled after each flush
  bool stop_requested_ = false;
  bool flush_requested_ = false;
  std::string path_;
  Status writer_status_;
  std::thread writer_;
  struct WriterState;
  std::unique_ptr<WriterState> writer_state_;
};

}  // namespace kolo::timeline
