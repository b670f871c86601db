#include "bench/bench_table.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace kolo::bench {

const char* const kTableHeader =
    "#       size         count      type   redop    time(us)   algbw(GB/s)   busbw(GB/s)  #wrong"
    "    cpu-s/GB";

std::string formatRow(const Row& r) {
  char wrong[32];
  if (r.wrong) {
    std::snprintf(wrong, sizeof(wrong), "%8" PRIu64, *r.wrong);
  } else {
    std::snprintf(wrong, sizeof(wrong), "%8s", "N/A");
  }
  char cpu[32];
  if (r.cpu_per_gb) {
    std::snprintf(cpu, sizeof(cpu), "%12.4g", *r.cpu_per_gb);
  } else {
    std::snprintf(cpu, sizeof(cpu), "%12s", "N/A");
  }
  char line[256];
  std::snprintf(line, sizeof(line), "%12" PRIu64 "%14" PRIu64 "%10s%8s%12.2f%14.2f%14.2f%s%s",
                r.bytes, r.count, r.type.c_str(), r.redop.c_str(), r.time_us, r.algbw, r.busbw,
                wrong, cpu);
  return line;
}

double busBandwidthFactor(OpKind kind, int nranks) {
  if (nranks < 1) return 0.0;
  const double n = nranks;
  switch (kind) {
    case OpKind::kAllreduce:
      return 2.0 * (n - 1) / n;
    case OpKind::kAllgather:
    case OpKind::kReducescatter:
    case OpKind::kAlltoall:
      return (n - 1) / n;
    case OpKind::kBroadcast:
      return 1.0;
    case OpKind::kBarrier:
      return 0.0;  // moves no data
  }
  return 0.0;
}

double algBandwidth(uint64_t bytes, double seconds) {
  if (!(seconds > 0)) return 0.0;
  return static_cast<double>(bytes) / 1e9 / seconds;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  double hi = values[mid];
  if (values.size() % 2 == 1) return hi;
  double lo = *std::max_element(values.begin(), values.begin() + static_cast<long>(mid));
  return (lo + hi) / 2.0;
}

IterationPlan planIterations(int warmup, int iters, double max_time_s, double first_op_s) {
  IterationPlan p;
  p.warmup = std::max(1, warmup);
  p.iters = std::max(1, iters);
  if (!(max_time_s > 0) || !(first_op_s > 0)) return p;
  auto fit = [&](double budget) {
    double n = std::floor(budget / first_op_s);
    return n >= 1e6 ? 1000000 : static_cast<int>(n);
  };
  p.warmup = std::clamp(fit(max_time_s / 2), 1, p.warmup);
  p.iters = std::clamp(fit(max_time_s), std::min(p.iters, 3), p.iters);
  return p;
}

double averageBusBandwidth(const std::vector<Row>& rows) {
  if (rows.empty()) return 0.0;
  double sum = 0;
  for (const Row& r : rows) sum += r.busbw;
  return sum / static_cast<double>(rows.size());
}

}  // namespace kolo::bench
