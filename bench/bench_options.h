// kolo-bench's command line, nccl-tests style:
//   kolo-bench [--op allreduce|allgather|broadcast|alltoall|reducescatter|barrier]
//              -b 4 -e 256M -f 2 -d float32 -o sum -w 5 -n 20 -c 1 [--zero-copy] [--device
//              cuda|host-emulated]
//              [--inplace] [--json FILE]
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

// The collective a run measures (--op), each with nccl-tests' size and
// busbw conventions (opMessageSizes below, busBandwidthFactor in bench_table.h).
enum class OpKind { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter, kBarrier };

inline constexpr OpKind kAllOpKinds[] = {OpKind::kAllreduce,     OpKind::kAllgather,
                                         OpKind::kBroadcast,     OpKind::kAlltoall,
                                         OpKind::kReducescatter, OpKind::kBarrier};

std::string_view opKindName(OpKind k);
// "allreduce", ...; nullopt for an unknown name.
std::optional<OpKind> parseOpKind(std::string_view s);
// Allreduce and reducescatter reduce (-o applies); the others move data.
bool opKindReduces(OpKind k);

struct BenchOptions {
  uint64_t min_bytes = 4;
  uint64_t max_bytes = uint64_t{256} << 20;
  double step_factor = 2.0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // -o, --redop
  int root = 0;                  // --root: broadcast's root rank
  int warmup_iters = 5;
  int iters = 20;
  // Per size, the timed loop is cut to about this many seconds (at least
  // min(iters, 3) iterations); 0 keeps `iters` for every size.
  double max_time_s = 0.5;
  bool check = true;
  bool zero_copy = false;
  bool in_place = false;  // allreduce (and broadcast with --device)
  // --device cuda|host-emulated: device tensors (bench/device_bench.h); "": host.
  std::string device;
  OpKind op_kind = OpKind::kAllreduce;  // --op (alias --op-kind)
  std::string json_path;
  // --idle-check S: after the sizes, every rank sleeps S seconds with no
  // collective in flight and rank 0 prints the CPU the agents and the ranks
  // used meanwhile (a daemon must not busy-poll when idle); 0: skipped.
  double idle_check_s = 0;
  // --model-step FILE: replay one training step's gradients (every
  // tensor of FILE, reverse order, async, then synchronize all) instead of
  // the size sweep; -b/-e/-f are then unused.
  std::string model_step_path;
  // --compute-ms X: with --model-step, the backward pass's compute
  // per step: before each gradient is submitted the rank sleeps its share of
  // X, in proportion to the tensor's parameter count (0: no compute).
  double compute_ms = 0;
  // --compute-profile FILE: 'name weight' lines (bench/models/*.flops): each
  // tensor's share of --compute-ms by weight (unlisted: 0) instead of by
  // parameter count.
  std::string compute_profile;
  // --blocking: with --model-step, also time the blocking
  // per-tensor loop (each tensor in reverse order, submitted and synchronized
  // before the next, as Open MPI's per-tensor MPI_Allreduce loop), interleaved with
  // the async step and the flat allreduce.
  bool model_blocking = false;

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

// One row's message as nccl-tests defines it for the op (its "size" and
// "count" columns): `bytes` is the largest buffer a rank passes, `count` the
// op's element count per rank ("paramcount"):
//   allreduce, broadcast: bytes = count * esize (the buffer)
//   allgather:     count = each rank's input; bytes = n * count * esize (the gathered output)
//   reducescatter: count = each rank's output; bytes = n * count * esize (the input)
//   alltoall:      count = the block sent to each rank; bytes = n * count * esize (the input)
//   barrier:       one message of 0 bytes, count 0
struct OpSize {
  uint64_t bytes = 0;
  uint64_t count = 0;
  bool operator==(const OpSize&) const = default;
};
// messageSizes(), then for the ops whose size is n parts: each size rounded
// down to a multiple of n elements (at least n), duplicates dropped. Barrier:
// the single {0, 0}, whatever the range.
std::vector<OpSize> opMessageSizes(OpKind kind, int nranks, uint64_t min_bytes, uint64_t max_bytes,
                                   double factor, size_t elem_size);

}  // namespace kolo::bench
