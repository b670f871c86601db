#include "common/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/log.h"

namespace kolo::metrics {

namespace {

bool isNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }

// Finite and strictly increasing.
bool validBounds(const std::vector<double>& b) {
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b[i])) return false;
    if (i > 0 && !(b[i - 1] < b[i])) return false;
  }
  return true;
}

std::vector<double> sanitizeBounds(std::vector<double> b) {
  b.erase(std::remove_if(b.begin(), b.end(), [](double v) { return !std::isfinite(v); }), b.end());
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

// `{a="x",b="y"}` (or "" without labels); `extra` is appended last (le=...).
std::string labelText(const Labels& labels, std::string_view extra = {}) {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first;
    out += "=\"";
    out += escapeLabelValue(labels[i].second);
    out += '"';
  }
  if (!extra.empty()) {
    if (!labels.empty()) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

}  // namespace

// --- names, escaping, values ---------------------------------------------------

bool isValidMetricName(std::string_view name) {
  if (name.empty() || !(isNameStart(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return isNameStart(c) || isDigit(c) || c == ':'; });
}

bool isValidLabelName(std::string_view name) {
  if (name.empty() || !isNameStart(name[0])) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;  // reserved
  return std::all_of(name.begin(), name.end(), [](char c) { return isNameStart(c) || isDigit(c); });
}

std::string escapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);  // shortest round-trip form: 0.005, 1e-05, 2.5e+20
}

// --- buckets ------------------------------------------------------------------

const std::vector<double>& defaultLatencyBuckets() {
  static const std::vector<double> kBuckets = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,  60};
  return kBuckets;
}

std::vector<double> exponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  if (!(start > 0) || !(factor > 1)) return b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> linearBuckets(double start, double width, int count) {
  std::vector<double> b;
  if (!(width > 0)) return b;
  for (int i = 0; i < count; ++i) b.push_back(start + width * i);
  return b;
}

// --- Histogram ------------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(sanitizeBounds(std::move(bounds))),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  // First bound >= v (buckets are inclusive upper bounds); NaN goes to +Inf.
  size_t i = std::isnan(v) ? bounds_.size()
                           : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                                 bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// --- Registry -------------------------------------------------------------------

struct Registry::Series {
  Labels labels;  // sorted by name
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

struct Registry::Family {
  Type type;
  std::string help;
  std::vector<double> bounds;  // histograms
  std::map<std::string, std::unique_ptr<Series>> series;  // by labelText()
};

Registry::Registry() = default;
Registry::~Registry() = default;

namespace {
const char* typeName(int t) {
  static const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[t];
}
}  // namespace

Registry::Series* Registry::findOrAdd(Type type, const std::string& name, const std::string& help,
                                      Labels labels, std::vector<double>* bounds) {
  auto logger = log::get("metrics");
  if (!isValidMetricName(name)) {
    logger->error("metric name '{}' is not valid ([a-zA-Z_:][a-zA-Z0-9_:]*); it is not exported",
                  name);
    return nullptr;
  }
  std::sort(labels.begin(), labels.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& l = labels[i].first;
    if (!isValidLabelName(l) || (type == Type::kHistogram && l == "le") ||
        (i > 0 && labels[i - 1].first == l)) {
      logger->error("metric {}: label name '{}' is not valid, reserved or repeated; not exported",
                    name, l);
      return nullptr;
    }
  }
  if (bounds != nullptr && !validBounds(*bounds)) {
    logger->error("histogram {}: bucket bounds must be finite and strictly increasing; not exported",
                  name);
    return nullptr;
  }

  std::lock_guard<std::mutex> lock(mu_);
  auto& family = families_[name];
  if (!family) {
    family = std::make_unique<Family>();
    family->type = type;
    family->help = help;
    if (bounds != nullptr) family->bounds = *bounds;
  } else if (family->type != type) {
    logger->error("metric {} is a {}, asked for as a {}; the second one is not exported", name,
                  typeName(static_cast<int>(family->type)), typeName(static_cast<int>(type)));
    return nullptr;
  } else if (bounds != nullptr && family->bounds != *bounds) {
    logger->error("histogram {} was registered with other buckets; this series is not exported",
                  name);
    return nullptr;
  }

  std::string key = labelText(labels);
  auto& series = family->series[key];
  if (!series) {
    series = std::make_unique<Series>();
    series->labels = std::move(labels);
    switch (type) {
      case Type::kCounter: series->counter = std::make_unique<Counter>(); break;
      case Type::kGauge: series->gauge = std::make_unique<Gauge>(); break;
      case Type::kHistogram: series->histogram = std::make_unique<Histogram>(family->bounds); break;
    }
  }
  return series.get();
}

Counter& Registry::counter(const std::string& name, const std::string& help, Labels labels) {
  if (Series* s = findOrAdd(Type::kCounter, name, help, std::move(labels), nullptr)) {
    return *s->counter;
  }
  std::lock_guard<std::mutex> lock(mu_);
  orphan_counters_.push_back(std::make_unique<Counter>());
  return *orphan_counters_.back();
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, Labels labels) {
  if (Series* s = findOrAdd(Type::kGauge, name, help, std::move(labels), nullptr)) {
    return *s->gauge;
  }
  std::lock_guard<std::mutex> lock(mu_);
  orphan_gauges_.push_back(std::make_unique<Gauge>());
  return *orphan_gauges_.back();
}

Histogram& Registry::histogram(const std::string& name, const std::string& help, Labels labels,
                               std::vector<double> bounds) {
  if (bounds.empty()) bounds = defaultLatencyBuckets();
  if (Series* s = findOrAdd(Type::kHistogram, name, help, std::move(labels), &bounds)) {
    return *s->histogram;
  }
  std::lock_guard<std::mutex> lock(mu_);
  orphan_histograms_.push_back(std::make_unique<Histogram>(std::move(bounds)));
  return *orphan_histograms_.back();
}

std::string Registry::render() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, family] : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escapeHelp(family->help), name,
                       typeName(static_cast<int>(family->type)));
    for (const auto& [key, series] : family->series) {
      switch (family->type) {
        case Type::kCounter:
          out += fmt::format("{}{} {}\n", name, key, series->counter->value());
          break;
        case Type::kGauge:
          out += fmt::format("{}{} {}\n", name, key, formatValue(series->gauge->value()));
          break;
        case Type::kHistogram: {
          Histogram::Snapshot snap = series->histogram->snapshot();
          for (size_t i = 0; i <= snap.bounds.size(); ++i) {
            std::string le = i < snap.bounds.size() ? formatValue(snap.bounds[i]) : "+Inf";
            out += fmt::format("{}_bucket{} {}\n", name,
                               labelText(series->labels, "le=\"" + le + "\""), snap.cumulative[i]);
          }
          out += fmt::format("{}_sum{} {}\n", name, key, formatValue(snap.sum));
          out += fmt::format("{}_count{} {}\n", name, key, snap.count());
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace kolo::metrics
