// kolo::metrics: a small thread-safe registry of counters, gauges and
// histograms for the daemons, rendered in the Prometheus text exposition
// format 0.0.4 (served by MetricsHttpServer, common/metrics_http.h).
//
// Registration takes the registry's lock and returns a handle that stays
// valid as long as the registry; get it once, off the hot path:
//
//   Counter& done = reg.counter("kolo_collectives_total", "Collectives completed",
//                               {{"op", "allreduce"}, {"dtype", "float32"}, {"status", "ok"}});
//   ...
//   done.inc();                 // one relaxed atomic add, no lock
//
// Asking again for the same name and labels returns the same handle (label
// order does not matter). A family has one type and one help text; asking
// for an existing name with another type, or for a histogram with other
// buckets, or with an invalid name, is a programming error: it is logged
// ("metrics" logger) and a working handle that is never exported is
// returned, so the caller's hot path needs no error handling.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kolo::metrics {

// Label name/value pairs, e.g. {{"op", "allreduce"}, {"dtype", "float32"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing count (events, bytes).
class alignas(64) Counter {
 public:
  void inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (clients connected, fill ratio).
class alignas(64) Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double d = 1) { value_.fetch_add(d, std::memory_order_relaxed); }
  void dec(double d = 1) { value_.fetch_add(-d, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets (upper bounds, inclusive), with
// their sum; latencies are in seconds. observe() is a binary search plus two
// relaxed atomic updates.
class Histogram {
 public:
  // `bounds`: finite, strictly increasing upper bounds (+Inf is implicit).
  explicit Histogram(std::vector<double> bounds);

  void observe(double v);

  struct Snapshot {
    std::vector<double> bounds;       // without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; the last is the count
    double sum = 0;
    uint64_t count() const { return cumulative.empty() ? 0 : cumulative.back(); }
  };
  // Consistent enough for scraping: cumulative counts are monotonic and the
  // +Inf bucket equals the count; the sum may lag by in-flight observations.
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (last: +Inf)
  std::atomic<double> sum_{0};
};

// Bucket bounds for latencies in seconds: 50 us .. 60 s, roughly 1-2.5-5
// steps, fit for collectives from small-message round trips to large
// cross-node allreduces.
const std::vector<double>& defaultLatencyBuckets();
// start, start*factor, ... (count bounds); start > 0, factor > 1.
std::vector<double> exponentialBuckets(double start, double factor, int count);
// start, start+width, ... (count bounds); width > 0.
std::vector<double> linearBuckets(double start, double width, int count);

// Name rules of the exposition format.
bool isValidMetricName(std::string_view name);  // [a-zA-Z_:][a-zA-Z0-9_:]*
bool isValidLabelName(std::string_view name);   // [a-zA-Z_][a-zA-Z0-9_]*, not __*
// Escaping: label values (\\, \", \n) and HELP text (\\, \n).
std::string escapeLabelValue(std::string_view v);
std::string escapeHelp(std::string_view v);
// A sample value: integers without a fraction, "+Inf", "-Inf", "NaN", else
// the shortest text that reads back as the same double.
std::string formatValue(double v);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter& counter(const std::string& name, const std::string& help, Labels labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, Labels labels = {});
  // `bounds` as for Histogram; all series of a family share them (the
  // first registration decides). Empty: defaultLatencyBuckets().
  Histogram& histogram(const std::string& name, const std::string& help, Labels labels = {},
                       std::vector<double> bounds = {});

  // The whole registry in the text exposition format 0.0.4: families sorted
  // by name, each with # HELP and # TYPE, series sorted by labels (label
  // pairs sorted by name). Safe to call from any thread.
  std::string render() const;

  // The content type of render()'s text.
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family;
  struct Series;

  // Validates and canonicalises (sorts) `labels`; nullptr on misuse, logged.
  Series* findOrAdd(Type type, const std::string& name, const std::string& help, Labels labels,
                    std::vector<double>* bounds);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_;
  // Handles returned on misuse: they work but are never rendered.
  std::vector<std::unique_ptr<Counter>> orphan_counters_;
  std::vector<std::unique_ptr<Gauge>> orphan_gauges_;
  std::vector<std::unique_ptr<Histogram>> orphan_histograms_;
};

}  // namespace kolo::metrics
