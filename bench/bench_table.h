// The nccl-tests table: column header, rows, bandwidth conventions, the
// per-size iteration plan and the statistics. Pure functions, unit-tested;
// mpi_allreduce_bench.c prints the same columns with the same widths.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_options.h"

namespace kolo::bench {

// nccl-tests' column names (one line; widths 12 14 10 8 12 14 14 8) and
// one more, cpu-s/GB (width 12): kCpuColumnDefinition in cpu_usage.h.
extern const char* const kTableHeader;

struct Row {
  uint64_t bytes = 0;             // message size (nccl-tests' "size" column)
  uint64_t count = 0;             // elements
  std::string type;               // "float32" ("none" for barrier)
  std::string redop;              // "sum" ("none" for the ops that do not reduce)
  double time_us = 0;             // median over iterations of the slowest rank's time
  double algbw = 0;               // GB/s (1e9 bytes per second)
  double busbw = 0;               // GB/s
  std::optional<uint64_t> wrong;  // nullopt: not checked (printed N/A)
  // CPU seconds of every rank and agent over the timed iterations per GB
  // (bytes x iters / 1e9); nullopt: not measured (printed N/A).
  std::optional<double> cpu_per_gb;
  int warmup = 0;
  int iters = 0;
};

std::string formatRow(const Row& r);

// nccl-tests' busbw = algbw * factor:
//   allreduce 2(n-1)/n, reducescatter and allgather (n-1)/n, alltoall (n-1)/n,
//   broadcast 1, barrier 0 (no data). Sizes as opMessageSizes (bench_options.h)
//   defines them, so algbw = size / time for every op. n == 1 gives 0 except
//   broadcast.
double busBandwidthFactor(OpKind kind, int nranks);
// GB/s for `bytes` in `seconds` (0 when seconds <= 0).
double algBandwidth(uint64_t bytes, double seconds);

// Median of the values (mean of the middle two for an even count); 0 if empty.
double median(std::vector<double> values);

// How many iterations a size gets, from the slowest rank's time of its
// first warm-up operation (every rank computes the same plan from the same
// agreed number): all of `warmup` (at least 1) and `iters` if they fit
// max_time/2 and max_time respectively; otherwise as many as fit, but at
// least 1 warm-up and min(iters, 3) timed iterations. max_time <= 0 keeps both.
struct IterationPlan {
  int warmup = 1;  // including the first one, already run
  int iters = 1;
};
IterationPlan planIterations(int warmup, int iters, double max_time_s, double first_op_s);

// "# Avg bus bandwidth : X" over the rows (nccl-tests' closing line).
double averageBusBandwidth(const std::vector<Row>& rows);

}  // namespace kolo::bench
