// gloo-allreduce-bench: Gloo's ring allreduce over its TCP transport,
// measured exactly like kolo-bench and mpi-allreduce-bench, so the tables
// line up (the across-agents peer comparison):
//
//   for r in 0 1; do
//     gloo-allreduce-bench --rank $r --size 2 --store /tmp/st --host 127.0.0.1 -b 4 -e 256M &
//   done; wait
//
// Rendezvous: gloo::rendezvous::FileStore in --store (a fresh, empty
// directory shared by the ranks; compare_multi.sh makes one per run), then
// a full mesh of gloo::transport::tcp pairs bound to --host. Each operation
// is gloo::allreduce with AllreduceOptions::Algorithm::RING, float32 sum,
// out of place (--inplace: in place, no input set). Same sizes (-b/-e/-f), same iteration plan (the
// first warm-up op, max-reduced across ranks, decides how many iterations fit -T), same statistic
// (median over iterations of the slowest rank's time, the times max-reduced with a Gloo allreduce
// outside the timed region), same check data and columns (bench/bench_check.h,
// bench/bench_table.h). Rank 0 prints the table. Gloo reports errors with exceptions; they are
// caught here, in main's thread, and turned into exit status 3.
#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_options.h"
#include "bench/bench_table.h"
#include "bench/cpu_usage.h"

namespace kolo::bench {
namespace {

struct GlooOptions {
  int rank = -1;
  int size = 0;
  std::string store;
  std::string host = "127.0.0.1";
  std::string iface;
  int timeout_s = 300;
  BenchOptions bench;
};

constexpr const char* kGlooUsage =
    "gloo-allreduce-bench: Gloo ring allreduce over TCP, kolo-bench's table and method\n"
    "Usage: gloo-allreduce-bench --rank R --size N --store DIR [--host ADDR] [bench options]\n"
    "Start N of them (ranks 0..N-1) with the same --store directory. Bench options:\n"
    "-b -e -f -w -n -T -c --json as kolo-bench (float32 sum only).";

StatusOr<GlooOptions> parseGlooArgs(int argc, char** argv) {
  GlooOptions g;
  CLI::App app(kGlooUsage, "gloo-allreduce-bench");
  app.allow_extras();
  app.set_help_flag();  // --help is answered below, with both option lists
  bool help = false;
  app.add_flag("-h,--help", help, "Print this help and exit");
  app.add_option("--rank", g.rank, "This process's rank (0..size-1)");
  app.add_option("--size", g.size, "Number of ranks");
  app.add_option("--store", g.store, "Directory for gloo::rendezvous::FileStore (fresh, shared)");
  app.add_option("--host", g.host, "Address the TCP transport binds to")->capture_default_str();
  app.add_option("--iface", g.iface, "Network interface instead of --host (e.g. lo, veth0)");
  app.add_option("--timeout-s", g.timeout_s, "Gloo's timeout for rendezvous and each operation")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return invalidArgument(std::string(e.what()) + " (see --help)");
  }
  ASSIGN_OR_RETURN(g.bench, parseBenchArgs(app.remaining()));
  if (help || g.bench.help) {
    g.bench.help = true;
    g.bench.help_text = app.help() + "\nBench options (as kolo-bench):\n" +
                        parseBenchArgs({"--help"}).value().help_text;
    return g;
  }
  if (g.size < 1) return invalidArgument("--size N (>= 1) is required");
  if (g.rank < 0 || g.rank >= g.size) return invalidArgument("--rank must be in 0..size-1");
  if (g.store.empty()) return invalidArgument("--store DIR is required");
  if (g.timeout_s < 1) return invalidArgument("--timeout-s must be >= 1");
  if (g.bench.op_kind != OpKind::kAllreduce) {
    return invalidArgument("gloo-allreduce-bench measures --op allreduce only");
  }
  if (g.bench.dtype != DataType::kFloat32 || g.bench.op != ReduceOp::kSum) {
    return invalidArgument("only -d float32 -o sum (like mpi-allreduce-bench's allreduce)");
  }
  if (g.bench.zero_copy || !g.bench.model_step_path.empty()) {
    return invalidArgument("--zero-copy and --model-step are kolo-bench options");
  }
  return g;
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
void allreduceGloo(const std::shared_ptr<gloo::Context>& ctx, const T* in, T* out, size_t count,
                   ReduceFn fn) {
  gloo::AllreduceOptions opts(ctx);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  if (in != out) opts.setInput(const_cast<T*>(in), count);
  opts.setOutput(out, count);
  opts.setReduceFunction(fn);
  gloo::allreduce(opts);
}

void maxAcrossRanks(const std::shared_ptr<gloo::Context>& ctx, std::vector<double>& v) {
  allreduceGloo<double>(ctx, v.data(), v.data(), v.size(), &gloo::max<double>);
}

void sumAcrossRanks(const std::shared_ptr<gloo::Context>& ctx, std::vector<int64_t>& v) {
  allreduceGloo<int64_t>(ctx, v.data(), v.data(), v.size(), &gloo::sum<int64_t>);
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Row runSize(const std::shared_ptr<gloo::Context>& ctx, const BenchOptions& o,
            const CheckPattern& pattern, float* send, float* recv, uint64_t bytes) {
  const uint64_t count = bytes / sizeof(float);
  auto once = [&] { allreduceGloo<float>(ctx, send, recv, count, &gloo::sum<float>); };
  fillInput(pattern, ctx->rank, send, count);
  if (recv != send) fillValue(DataType::kFloat32, recv, count, 0.0);

  std::vector<double> first(1);
  auto t0 = std::chrono::steady_clock::now();
  once();
  first[0] = secondsSince(t0);
  maxAcrossRanks(ctx, first);
  IterationPlan plan = planIterations(o.warmup_iters, o.iters, o.max_time_s, first[0]);
  for (int i = 1; i < plan.warmup; ++i) once();
  std::vector<double> times(static_cast<size_t>(plan.iters));
  const double cpu0 = selfCpuSeconds();
  for (double& t : times) {
    auto t1 = std::chrono::steady_clock::now();
    once();
    t = secondsSince(t1);
  }
  std::vector<int64_t> cpu_ns = {static_cast<int64_t>((selfCpuSeconds() - cpu0) * 1e9)};
  maxAcrossRanks(ctx, times);
  sumAcrossRanks(ctx, cpu_ns);

  Row row;
  row.bytes = bytes;
  row.count = count;
  row.type = "float32";
  row.redop = "sum";
  double seconds = median(times);
  row.time_us = seconds * 1e6;
  row.algbw = algBandwidth(bytes, seconds);
  row.busbw = row.algbw * busBandwidthFactor(OpKind::kAllreduce, ctx->size);
  row.warmup = plan.warmup;
  row.iters = plan.iters;
  row.cpu_per_gb = cpuSecondsPerGB(static_cast<double>(cpu_ns[0]) * 1e-9, bytes, plan.iters);
  if (o.check && pattern.feasible) {
    fillInput(pattern, ctx->rank, send, count);
    if (recv != send) fillValue(DataType::kFloat32, recv, count, 0.0);
    once();
    std::vector<int64_t> wrong = {static_cast<int64_t>(countWrong(pattern, recv, count))};
    if (wrong[0] != 0) {
      std::fprintf(stderr, "gloo-allreduce-bench: rank %d: %" PRId64 " wrong elements at size %" PRIu64 "\n",
                   ctx->rank, wrong[0], bytes);
    }
    sumAcrossRanks(ctx, wrong);
    row.wrong = static_cast<uint64_t>(wrong[0]);
  }
  return row;
}

Status writeJson(const GlooOptions& g, const std::vector<Row>& rows, double avg) {
  nlohmann::json j = {{"benchmark", "gloo-allreduce-bench"}, {"op_kind", "allreduce"},
                      {"nranks", g.size},  {"dtype", "float32"}, {"op", "sum"},
                      {"transport", "tcp"}, {"host", g.iface.empty() ? g.host : g.iface},
                      {"algorithm", "ring"}, {"avg_busbw_gbps", avg}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json jr = {{"size", r.bytes},       {"count", r.count},     {"type", r.type},
                         {"redop", r.redop},      {"time_us", r.time_us}, {"algbw_gbps", r.algbw},
                         {"busbw_gbps", r.busbw}, {"warmup", r.warmup},   {"iters", r.iters}};
    jr["wrong"] = r.wrong ? nlohmann::json(*r.wrong) : nlohmann::json(nullptr);
    jr["cpu_s_per_gb"] = r.cpu_per_gb ? nlohmann::json(*r.cpu_per_gb) : nlohmann::json(nullptr);
    j["rows"].push_back(jr);
  }
  std::ofstream f(g.bench.json_path);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) return internalError("cannot write --json file " + g.bench.json_path);
  return okStatus();
}

int run(const GlooOptions& g) {
  const BenchOptions& o = g.bench;
  std::vector<uint64_t> sizes = messageSizes(o.min_bytes, o.max_bytes, o.step_factor, sizeof(float));
  const uint64_t max_count = sizes.back() / sizeof(float);
  std::vector<float> send(max_count), recv(max_count);

  gloo::transport::tcp::attr attr;
  if (g.iface.empty()) {
    attr.hostname = g.host;
  } else {
    attr.iface = g.iface;
  }
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(g.store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(g.rank, g.size);
  ctx->setTimeout(std::chrono::seconds(g.timeout_s));
  ctx->connectFullMesh(store, dev);
  std::shared_ptr<gloo::Context> base = ctx;
  const CheckPattern pattern = CheckPattern::make(DataType::kFloat32, ReduceOp::kSum, g.size);

  if (g.rank == 0) {
    std::printf("# gloo-allreduce-bench allreduce: nranks %d, gloo::allreduce ring over "
                "gloo::transport::tcp (%s), rendezvous FileStore\n",
                g.size, dev->str().c_str());
    std::printf("# dtype float32, op sum, %s\n", o.in_place ? "in place" : "out of place");
    std::printf("# minBytes %" PRIu64 " maxBytes %" PRIu64
                " step: %g(factor) warmup iters: %d iters: %d (cut to ~%g s per size) validation: %d\n",
                sizes.front(), sizes.back(), o.step_factor, o.warmup_iters, o.iters, o.max_time_s,
                o.check ? 1 : 0);
    std::printf("# time = median over iterations of the slowest rank's time per operation\n");
    std::printf("# %s (Gloo has no agent: its ranks)\n#\n%s\n", kCpuColumnDefinition, kTableHeader);
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  uint64_t total_wrong = 0;
  for (uint64_t bytes : sizes) {
    rows.push_back(runSize(base, o, pattern, send.data(), o.in_place ? send.data() : recv.data(), bytes));
    total_wrong += rows.back().wrong.value_or(0);
    if (g.rank == 0) {
      std::printf("%s\n", formatRow(rows.back()).c_str());
      std::fflush(stdout);
    }
  }
  if (g.rank == 0) {
    double avg = averageBusBandwidth(rows);
    std::printf("# Out of bounds values : %" PRIu64 " %s\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth : %g\n", avg);
    std::printf("# Latency (%" PRIu64 " B allreduce, median of the slowest rank) : %.2f us\n#\n",
                rows.front().bytes, rows.front().time_us);
    std::fflush(stdout);
    if (!o.json_path.empty()) {
      Status st = writeJson(g, rows, avg);
      if (!st.isOk()) {
        std::fprintf(stderr, "gloo-allreduce-bench: %s\n", st.message().c_str());
        return 2;
      }
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kolo::bench

int main(int argc, char** argv) {
  auto g = kolo::bench::parseGlooArgs(argc, argv);
  if (!g.isOk()) {
    std::fprintf(stderr, "gloo-allreduce-bench: %s\n", g.status().message().c_str());
    return 2;
  }
  if (g->bench.help) {
    std::printf("%s", g->bench.help_text.c_str());
    return 0;
  }
  try {
    return kolo::bench::run(*g);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo-allreduce-bench: rank %d: %s\n", g->rank, e.what());
    return 3;
  }
}
