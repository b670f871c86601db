// kolo-bench --model-step: one training step's gradients, as a backward pass
// hands them to kolo.
//
// Each step submits every tensor of the model with kolo_allreduce_async in
// REVERSE registration order (the last layer's gradients are ready first),
// then synchronizes all the handles; the step is timed from the first
// submission to the last completion. The flat baseline is one allreduce of a
// single buffer of the same total size. The two are timed in alternation
// (measureInterleaved; with --blocking also the per-tensor blocking loop,
// each tensor synchronized before the next is submitted): the first round,
// max-reduced across ranks, plans the
// iteration count; the per-iteration times are max-reduced outside the
// timed region; each figure is the median of the slowest rank's times.
// Gradients are reduced in place (as Horovod's DistributedOptimizer does),
// on zeros while timed (so repeated in-place sums cannot overflow), and
// checked once each on exactly representable data with -c 1.
#include "bench/model_step_run.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_table.h"
#include "bench/kolo_session.h"
#include "bench/model_step.h"

namespace kolo::bench {
namespace {

struct Measured {
  double seconds = 0;  // median of the slowest rank's times
  IterationPlan plan;
};

// The step and the flat allreduce (and with --blocking the per-tensor
// blocking loop), interleaved: one iteration plan from the first round's
// time (max across ranks), warm-up rounds, then timed rounds so
// that both see the same machine. On a shared VM the memory bandwidth drifts
// (a 256 MiB allreduce took 41 ms in some minutes and 68-75 ms in others on
// the same machine, docs/benchmarks.md), and timing all steps before all
// flat allreduces compared the two across such drifts. Agreement as in a
// kolo-bench row: the per-iteration times are max-reduced across ranks
// outside the timed region and each figure is the median of the slowest
// rank's times.
StatusOr<std::vector<Measured>> measureInterleaved(KoloSession& kolo, const BenchOptions& o,
                                                   const std::vector<std::function<Status()>>& fns) {
  const size_t k = fns.size();
  std::vector<double> first(k);
  for (size_t j = 0; j < k; ++j) {
    auto t0 = KoloSession::now();
    RETURN_IF_ERROR(fns[j]());
    first[j] = KoloSession::secondsSince(t0);
  }
  RETURN_IF_ERROR(kolo.maxAcrossRanks("kolo-bench.model.first", first));
  // The plan's time cut applies to the round (step + flat, + the blocking loop with --blocking).
  double round = 0;
  for (double f : first) round += f;
  const IterationPlan plan = planIterations(o.warmup_iters, o.iters, o.max_time_s, round);
  for (int i = 1; i < plan.warmup; ++i) {
    for (const auto& fn : fns) RETURN_IF_ERROR(fn());
  }
  const size_t iters = static_cast<size_t>(plan.iters);
  std::vector<double> times(k * iters);  // fns[0]'s times, then fns[1]'s, ...
  for (size_t i = 0; i < iters; ++i) {
    for (size_t j = 0; j < k; ++j) {
      auto t1 = KoloSession::now();
      RETURN_IF_ERROR(fns[j]());
      times[j * iters + i] = KoloSession::secondsSince(t1);
    }
  }
  RETURN_IF_ERROR(kolo.maxAcrossRanks("kolo-bench.model.times", times));
  std::vector<Measured> out;
  for (size_t j = 0; j < k; ++j) {
    std::vector<double> t(times.begin() + static_cast<std::ptrdiff_t>(j * iters),
                          times.begin() + static_cast<std::ptrdiff_t>((j + 1) * iters));
    out.push_back(Measured{median(t), plan});
  }
  return out;
}

// Rank 0's memcpy bandwidth over 256 MiB (best of 3), printed before and
// after the timed pairs: a figure well below this machine's usual one says
// that something else was using the memory bus while the rows were timed.
double memcpyProbeGBps() {
  constexpr size_t kBytes = size_t{256} << 20;
  std::vector<char> a(kBytes, 1), b(kBytes, 2);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    auto t0 = KoloSession::now();
    std::memcpy(b.data(), a.data(), kBytes);
    best = std::min(best, KoloSession::secondsSince(t0));
  }
  volatile char sink = b[kBytes / 2];
  (void)sink;
  return static_cast<double>(kBytes) / best / 1e9;
}

class StepRunner {
 public:
  StepRunner(KoloSession& kolo, const BenchOptions& o, const Model& model, const ModelLayout& layout,
             char* base, const std::vector<double>& weights)
      : kolo_(kolo), o_(o), model_(model), layout_(layout), base_(base) {
    for (const ModelTensor& t : model.tensors) names_.push_back("grad." + model.name + "." + t.name);
    handles_.reserve(model.tensors.size());
    // --compute-ms: tensor i's backward compute, its share of the step's by weight (parameter count, or
    // --compute-profile).
    if (o.compute_ms > 0) {
      double total = 0;
      for (double w : weights) total += w;
      for (double w : weights) compute_ns_.push_back(static_cast<int64_t>(o.compute_ms * 1e6 * w / total));
    }
  }

  // Sleeps until tensor i's gradient is "computed": t0 + the compute of every tensor up to i (reverse order).
  void computeUntil(KoloSession::Clock::time_point t0, size_t i, int64_t* done_ns) const {
    if (compute_ns_.empty()) return;
    *done_ns += compute_ns_[i];
    std::this_thread::sleep_until(t0 + std::chrono::nanoseconds(*done_ns));
  }

  // The backward pass's compute alone (no communication): the efficiency's numerator.
  double computeOnlySeconds() const {
    auto t0 = KoloSession::now();
    int64_t done = 0;
    for (size_t i = model_.tensors.size(); i-- > 0;) computeUntil(t0, i, &done);
    return KoloSession::secondsSince(t0);
  }

  void* tensor(size_t i) const { return base_ + layout_.offsets[i]; }

  // One step: submit all in reverse order, then wait for all. On an error
  // every handle already submitted is still waited for.
  Status step() {
    handles_.clear();
    Status first = okStatus();
    const auto t0 = KoloSession::now();
    int64_t done_ns = 0;
    for (size_t i = model_.tensors.size(); i-- > 0;) {
      computeUntil(t0, i, &done_ns);
      auto h = kolo_.submitAllreduce(names_[i], tensor(i), tensor(i), model_.tensors[i].count,
                                     o_.dtype, o_.op);
      if (!h.isOk()) {
        first = h.status();
        break;
      }
      handles_.emplace_back(*h, i);
    }
    for (auto& [h, i] : handles_) {
      Status st = kolo_.wait(h, names_[i]);
      if (first.isOk() && !st.isOk()) first = st;
    }
    return first;
  }

  // The blocking per-tensor loop (--blocking): each tensor in reverse order,
  // kolo_allreduce_async + kolo_synchronize (the C ABI has no blocking call),
  // each completed before the next is submitted, as a
  // framework without async submission (or Open MPI's per-tensor
  // MPI_Allreduce loop) hands them over.
  Status blockingLoop() {
    for (size_t i = model_.tensors.size(); i-- > 0;) {
      RETURN_IF_ERROR(kolo_.allreduce(names_[i], tensor(i), tensor(i), model_.tensors[i].count, o_.dtype, o_.op));
    }
    return okStatus();
  }

  void fillPattern(const CheckPattern& p, int rank) {
    for (size_t i = 0; i < model_.tensors.size(); ++i) {
      fillInput(p, rank, tensor(i), model_.tensors[i].count);
    }
  }

  uint64_t countWrongAll(const CheckPattern& p) const {
    uint64_t wrong = 0;
    for (size_t i = 0; i < model_.tensors.size(); ++i) {
      wrong += countWrong(p, tensor(i), model_.tensors[i].count);
    }
    return wrong;
  }

 private:
  KoloSession& kolo_;
  const BenchOptions& o_;
  const Model& model_;
  const ModelLayout& layout_;
  char* base_;
  std::vector<std::string> names_;
  std::vector<std::pair<uint64_t, size_t>> handles_;
  std::vector<int64_t> compute_ns_;  // per tensor; empty without --compute-ms
};

Status writeJson(const BenchOptions& o, const StepRow& r, int nranks, int agents, double probe_before,
                 double probe_after, double compute_only_us, double blocking_us) {
  nlohmann::json j = {{"benchmark", "kolo-bench --model-step"},
                      {"model_file", o.model_step_path},
                      {"model", r.model},
                      {"nranks", nranks},
                      {"agents", agents},
                      {"dtype", std::string(dataTypeName(o.dtype))},
                      {"op", std::string(reduceOpName(o.op))},
                      {"zero_copy", o.zero_copy},
                      {"tensors", r.tensors},
                      {"params", r.params},
                      {"bytes", r.bytes},
                      {"fusion", r.fusion},
                      {"step_us", r.step_us},
                      {"step_algbw_gbps", r.algbw},
                      {"step_busbw_gbps", r.busbw},
                      {"flat_us", r.flat_us},
                      {"flat_busbw_gbps", r.flat_busbw},
                      {"step_over_flat", r.ratio()},
                      {"target_ratio", kStepTargetRatio},
                      {"target_met", r.ratio() <= kStepTargetRatio},
                      {"steps", r.steps},
                      {"flat_iters", r.flat_iters},
                      {"interleaved", true},
                      {"memcpy_probe_gbps_before", probe_before},
                      {"memcpy_probe_gbps_after", probe_after},
                      {"compute_ms", o.compute_ms},
                      {"compute_only_us", compute_only_us},
                      {"efficiency", compute_only_us > 0 ? compute_only_us / r.step_us : 0.0}};
  j["blocking_us"] = o.model_blocking ? nlohmann::json(blocking_us) : nlohmann::json(nullptr);
  j["wrong"] = r.wrong ? nlohmann::json(*r.wrong) : nlohmann::json(nullptr);
  std::ofstream f(o.json_path);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) return internalError("cannot write --json file " + o.json_path);
  return okStatus();
}

}  // namespace

int modelStepMain(const BenchOptions& o) {
  auto model = loadModel(o.model_step_path);
  if (!model.isOk()) {
    std::fprintf(stderr, "kolo-bench: %s\n", model.status().message().c_str());
    return 2;
  }
  const size_t esize = dataTypeSize(o.dtype);
  const ModelLayout layout = layoutModel(*model, esize);
  const uint64_t params = model->totalCount();
  const uint64_t bytes = params * esize;

  KoloSession::reserveArena(layout.bytes);  // in place: one buffer
  auto session = KoloSession::start();
  if (!session.isOk()) {
    std::fprintf(stderr, "kolo-bench: %s\n", session.status().toString().c_str());
    return 2;
  }
  KoloSession& kolo = **session;
  const int rank = kolo.rank();
  const int nranks = kolo.size();
  auto buf = kolo.allocate(layout.bytes, o.zero_copy);
  if (!buf.isOk()) {
    std::fprintf(stderr, "kolo-bench: rank %d: %s\n", rank, buf.status().toString().c_str());
    return 2;
  }
  KoloSession::Buffer grads = std::move(buf).value();  // freed before the session
  char* base = static_cast<char*>(grads.get());
  // Each tensor's share of the compute: its parameter count, or its weight in --compute-profile.
  std::vector<double> weights;
  for (const ModelTensor& t : model->tensors) weights.push_back(static_cast<double>(t.count));
  if (!o.compute_profile.empty()) {
    auto prof = loadModel(o.compute_profile);  // the same 'name number' format
    if (!prof.isOk()) {
      std::fprintf(stderr, "kolo-bench: --compute-profile: %s\n", prof.status().message().c_str());
      return 2;
    }
    std::fill(weights.begin(), weights.end(), 0.0);
    for (const ModelTensor& p : prof->tensors) {
      auto it = std::find_if(model->tensors.begin(), model->tensors.end(),
                             [&](const ModelTensor& t) { return t.name == p.name; });
      if (it == model->tensors.end()) {
        std::fprintf(stderr, "kolo-bench: --compute-profile: tensor '%s' is not in the model\n", p.name.c_str());
        return 2;
      }
      weights[static_cast<size_t>(it - model->tensors.begin())] = static_cast<double>(p.count);
    }
  }
  StepRunner runner(kolo, o, *model, layout, base, weights);
  const CheckPattern pattern = CheckPattern::make(o.dtype, o.op, nranks);

  StepRow row;
  row.model = model->name;
  row.tensors = model->tensors.size();
  row.params = params;
  row.bytes = bytes;
  row.fusion = fusionSetting(std::getenv("KOLO_FUSION_THRESHOLD_MB"),
                             std::getenv("HOROVOD_FUSION_THRESHOLD"), kolo.crossSize());
  const int agents = kolo.crossSize();

  if (rank == 0) {
    std::printf("# kolo-bench model step: %s (%s): %" PRIu64 " tensors, %" PRIu64
                " parameters, %" PRIu64 " B of %s gradients\n",
                model->name.c_str(), o.model_step_path.c_str(), row.tensors, params, bytes,
                std::string(dataTypeName(o.dtype)).c_str());
    std::printf("# nranks %d, agent mode: %s\n", nranks, kolo.describeAgents().c_str());
    std::printf("# step: kolo_allreduce_async of every tensor in reverse order, then "
                "kolo_synchronize of all; op %s, in place, %s\n",
                std::string(reduceOpName(o.op)).c_str(),
                o.zero_copy ? "zero-copy (kolo_alloc_shared)"
                            : "user memory (large tensors read/written in place by the agent, small ones via the arena)");
    if (o.model_blocking) {
      std::printf("# blocking loop: kolo_allreduce_async + kolo_synchronize of every tensor in reverse order, one at a time (--blocking)\n");
    }
    std::printf("# flat: one allreduce of a single %" PRIu64 " B buffer; fusion: %s%s\n", bytes,
                row.fusion.c_str(),
                agents <= 1 ? " (one agent: fusion only applies to cross-agent jobs)" : "");
    std::printf("# time = median over iterations of the slowest rank's time; warmup iters: %d "
                "iters: %d (cut to ~%g s of step + flat %s) validation: %d\n#\n%s\n",
                o.warmup_iters, o.iters, o.max_time_s, o.model_blocking ? "+ blocking loop rounds" : "pairs",
                o.check ? 1 : 0, stepTableHeader().c_str());
    std::fflush(stdout);
  }

  auto fail = [&](const Status& st, const char* what) {
    std::fprintf(stderr, "kolo-bench: rank %d: %s: %s\n", rank, what, st.toString().c_str());
    return 3;
  };

  // Timed runs on zeros: in-place sums stay finite however many steps run.
  fillValue(o.dtype, base, layout.bytes / esize, 0.0);
  // The probe runs while the other ranks wait in a barrier, so it measures
  // the machine, not the ranks' own copies.
  auto probe = [&](double* gbps) {
    if (rank == 0) *gbps = memcpyProbeGBps();
    return kolo.barrier();
  };
  double probe_before = 0.0, probe_after = 0.0;
  if (Status st = probe(&probe_before); !st.isOk()) return fail(st, "memcpy probe");
  std::vector<std::function<Status()>> fns = {
      [&] { return runner.step(); },
      [&] {
        return kolo.allreduce("kolo-bench.model.flat." + std::to_string(bytes), base, base, params,
                              o.dtype, o.op);
      }};
  if (o.model_blocking) fns.push_back([&] { return runner.blockingLoop(); });
  auto measured = measureInterleaved(kolo, o, fns);
  if (!measured.isOk()) return fail(measured.status(), "model step / flat allreduce / blocking loop");
  if (Status st = probe(&probe_after); !st.isOk()) return fail(st, "memcpy probe");
  double compute_only_us = 0;
  if (o.compute_ms > 0) {
    std::vector<double> c;
    for (int i = 0; i < 5; ++i) c.push_back(runner.computeOnlySeconds());
    compute_only_us = median(c) * 1e6;
  }
  const Measured* step = &(*measured)[0];
  const Measured* flat = &(*measured)[1];
  const double blocking_us = o.model_blocking ? (*measured)[2].seconds * 1e6 : 0.0;

  row.step_us = step->seconds * 1e6;
  row.algbw = algBandwidth(bytes, step->seconds);
  row.busbw = row.algbw * busBandwidthFactor(OpKind::kAllreduce, nranks);
  row.flat_us = flat->seconds * 1e6;
  row.flat_busbw =
      algBandwidth(bytes, flat->seconds) * busBandwidthFactor(OpKind::kAllreduce, nranks);
  row.steps = step->plan.iters;
  row.flat_iters = flat->plan.iters;

  if (o.check && pattern.feasible) {
    std::vector<int64_t> wrong(2, 0);
    runner.fillPattern(pattern, rank);
    Status st = runner.step();
    if (!st.isOk()) return fail(st, "checked model step");
    wrong[0] = static_cast<int64_t>(runner.countWrongAll(pattern));
    if (o.model_blocking) {
      runner.fillPattern(pattern, rank);
      st = runner.blockingLoop();
      if (!st.isOk()) return fail(st, "checked blocking loop");
      wrong[0] += static_cast<int64_t>(runner.countWrongAll(pattern));
    }
    fillInput(pattern, rank, base, params);
    st = kolo.allreduce("kolo-bench.model.flat.check", base, base, params, o.dtype, o.op);
    if (!st.isOk()) return fail(st, "checked flat allreduce");
    wrong[1] = static_cast<int64_t>(countWrong(pattern, base, params));
    if (wrong[0] != 0 || wrong[1] != 0) {
      std::fprintf(stderr, "kolo-bench: rank %d: %" PRId64 " wrong elements in the step%s, %" PRId64
                   " in the flat allreduce\n", rank, wrong[0], o.model_blocking ? " and the blocking loop" : "",
                   wrong[1]);
    }
    st = kolo.sumAcrossRanks("kolo-bench.model.wrong", wrong);
    if (!st.isOk()) return fail(st, "agreeing on the check");
    row.wrong = static_cast<uint64_t>(wrong[0] + wrong[1]);
  }

  if (rank == 0) {
    std::printf("%s\n", formatStepRow(row).c_str());
    std::printf("# steps timed: %d, flat iterations timed: %d (interleaved: step, flat, %sstep, ...)\n", row.steps,
                row.flat_iters, o.model_blocking ? "blocking loop, " : "");
    if (o.model_blocking) {
      // Parsed by bench/model_compare.sh: keep "# Blocking loop" and "time(us) X".
      std::printf("# Blocking loop (per tensor, reverse order, in place, each synchronized before the next): time(us) %.1f busbw %.2f "
                  "GB/s, blocking/async %.2f, iterations %d\n",
                  blocking_us,
                  algBandwidth(bytes, blocking_us / 1e6) * busBandwidthFactor(OpKind::kAllreduce, nranks),
                  row.step_us > 0 ? blocking_us / row.step_us : 0.0, row.steps);
    }
    std::printf("# memcpy probe (rank 0, 256 MiB, best of 3): %.2f GB/s before, %.2f GB/s after\n",
                probe_before, probe_after);
    std::printf("# Out of bounds values : %" PRIu64 " %s\n", row.wrong.value_or(0),
                row.wrong.value_or(0) == 0 ? "OK" : "FAILED");
    // With compute in the step, step/flat is no longer the figure: the efficiency below is.
    if (o.compute_ms <= 0) std::printf("%s\n#\n", stepTargetLine(row).c_str());
    if (o.compute_ms > 0) {
      std::printf("# compute: %.1f ms per step (--compute-ms), slept before each gradient in proportion to "
                  "%s\n# compute-only step %.1f us, step with communication %.1f us: scaling "
                  "efficiency %.3f\n#\n",
                  o.compute_ms,
                  o.compute_profile.empty() ? "its parameters" : ("its weight in " + o.compute_profile).c_str(),
                  compute_only_us, row.step_us, compute_only_us / row.step_us);
    }
    std::fflush(stdout);
    if (!o.json_path.empty()) {
      Status st = writeJson(o, row, nranks, agents, probe_before, probe_after, compute_only_us, blocking_us);
      if (!st.isOk()) {
        std::fprintf(stderr, "kolo-bench: %s\n", st.message().c_str());
        return 2;
      }
    }
  }
  return row.wrong.value_or(0) == 0 ? 0 : 1;
}

}  // namespace kolo::bench
