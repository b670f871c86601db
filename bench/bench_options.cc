#include "bench/bench_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace kolo::bench {

namespace {

constexpr const char* kUsage =
    "kolo-bench: collective benchmark over libkolo, nccl-tests style\n"
    "Usage: kolorun -np N -- kolo-bench [options]\n"
    "Rank 0 prints one row per message size: the median over iterations of the\n"
    "slowest rank's time per operation, algbw = size / time and busbw = algbw *\n"
    "factor (nccl-tests: allreduce 2(n-1)/n; allgather, reducescatter, alltoall\n"
    "(n-1)/n; broadcast 1), and cpu-s/GB = CPU seconds of every rank and agent over\n"
    "the timed iterations / (size x iterations / 1e9). See docs/bench-tools.md.";

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::string_view opKindName(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAlltoall:
      return "alltoall";
    case OpKind::kReducescatter:
      return "reducescatter";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

std::optional<OpKind> parseOpKind(std::string_view s) {
  for (OpKind k : kAllOpKinds) {
    if (opKindName(k) == s) return k;
  }
  return std::nullopt;
}

bool opKindReduces(OpKind k) { return k == OpKind::kAllreduce || k == OpKind::kReducescatter; }

StatusOr<uint64_t> parseByteSize(std::string_view s) {
  std::string t = lower(s);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits == 0 || digits > 19) {
    return invalidArgument("bad size '" + std::string(s) +
                           "': expected a number with an optional K/M/G suffix");
  }
  uint64_t value = std::stoull(t.substr(0, digits));
  std::string suffix = t.substr(digits);
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else {
    return invalidArgument("bad size '" + std::string(s) + "': unknown suffix '" + suffix +
                           "' (use K, M or G)");
  }
  if (value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return invalidArgument("size '" + std::string(s) + "' is too large");
  }
  return value << shift;
}

std::string formatByteSize(uint64_t bytes) {
  if (bytes != 0 && bytes % (uint64_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes != 0 && bytes % (uint64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes != 0 && bytes % (uint64_t{1} << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

std::optional<DataType> parseBenchDataType(std::string_view s) {
  std::string t = lower(s);
  if (t == "int") return DataType::kInt32;
  if (t == "bf16") return DataType::kBFloat16;
  if (t == "fp16") return DataType::kFloat16;
  return parseDataType(t);
}

std::optional<ReduceOp> parseBenchReduceOp(std::string_view s) {
  std::string t = lower(s);
  if (t == "avg") return ReduceOp::kAverage;
  if (t == "prod") return ReduceOp::kProduct;
  return parseReduceOp(t);
}

StatusOr<BenchOptions> parseBenchArgs(const std::vector<std::string>& args) {
  BenchOptions o;
  std::string min_s = "4", max_s = "256M", dtype_s = "float32", op_s = "sum", kind_s = "allreduce";
  int check = 1;

  CLI::App app(kUsage, "kolo-bench");
  app.set_version_flag("--version", "kolo-bench " KOLO_VERSION);
  app.add_option("-b,--minbytes", min_s, "Smallest message size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "Largest message size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor, "Multiply the size by this between rows (> 1)")
      ->capture_default_str();
  app.add_option("-d,--dtype", dtype_s,
                 "float16 bfloat16 float32 float64 int8 uint8 int32 int64 (or half, float, double)")
      ->capture_default_str();
  app.add_option("--op,--op-kind", kind_s,
                 "Collective: allreduce allgather broadcast alltoall reducescatter barrier")
      ->capture_default_str();
  app.add_option("-o,--redop", op_s,
                 "Reduction of allreduce and reducescatter: sum average min max product")
      ->capture_default_str();
  app.add_option("--root", o.root, "Broadcast's root rank")->capture_default_str();
  app.add_option("-w,--warmup-iters", o.warmup_iters,
                 "Untimed iterations per size (at least 1 runs)")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters,
                 "Timed iterations per size (fewer for large sizes, see --max-time)")
      ->capture_default_str();
  app.add_option("-T,--max-time", o.max_time_s,
                 "Seconds of timed loop per size before the iteration count is cut (0: never cut)")
      ->capture_default_str();
  app.add_option("-c,--check", check, "1: verify every element of the result on every rank")
      ->capture_default_str();
  app.add_flag("--zero-copy", o.zero_copy,
               "Allocate the buffers with kolo_alloc_shared (no copy-in/copy-out)");
  app.add_flag("--inplace", o.in_place,
               "Allreduce in place (output == input) instead of out of place");
  app.add_option(
      "--device", o.device,
      "Device tensors: 'cuda' or 'host-emulated' (the test emulation, test builds: "
      "CPU timings, not GPU figures); buffers are device memory (--zero-copy: "
      "kolo_device_alloc), each op ends with a stream synchronize (bench/device_bench.h)");
  app.add_option("--json", o.json_path, "Also write rank 0's rows to this JSON file");
  app.add_option("--idle-check", o.idle_check_s,
                 "After the sizes, sleep S seconds with no collective in flight and print the CPU "
                 "the agents and ranks used meanwhile (0: skip)")
      ->capture_default_str();
  app.add_option("--model-step", o.model_step_path,
                 "Model-step mode: FILE lists a model's tensors ('name count' per line, e.g. "
                 "bench/models/resnet50.txt); each step allreduces all of them in reverse order "
                 "(async, then synchronize all), compared with one flat allreduce of the same size");
  app.add_option("--compute-ms", o.compute_ms,
                 "Model-step mode: backward compute per step in ms, slept before each gradient's "
                 "submission in proportion to its parameter count; adds the compute-only step time "
                 "and the scaling efficiency (compute-only / step) to the output (0: none)");
  app.add_option("--compute-profile", o.compute_profile,
                 "With --compute-ms: FILE of 'name weight' lines (e.g. bench/models/resnet50.flops); each "
                 "gradient's compute is its share of --compute-ms by weight (unlisted tensors: 0) instead "
                 "of by parameter count");
  app.add_flag("--blocking", o.model_blocking,
               "Model-step mode: also time the blocking per-tensor loop (each tensor in reverse order, "
               "kolo_allreduce_async + kolo_synchronize, one at a time), interleaved with the async step and the flat allreduce");

  std::vector<const char*> argv = {"kolo-bench"};
  for (auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    o.help = true;
    o.help_text = app.help();
    return o;
  } catch (const CLI::CallForVersion&) {
    o.help = true;  // printed like --help: to stdout, exit 0
    o.help_text = "kolo-bench " KOLO_VERSION "\n";
    return o;
  } catch (const CLI::ParseError& e) {
    return invalidArgument(std::string(e.what()) + " (see kolo-bench --help)");
  }

  ASSIGN_OR_RETURN(o.min_bytes, parseByteSize(min_s));
  ASSIGN_OR_RETURN(o.max_bytes, parseByteSize(max_s));
  if (o.min_bytes == 0) return invalidArgument("--minbytes must be at least 1");
  if (o.max_bytes < o.min_bytes) {
    return invalidArgument("--maxbytes (" + max_s + ") is below --minbytes (" + min_s + ")");
  }
  if (!(o.step_factor > 1.0) || !std::isfinite(o.step_factor)) {
    return invalidArgument("--stepfactor must be greater than 1");
  }
  auto dt = parseBenchDataType(dtype_s);
  if (!dt) return invalidArgument("unknown --dtype '" + dtype_s + "'");
  o.dtype = *dt;
  auto op = parseBenchReduceOp(op_s);
  if (!op)
    return invalidArgument("unknown -o/--redop '" + op_s + "' (sum average min max product)");
  o.op = *op;
  auto kind = parseOpKind(lower(kind_s));
  if (!kind) {
    std::string hint = parseBenchReduceOp(kind_s)
                           ? "; --op names the collective, the reduction is -o/--redop"
                           : "";
    return invalidArgument("unknown --op '" + kind_s +
                           "' (allreduce allgather broadcast alltoall reducescatter barrier" +
                           hint + ")");
  }
  o.op_kind = *kind;
  if (!o.device.empty() && o.device != "cuda" && o.device != "host-emulated") {
    return invalidArgument("unknown --device '" + o.device + "' (cuda host-emulated)");
  }
  if (!o.device.empty() && (o.op_kind == OpKind::kBarrier || !o.model_step_path.empty())) {
    return invalidArgument(
        "--device is for the collectives with data (not barrier, not --model-step)");
  }
  if (o.in_place && o.op_kind != OpKind::kAllreduce &&
      !(o.op_kind == OpKind::kBroadcast && !o.device.empty())) {
    return invalidArgument(
        "--inplace is for --op allreduce (and broadcast with --device; on the host "
        "broadcast is always in place; " +
        kind_s + " has no in-place form here)");
  }
  if (o.root < 0) return invalidArgument("--root must be >= 0");
  if (o.warmup_iters < 0) return invalidArgument("--warmup-iters must be >= 0");
  if (o.iters < 1) return invalidArgument("--iters must be >= 1");
  if (!(o.max_time_s >= 0) || !std::isfinite(o.max_time_s)) {
    return invalidArgument("--max-time must be >= 0 seconds");
  }
  if (!(o.idle_check_s >= 0) || !std::isfinite(o.idle_check_s)) {
    return invalidArgument("--idle-check must be >= 0 seconds");
  }
  if (check != 0 && check != 1) return invalidArgument("--check takes 0 or 1");
  o.check = check == 1;
  if (!(o.compute_ms >= 0) || !std::isfinite(o.compute_ms)) {
    return invalidArgument("--compute-ms must be >= 0");
  }
  if (!o.model_step_path.empty() && o.op_kind != OpKind::kAllreduce) {
    return invalidArgument("--model-step replays allreduces only");
  }
  if (o.model_blocking && o.model_step_path.empty()) {
    return invalidArgument("--blocking is for --model-step");
  }
  return o;
}

std::vector<uint64_t> messageSizes(uint64_t min_bytes, uint64_t max_bytes, double factor,
                                   size_t elem_size) {
  std::vector<uint64_t> out;
  if (elem_size == 0 || min_bytes == 0 || !(factor > 1.0)) return out;
  uint64_t size = min_bytes;
  while (size <= max_bytes) {
    uint64_t bytes = std::max<uint64_t>(elem_size, size / elem_size * elem_size);
    if (out.empty() || out.back() != bytes) out.push_back(bytes);
    double next = std::floor(static_cast<double>(size) * factor);
    if (next >= 1.8e19) break;
    size = std::max<uint64_t>(size + 1, static_cast<uint64_t>(next));
  }
  return out;
}

std::vector<OpSize> opMessageSizes(OpKind kind, int nranks, uint64_t min_bytes, uint64_t max_bytes,
                                   double factor, size_t elem_size) {
  std::vector<OpSize> out;
  if (kind == OpKind::kBarrier) {
    out.push_back({0, 0});
    return out;
  }
  const uint64_t n = static_cast<uint64_t>(std::max(1, nranks));
  const bool parts =
      kind == OpKind::kAllgather || kind == OpKind::kReducescatter || kind == OpKind::kAlltoall;
  for (uint64_t bytes : messageSizes(min_bytes, max_bytes, factor, elem_size)) {
    OpSize s;
    if (parts) {
      s.count = std::max<uint64_t>(1, bytes / elem_size / n);
      s.bytes = s.count * n * elem_size;
    } else {
      s.count = bytes / elem_size;
      s.bytes = bytes;
    }
    if (out.empty() || !(out.back() == s)) out.push_back(s);
  }
  return out;
}

}  // namespace kolo::bench
