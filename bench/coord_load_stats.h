// kolo-coord-load's figures: latency samples, percentiles and the table
// (one row per (agents, jobs) case, nccl-tests style). Pure, unit-tested.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace kolo::bench {

struct Summary {
  size_t count = 0;
  double p50 = 0;
  double p99 = 0;
  double max = 0;
};

// Thread-safe latency samples in milliseconds.
class Samples {
 public:
  void add(double ms);
  size_t count() const;
  Summary summary() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> ms_;
};

// The q-th percentile (0..100) by nearest rank; 0 if empty.
double percentile(std::vector<double> values, double q);

struct CaseRow {
  int agents = 0;
  int jobs = 0;
  int lease_ms = 0;
  Summary reg, hb, seal, kv_put, kv_get, lost;
  double steady_cpu_pct = 0;  // coordinator CPU (% of one core) with heartbeats only
  double total_cpu_s = 0;     // coordinator CPU over the case
  double rss_mib = 0;         // after the jobs formed
  double peak_rss_mib = 0;
  int threads = 0;  // coordinator threads with every stream open
  int registered = 0;
  int sealed = 0;
  int lost_expected = 0;
  int lost_noticed = 0;
  int finished = 0;
  int failed_worlds = 0;
  int errors = 0;
  std::string failure;  // empty: every outcome as expected
};

extern const char* const kCaseHeader;
std::string formatCaseRow(const CaseRow& row);

}  // namespace kolo::bench
