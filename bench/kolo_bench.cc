// kolo-bench: an nccl-tests style collective benchmark over libkolo's C ABI.
//
//   kolorun -np 2 -- kolo-bench -b 4 -e 256M -f 2 -d float32 -o sum -c 1
//   kolorun -np 4 -- kolo-bench --op allgather -b 1K -e 64M
//
// --op picks the collective: allreduce (default), allgather, broadcast,
// alltoall, reducescatter or barrier. For each message size (sizes as
// nccl-tests defines them per op, opMessageSizes) every rank runs warm-up
// iterations, then times each of `iters` iterations of one blocking
// operation (submit + kolo_synchronize, and for allgather / alltoall
// kolo_result + kolo_release). The per-iteration times are max-reduced across
// ranks with a small kolo allreduce (outside the timed region) and rank 0
// prints the median of those maxima, algbw = size / time and busbw = algbw *
// nccl-tests' factor for the op. With -c 1 a separate, untimed operation on
// exactly representable data is verified element by element on every rank
// against a reference (bench_check.h); #wrong sums the wrong elements of all
// ranks and any wrong element makes the exit status non-zero. A barrier is
// checked by entering it late on the last rank: #wrong counts the ranks that
// left it before the last rank had entered.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_options.h"
#include "bench/bench_table.h"
#include "bench/cpu_usage.h"
#include "bench/device_bench.h"
#include "bench/kolo_session.h"
#include "bench/model_step_run.h"
#include "common/dtype.h"

namespace kolo::bench {
namespace {

// How late the last rank enters the barrier of a barrier check.
constexpr auto kBarrierLateEntry = std::chrono::milliseconds(5);

struct Run {
  BenchOptions opts;
  KoloSession* kolo = nullptr;
  int rank = 0;
  int size = 1;
  CheckPattern pattern;  // reducing ops
  void* send = nullptr;
  void* recv = nullptr;  // == send in place
  // --device: the device buffers the ops use (send/recv are then their host
  // mirrors, for the check), each `buf_bytes` long.
  DeviceBench* dev = nullptr;
  void* dsend = nullptr;
  void* drecv = nullptr;
  uint64_t buf_bytes = 0;
  // Local rank 0 measures its agent's CPU (the others leave it unset); a
  // local rank 0 whose agent was not found makes the CPU column N/A.
  bool measures_agent = false;
  std::optional<pid_t> agent_pid;
};

// CPU seconds so far of this rank and (local rank 0) of its agent, in ns,
// and 1 in the second slot when this rank should have read its agent and
// could not.
std::vector<int64_t> cpuNow(const Run& run) {
  double cpu = selfCpuSeconds();
  int64_t missing = 0;
  if (run.measures_agent) {
    std::optional<double> agent =
        run.agent_pid ? processCpuSeconds(*run.agent_pid) : std::optional<double>();
    if (agent) {
      cpu += *agent;
    } else {
      missing = 1;
    }
  }
  return {static_cast<int64_t>(cpu * 1e9), missing};
}

// Every rank's and agent's CPU seconds between two cpuNow() readings, summed
// across ranks (a small kolo allreduce: call it outside timed regions);
// nullopt when an agent could not be read.
StatusOr<std::optional<double>> cpuAcrossRanks(Run& run, const std::string& name,
                                               const std::vector<int64_t>& before,
                                               const std::vector<int64_t>& after) {
  std::vector<int64_t> v = {after[0] - before[0], after[1] + before[1]};
  RETURN_IF_ERROR(run.kolo->sumAcrossRanks(name, v));
  if (v[1] != 0) return std::optional<double>();
  return std::optional<double>(static_cast<double>(v[0]) * 1e-9);
}

// Tensor names: one per purpose and size, the same on every rank.
std::string opName(std::string_view what, uint64_t bytes) {
  return "kolo-bench." + std::string(what) + "." + std::to_string(bytes);
}

char* at(void* buf, uint64_t elems, DataType dtype) {
  return static_cast<char*>(buf) + elems * dataTypeSize(dtype);
}

// One operation of the run's collective. `keep`: allgather and alltoall copy
// the library-owned result into run.recv (for the check); timed operations
// leave it where the library put it.
Status runOnceOn(Run& run, const OpSize& s, const std::string& name, bool keep, void* send,
                 void* recv) {
  const BenchOptions& o = run.opts;
  KoloSession& k = *run.kolo;
  switch (o.op_kind) {
    case OpKind::kAllreduce:
      return k.allreduce(name, send, recv, s.count, o.dtype, o.op);
    case OpKind::kBroadcast:
      if (run.dev != nullptr && send != recv)
        return k.broadcastOop(name, send, recv, s.count, o.dtype, o.root);
      return k.broadcast(name, send, s.count, o.dtype, o.root);
    case OpKind::kAllgather:
      return k.allgather(name, send, s.count, o.dtype, keep ? run.recv : nullptr);
    case OpKind::kAlltoall:
      return k.alltoall(name, send, s.count, o.dtype, keep ? run.recv : nullptr);
    case OpKind::kReducescatter:
      return k.reducescatter(name, send, recv, s.count * static_cast<uint64_t>(run.size), o.dtype,
                             o.op);
    case OpKind::kBarrier:
      return k.barrier();
  }
  return internalError("unknown op kind");
}

// The op on the run's buffers; with --device on the device ones, then the
// stream synchronized (the time includes the device work).
Status runOnce(Run& run, const OpSize& s, const std::string& name, bool keep) {
  if (run.dev == nullptr) return runOnceOn(run, s, name, keep, run.send, run.recv);
  RETURN_IF_ERROR(runOnceOn(run, s, name, keep, run.dsend, run.drecv));
  return run.dev->sync();
}

// --device: the host mirrors to the device buffers (after fillBuffers) and back.
Status toDevice(Run& run) {
  if (run.dev == nullptr) return okStatus();
  RETURN_IF_ERROR(run.dev->upload(run.dsend, run.send, run.buf_bytes));
  if (run.drecv != run.dsend) RETURN_IF_ERROR(run.dev->upload(run.drecv, run.recv, run.buf_bytes));
  return okStatus();
}
// (allgather / alltoall: their result is the library's, copied into the
// host `recv` by runOnce already.)
Status fromDevice(Run& run) {
  if (run.dev == nullptr) return okStatus();
  RETURN_IF_ERROR(run.dev->download(run.send, run.dsend, run.buf_bytes));
  const bool gathered =
      run.opts.op_kind == OpKind::kAllgather || run.opts.op_kind == OpKind::kAlltoall;
  if (run.drecv != run.dsend && !gathered)
    RETURN_IF_ERROR(run.dev->download(run.recv, run.drecv, run.buf_bytes));
  return okStatus();
}

// This rank's input for the op (checkable data) and a poisoned output.
void fillBuffers(Run& run, const OpSize& s) {
  const BenchOptions& o = run.opts;
  const uint64_t n = static_cast<uint64_t>(run.size);
  switch (o.op_kind) {
    case OpKind::kAllreduce:
      fillInput(run.pattern, run.rank, run.send, s.count);
      if (run.recv != run.send) fillValue(o.dtype, run.recv, s.count, 0.0);
      break;
    case OpKind::kReducescatter:
      fillInput(run.pattern, run.rank, run.send, s.count * n);
      fillValue(o.dtype, run.recv, s.count, 0.0);
      break;
    case OpKind::kAllgather:
    case OpKind::kBroadcast:
      // Broadcast: the root's data, and on the others data that must be overwritten.
      fillMoved(o.dtype, run.rank, 0, run.send, s.count);
      if (o.op_kind == OpKind::kAllgather) fillValue(o.dtype, run.recv, s.count * n, 0.0);
      if (o.op_kind == OpKind::kBroadcast && run.recv != run.send)  // --device, out of place
        fillValue(o.dtype, run.recv, s.count, 0.0);
      break;
    case OpKind::kAlltoall:
      for (uint64_t d = 0; d < n; ++d) {
        fillMoved(o.dtype, run.rank, static_cast<int>(d), at(run.send, d * s.count, o.dtype),
                  s.count);
      }
      fillValue(o.dtype, run.recv, s.count * n, 0.0);
      break;
    case OpKind::kBarrier:
      break;
  }
}

// Wrong elements of this rank's output against the reference.
uint64_t countWrongOutput(const Run& run, const OpSize& s) {
  const BenchOptions& o = run.opts;
  const uint64_t n = static_cast<uint64_t>(run.size);
  uint64_t wrong = 0;
  switch (o.op_kind) {
    case OpKind::kAllreduce:
      return countWrong(run.pattern, run.recv, s.count);
    case OpKind::kReducescatter:
      return countWrong(run.pattern, run.recv, s.count, static_cast<uint64_t>(run.rank) * s.count);
    case OpKind::kBroadcast:
      return countWrongMoved(o.dtype, o.root, 0, run.recv, s.count);  // == send in place
    case OpKind::kAllgather:
    case OpKind::kAlltoall:
      for (uint64_t src = 0; src < n; ++src) {
        // Allgather: block src is src's input; alltoall: the block src sent to this rank.
        int dst = o.op_kind == OpKind::kAlltoall ? run.rank : 0;
        wrong += countWrongMoved(o.dtype, static_cast<int>(src), dst,
                                 at(run.recv, src * s.count, o.dtype), s.count);
      }
      return wrong;
    case OpKind::kBarrier:
      break;
  }
  return 0;
}

// The barrier check: the last rank enters kBarrierLateEntry late; 1 on every
// rank that left the barrier before the last rank had entered it. Times come
// from steady_clock, which the ranks of one host share.
StatusOr<uint64_t> checkBarrier(Run& run) {
  RETURN_IF_ERROR(run.kolo->barrier());  // line the ranks up
  if (run.rank == run.size - 1) std::this_thread::sleep_for(kBarrierLateEntry);
  auto since_epoch = [] {
    return std::chrono::duration<double>(KoloSession::now().time_since_epoch()).count();
  };
  std::vector<double> entered = {since_epoch()};
  RETURN_IF_ERROR(run.kolo->barrier());
  double left = since_epoch();
  RETURN_IF_ERROR(run.kolo->maxAcrossRanks(opName("barrier-entered", 0), entered));
  if (left < entered[0]) {
    std::fprintf(stderr,
                 "kolo-bench: rank %d left the barrier %.1f us before the last rank entered it\n",
                 run.rank, (entered[0] - left) * 1e6);
    return 1;
  }
  return 0;
}

// One size: warm-up, timed loop, agreement on the times, optional check.
StatusOr<Row> runSize(Run& run, const OpSize& s) {
  const BenchOptions& o = run.opts;
  const std::string name = opName(opKindName(o.op_kind), s.bytes);
  auto once = [&]() { return runOnce(run, s, name, false); };

  fillBuffers(run, s);
  RETURN_IF_ERROR(toDevice(run));

  // The first warm-up op, timed, decides how many iterations this size gets.
  std::vector<double> first(1);
  {
    auto t0 = KoloSession::now();
    RETURN_IF_ERROR(once());
    first[0] = KoloSession::secondsSince(t0);
  }
  RETURN_IF_ERROR(run.kolo->maxAcrossRanks(opName("warmup", s.bytes), first));
  IterationPlan plan = planIterations(o.warmup_iters, o.iters, o.max_time_s, first[0]);
  for (int i = 1; i < plan.warmup; ++i) RETURN_IF_ERROR(once());

  std::vector<double> times(static_cast<size_t>(plan.iters));
  const std::vector<int64_t> cpu0 = cpuNow(run);
  for (double& t : times) {
    auto t0 = KoloSession::now();
    RETURN_IF_ERROR(once());
    t = KoloSession::secondsSince(t0);
  }
  const std::vector<int64_t> cpu1 = cpuNow(run);
  RETURN_IF_ERROR(run.kolo->maxAcrossRanks(opName("times", s.bytes), times));
  ASSIGN_OR_RETURN(std::optional<double> cpu_s,
                   cpuAcrossRanks(run, opName("cpu", s.bytes), cpu0, cpu1));

  Row row;
  row.bytes = s.bytes;
  row.count = s.count;
  row.type = o.op_kind == OpKind::kBarrier ? "none" : std::string(dataTypeName(o.dtype));
  row.redop = opKindReduces(o.op_kind) ? std::string(reduceOpName(o.op)) : "none";
  double seconds = median(times);
  row.time_us = seconds * 1e6;
  row.algbw = algBandwidth(s.bytes, seconds);
  row.busbw = row.algbw * busBandwidthFactor(o.op_kind, run.size);
  row.warmup = plan.warmup;
  row.iters = plan.iters;
  if (cpu_s) row.cpu_per_gb = cpuSecondsPerGB(*cpu_s, s.bytes, plan.iters);

  if (o.check && (run.pattern.feasible || !opKindReduces(o.op_kind))) {
    std::vector<int64_t> wrong(1);
    if (o.op_kind == OpKind::kBarrier) {
      ASSIGN_OR_RETURN(uint64_t w, checkBarrier(run));
      wrong[0] = static_cast<int64_t>(w);
    } else {
      fillBuffers(run, s);
      RETURN_IF_ERROR(toDevice(run));
      RETURN_IF_ERROR(runOnce(run, s, name, true));
      RETURN_IF_ERROR(fromDevice(run));
      wrong[0] = static_cast<int64_t>(countWrongOutput(run, s));
      if (wrong[0] != 0) {
        std::fprintf(stderr,
                     "kolo-bench: rank %d: %s: %" PRId64 " wrong elements at size %" PRIu64 "\n",
                     run.rank, std::string(opKindName(o.op_kind)).c_str(), wrong[0], s.bytes);
      }
    }
    RETURN_IF_ERROR(run.kolo->sumAcrossRanks(opName("wrong", s.bytes), wrong));
    row.wrong = static_cast<uint64_t>(wrong[0]);
  }
  return row;
}

// What each op does with its buffers, for the header.
std::string describeOp(const BenchOptions& o) {
  switch (o.op_kind) {
    case OpKind::kAllreduce:
      return std::string(o.in_place ? "in place" : "out of place");
    case OpKind::kReducescatter:
      return "out of place; size = the input (n x each rank's count)";
    case OpKind::kBroadcast:
      return std::string(o.device.empty() || o.in_place ? "in place" : "out of place") + ", root " +
             std::to_string(o.root);
    case OpKind::kAllgather:
      return "size = the gathered output (n x each rank's count); result read with kolo_result, "
             "not copied out";
    case OpKind::kAlltoall:
      return "even splits; size = each rank's input (n blocks of count); result read with "
             "kolo_result, not copied out";
    case OpKind::kBarrier:
      return "no data (one row, size 0); check: the last rank enters late";
  }
  return "";
}

void printHeader(const Run& run, KoloSession& kolo, const std::vector<OpSize>& sizes) {
  const BenchOptions& o = run.opts;
  std::printf("# kolo-bench %s: nranks %d, agent mode: %s\n",
              std::string(opKindName(o.op_kind)).c_str(), run.size, kolo.describeAgents().c_str());
  std::printf("# dtype %s, op %s, buffers %s, %s\n", std::string(dataTypeName(o.dtype)).c_str(),
              opKindReduces(o.op_kind) ? std::string(reduceOpName(o.op)).c_str() : "none",
              run.dev != nullptr ? run.dev->describe().c_str()
              : o.zero_copy      ? "zero-copy (kolo_alloc_shared)"
                                 : "user memory (copy-in/copy-out)",
              describeOp(o).c_str());
  if (run.dev != nullptr && run.dev->emulated())
    std::printf("%s\n", DeviceBench::emulationWarning());
  std::printf("# minBytes %" PRIu64 " maxBytes %" PRIu64
              " step: %g(factor) warmup iters: %d iters: %d "
              "(cut to ~%g s per size) validation: %d\n",
              sizes.empty() ? 0 : sizes.front().bytes, sizes.empty() ? 0 : sizes.back().bytes,
              o.step_factor, o.warmup_iters, o.iters, o.max_time_s, o.check ? 1 : 0);
  if (o.check && opKindReduces(o.op_kind) && !run.pattern.feasible) {
    std::printf("# check skipped: %d ranks overflow %s exactly representable values\n", run.size,
                std::string(dataTypeName(o.dtype)).c_str());
  }
  std::printf("# time = median over iterations of the slowest rank's time per operation\n");
  std::printf("# %s; agent CPU: %s\n#\n%s\n", kCpuColumnDefinition,
              run.agent_pid ? ("pid " + std::to_string(*run.agent_pid) + " (rank 0's)").c_str()
                            : "agent not found (column N/A)",
              kTableHeader);
  std::fflush(stdout);
}

Status writeJson(const Run& run, const std::vector<Row>& rows, double avg_busbw) {
  nlohmann::json j;
  j["benchmark"] = "kolo-bench";
  j["op_kind"] = std::string(opKindName(run.opts.op_kind));
  j["nranks"] = run.size;
  j["agents"] = run.kolo->crossSize();
  j["dtype"] = std::string(dataTypeName(run.opts.dtype));
  j["op"] = opKindReduces(run.opts.op_kind) ? std::string(reduceOpName(run.opts.op)) : "none";
  if (run.opts.op_kind == OpKind::kBroadcast) j["root"] = run.opts.root;
  j["zero_copy"] = run.opts.zero_copy;
  j["device"] = run.opts.device.empty() ? nlohmann::json(nullptr) : nlohmann::json(run.opts.device);
  if (run.dev != nullptr) j["emulated"] = run.dev->emulated();
  j["in_place"] = run.opts.in_place;
  j["avg_busbw_gbps"] = avg_busbw;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json jr = {{"size", r.bytes},       {"count", r.count},     {"type", r.type},
                         {"redop", r.redop},      {"time_us", r.time_us}, {"algbw_gbps", r.algbw},
                         {"busbw_gbps", r.busbw}, {"warmup", r.warmup},   {"iters", r.iters}};
    jr["wrong"] = r.wrong ? nlohmann::json(*r.wrong) : nlohmann::json(nullptr);
    jr["cpu_s_per_gb"] = r.cpu_per_gb ? nlohmann::json(*r.cpu_per_gb) : nlohmann::json(nullptr);
    j["rows"].push_back(jr);
  }
  std::ofstream f(run.opts.json_path);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) return internalError("cannot write --json file " + run.opts.json_path);
  return okStatus();
}

// The run's buffers, each of the largest size (broadcast on the host uses
// only `send`, barrier neither): host memory or kolo_alloc_shared, and with
// --device the device buffers besides (send/recv are then their mirrors).
Status allocateBuffers(Run& run, uint64_t max_bytes, KoloSession::Buffer* send,
                       KoloSession::Buffer* recv) {
  const BenchOptions& o = run.opts;
  const bool device = run.dev != nullptr;
  const bool need_recv = !o.in_place && (o.op_kind != OpKind::kBroadcast || device);
  for (KoloSession::Buffer* b : {send, recv}) {
    if (max_bytes == 0 || (b == recv && !need_recv)) break;
    ASSIGN_OR_RETURN(*b, run.kolo->allocate(max_bytes, o.zero_copy && !device));
  }
  run.send = send->get();
  run.recv = need_recv ? recv->get() : run.send;
  if (device && max_bytes > 0) {
    ASSIGN_OR_RETURN(run.dsend, run.dev->alloc(max_bytes));
    run.drecv = run.dsend;
    if (need_recv) {
      ASSIGN_OR_RETURN(run.drecv, run.dev->alloc(max_bytes));
    }
    run.buf_bytes = max_bytes;
  }
  return okStatus();
}

int benchMain(int argc, char** argv) {
  auto parsed = parseBenchArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.isOk()) {
    std::fprintf(stderr, "kolo-bench: %s\n", parsed.status().message().c_str());
    return 2;
  }
  Run run;
  run.opts = *parsed;
  if (run.opts.help) {
    std::printf("%s", run.opts.help_text.c_str());
    return 0;
  }
  if (!run.opts.model_step_path.empty()) return modelStepMain(run.opts);
  const BenchOptions& o = run.opts;
  const size_t esize = dataTypeSize(o.dtype);
  // The sizes depend on the job size for some ops; KOLO_SIZE (set by kolorun
  // and multi_agent_run.sh) gives it before kolo_init, to size the arena.
  const char* env_size = std::getenv("KOLO_SIZE");
  const int guess_n = env_size != nullptr ? std::max(1, std::atoi(env_size)) : 1;
  uint64_t max_bytes = 0;
  for (const OpSize& s :
       opMessageSizes(o.op_kind, guess_n, o.min_bytes, o.max_bytes, o.step_factor, esize)) {
    max_bytes = std::max(max_bytes, s.bytes);
  }
  const bool device = !o.device.empty();
  std::unique_ptr<DeviceBench> dev_before;  // selected before kolo_init
  if (device) {
    auto d = DeviceBench::prepare(o.device, max_bytes * (o.in_place ? 1 : 2), o.zero_copy);
    if (!d.isOk()) {
      std::fprintf(stderr, "kolo-bench: %s\n", d.status().toString().c_str());
      return 2;
    }
    dev_before = std::move(*d);
    KoloSession::setResultCopy(DeviceBench::copyResult);
  } else {
    KoloSession::reserveArena(max_bytes * (o.in_place ? 1 : 2));
  }
  auto session = KoloSession::start();
  if (!session.isOk()) {
    std::fprintf(stderr, "kolo-bench: %s\n", session.status().toString().c_str());
    return 2;
  }
  KoloSession& kolo = **session;
  // Destroyed before the session (its kolo_device_alloc buffers need it).
  std::unique_ptr<DeviceBench> dev = std::move(dev_before);
  if (dev) {
    Status st = dev->attach();
    if (!st.isOk()) {
      std::fprintf(stderr, "kolo-bench: --device %s: %s\n", o.device.c_str(),
                   st.toString().c_str());
      return 2;
    }
    run.dev = dev.get();
  }
  run.kolo = &kolo;
  run.rank = kolo.rank();
  run.size = kolo.size();
  run.pattern = CheckPattern::make(o.dtype, o.op, run.size);
  run.measures_agent = kolo.localRank() == 0;
  if (run.measures_agent) run.agent_pid = socketOwnerPid(agentSocketPath());
  if (o.op_kind == OpKind::kBroadcast && o.root >= run.size) {
    std::fprintf(stderr, "kolo-bench: --root %d is not a rank of this job (size %d)\n", o.root,
                 run.size);
    return 2;
  }
  const std::vector<OpSize> sizes =
      opMessageSizes(o.op_kind, run.size, o.min_bytes, o.max_bytes, o.step_factor, esize);
  max_bytes = 0;
  for (const OpSize& s : sizes) max_bytes = std::max(max_bytes, s.bytes);

  // Declared after the session: freed before kolo_shutdown. Each holds the
  // largest size (broadcast uses only `send`, barrier neither).
  KoloSession::Buffer send, recv;
  Status buffers = allocateBuffers(run, max_bytes, &send, &recv);
  if (!buffers.isOk()) {
    std::fprintf(stderr, "kolo-bench: rank %d: %s\n", run.rank, buffers.toString().c_str());
    return 2;
  }

  if (run.rank == 0) printHeader(run, kolo, sizes);
  std::vector<Row> rows;
  uint64_t total_wrong = 0;
  for (const OpSize& s : sizes) {
    auto row = runSize(run, s);
    if (!row.isOk()) {
      std::fprintf(stderr, "kolo-bench: rank %d: size %" PRIu64 ": %s\n", run.rank, s.bytes,
                   row.status().toString().c_str());
      return 3;
    }
    total_wrong += row->wrong.value_or(0);
    rows.push_back(*row);
    if (run.rank == 0) {
      std::printf("%s\n", formatRow(*row).c_str());
      std::fflush(stdout);
    }
  }

  std::optional<double> idle_cpu;
  if (o.idle_check_s > 0) {
    Status st = kolo.barrier();
    if (!st.isOk()) {
      std::fprintf(stderr, "kolo-bench: rank %d: idle check: %s\n", run.rank,
                   st.toString().c_str());
      return 3;
    }
    const std::vector<int64_t> cpu0 = cpuNow(run);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_check_s));
    const std::vector<int64_t> cpu1 = cpuNow(run);
    auto idle = cpuAcrossRanks(run, opName("idle-cpu", 0), cpu0, cpu1);
    if (!idle.isOk()) {
      std::fprintf(stderr, "kolo-bench: rank %d: idle check: %s\n", run.rank,
                   idle.status().toString().c_str());
      return 3;
    }
    idle_cpu = *idle;
  }

  if (run.rank == 0) {
    double avg = averageBusBandwidth(rows);
    std::printf("# Out of bounds values : %" PRIu64 " %s\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth : %g\n", avg);
    const Row& small = rows.front();
    std::printf("# Latency (%" PRIu64 " B %s, median of the slowest rank) : %.2f us", small.bytes,
                std::string(opKindName(o.op_kind)).c_str(), small.time_us);
    const bool targets = o.op_kind == OpKind::kAllreduce && small.bytes == 4;
    if (targets && kolo.crossSize() == 2) {
      std::printf("  [target <= 100 us across 2 agents]");
    } else if (targets && kolo.crossSize() > 2) {
      std::printf("  [the target, <= 100 us, is for 2 agents]");
    } else if (targets) {
      std::printf("  [target <= 30 us at N=2, <= 60 us at N=4]");
    }
    std::printf("\n");
    if (o.idle_check_s > 0 && idle_cpu) {
      std::printf("# Idle CPU (no collective in flight for %g s, every rank and agent) : %.4f s"
                  " = %.2f%% of one core\n",
                  o.idle_check_s, *idle_cpu, *idle_cpu / o.idle_check_s * 100);
    } else if (o.idle_check_s > 0) {
      std::printf("# Idle CPU : N/A (an agent was not found)\n");
    }
    if (run.dev != nullptr && run.dev->emulated())
      std::printf("%s\n", DeviceBench::emulationWarning());
    std::printf("#\n");
    std::fflush(stdout);
    if (!o.json_path.empty()) {
      Status st = writeJson(run, rows, avg);
      if (!st.isOk()) {
        std::fprintf(stderr, "kolo-bench: %s\n", st.message().c_str());
        return 2;
      }
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kolo::bench

int main(int argc, char** argv) { return kolo::bench::benchMain(argc, argv); }
