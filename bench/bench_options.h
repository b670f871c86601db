// kolo-bench's command line, nccl-tests style:
//   kolo-bench -b 4 -e 256M -f 2 -d float32 -o sum -w 5 -n 20 -c 1 [--zero-copy] [--json FILE]
// Pure parsing (no kolo calls), so it is unit-tested.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kolo::bench {

// The collective a run measures. Only allreduce runs today; the others are
// listed so that issue 5 can add them with nccl-tests' busbw conventions
// (see busBandwidthFactor in bench_table.h).
enum class OpKind { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter };

std::string_view opKindName(OpKind k);
// "allreduce", ...; nullopt for an unknown name.
std::optional<OpKind> parseOpKind(std::string_view s);
// True for the kinds kolo-bench can run now.
bool opKindImplemented(OpKind k);

struct BenchOptions {
  uint64_t min_bytes = 4;
  uint64_t max_bytes = uint64_t{256} << 20;
  double step_factor = 2.0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int warmup_iters = 5;
  int iters = 20;
  // Per size, the timed loop is cut to about this many seconds (at least
  // min(iters, 3) iterations); 0 keeps `iters` for every size.
  double max_time_s = 0.5;
  bool check = true;
  bool zero_copy = false;
  bool in_place = false;
  OpKind op_kind = OpKind::kAllreduce;
  std::string json_path;
  // --model-step FILE (issue 4): replay one training step's gradients (every
  // tensor of FILE, reverse order, async, then synchronize all) instead of
  // the size sweep; -b/-e/-f are then unused.
  std::string model_step_path;

  bool help = false;  // --help: print help_text and exit 0
  std::string help_text;
};

// "4", "64K", "256M", "1G", "8KB", "2MiB" (binary multiples, case-insensitive).
StatusOr<uint64_t> parseByteSize(std::string_view s);
// 4 -> "4", 65536 -> "64K", 268435456 -> "256M" (exact multiples only).
std::string formatByteSize(uint64_t bytes);
// nccl-tests' names and ours: float16/half, bfloat16, float32/float, float64/double,
// int8, uint8, int32/int, int64.
std::optional<DataType> parseBenchDataType(std::string_view s);
// sum, average/avg, min, max, product/prod.
std::optional<ReduceOp> parseBenchReduceOp(std::string_view s);

// `args` excludes the program name.
StatusOr<BenchOptions> parseBenchArgs(const std::vector<std::string>& args);

// The message sizes of a run: min, min*f, ... up to max (max itself is not
// added when the steps miss it, as in nccl-tests), each rounded down to a
// whole number of elements of `elem_size` bytes (at least one element),
// duplicates dropped.
std::vector<uint64_t> messageSizes(uint64_t min_bytes, uint64_t max_bytes, double factor,
                                   size_t elem_size);

}  // namespace kolo::bench
