#include "bench/coord_load_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kolo::bench {

void Samples::add(double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ms_.push_back(ms);
}

size_t Samples::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ms_.size();
}

Summary Samples::summary() const {
  std::vector<double> v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v = ms_;
  }
  Summary s;
  s.count = v.size();
  if (v.empty()) return s;
  s.p50 = percentile(v, 50);
  s.p99 = percentile(v, 99);
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double rank = std::ceil(q / 100.0 * static_cast<double>(values.size()));
  size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(i, values.size() - 1)];
}

// Latencies in ms (p50/p99); lost = lease expiry noticed, from the lost
// agent's last heartbeat to its peers' next World; cpu% = coordinator CPU
// in % of one core over the heartbeats-only window; cpu-s over the whole
// case; rss after the jobs formed; thr = coordinator threads then.
const char* const kCaseHeader =
    "#  agents  jobs   register(ms)  heartbeat(ms)     seal(ms)     kvput(ms)     kvget(ms)"
    "   lost(ms)/lease   hb-cpu%   cpu-s  rss-MiB  thr  ok\n"
    "#                  p50    p99    p50    p99    p50    p99    p50    p99    p50    p99"
    "    p50    p99";

namespace {
std::string pair(const Summary& s, int width) {
  if (s.count == 0) return fmt::format("{:>{}} {:>{}}", "-", width, "-", width);
  return fmt::format("{:>{}.1f} {:>{}.1f}", s.p50, width, s.p99, width);
}
}  // namespace

std::string formatCaseRow(const CaseRow& r) {
  return fmt::format(
      "{:>9} {:>5}  {}  {}  {}  {}  {}  {} /{:>5}  {:>7.1f}  {:>6.1f}  {:>7.1f}  {:>3}  {}",
      r.agents, r.jobs, pair(r.reg, 6), pair(r.hb, 6), pair(r.seal, 6), pair(r.kv_put, 6),
      pair(r.kv_get, 6), pair(r.lost, 6), r.lease_ms, r.steady_cpu_pct, r.total_cpu_s, r.rss_mib,
      r.threads, r.failure.empty() ? "yes" : "NO");
}

}  // namespace kolo::bench
