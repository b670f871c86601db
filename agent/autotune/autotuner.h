// Autotuner: tunes, online, the fusion threshold, the cycle time and the
// switch point between the small- and large-message algorithms, from the
// measured throughput (bytes/second), with Bayesian optimisation (like
// Horovod's autotune, HOROVOD_AUTOTUNE).
//
// Search space (normalised to [0,1]^3 for the Gaussian process):
//   fusion threshold  0 .. 256 MiB   log scale  (MB = 2^(u*log2(257)) - 1)
//   cycle time        0 .. 5 ms      linear
//   switch point      4 KiB .. 4 MiB log scale
// A dimension given a fixed value (set by the user) is not tuned.
//
// Protocol: the agent applies params(); after each step (e.g. each cycle
// that moved data) it calls report(bytes, seconds). steps_per_sample steps
// make one sample, scored by the median step throughput. The first
// warmup_samples samples are discarded. The first samples try the
// configured values and then fixed seed points (as Horovod seeds its
// search); later ones come from the optimizer. After max_samples scored
// samples the best one is kept for good (and logged). report() returns true
// whenever params() changed. Loop thread only.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/autotune/bayes_opt.h"
#include "common/status.h"

namespace kolo::autotune {

struct TunedParams {
  double fusion_threshold_mb = 128.0;
  double cycle_time_ms = 1.0;
  uint64_t switch_point_bytes = 64 * 1024;
  uint64_t fusionThresholdBytes() const {
    return static_cast<uint64_t>(fusion_threshold_mb * 1024.0 * 1024.0);
  }
  bool operator==(const TunedParams&) const = default;
};

struct AutotuneOptions {
  TunedParams initial;  // the configured values: the first point tried
  // Values set by the user: these dimensions are not tuned.
  std::optional<double> fixed_fusion_threshold_mb;
  std::optional<double> fixed_cycle_time_ms;
  std::optional<uint64_t> fixed_switch_point_bytes;

  double max_fusion_threshold_mb = 256.0;
  double max_cycle_time_ms = 5.0;
  uint64_t min_switch_point_bytes = 4 * 1024;
  uint64_t max_switch_point_bytes = 4 * 1024 * 1024;

  int warmup_samples = 3;     // autotune-warmup-samples
  int steps_per_sample = 10;  // autotune-steps-per-sample
  int max_samples = 20;       // autotune-bayes-opt-max-samples
  double gp_noise = 0.8;      // autotune-gaussian-process-noise
  double xi = 0.01;
  uint64_t seed = 0x6b6f6c6f;
  std::string log_file;       // autotune-log-file: CSV, "" = none
};

struct TuneSample {
  TunedParams params;
  double score = 0;  // bytes per second (median of the sample's steps)
};

class Autotuner {
 public:
  // Opens the CSV log (if any) and writes its header.
  static StatusOr<std::unique_ptr<Autotuner>> create(AutotuneOptions options);

  const TunedParams& params() const { return current_; }
  // One step's measurement. Returns true when params() changed.
  bool report(uint64_t bytes, double seconds);

  bool done() const { return done_; }
  int warmupRemaining() const { return warmup_remaining_; }
  const std::vector<TuneSample>& samples() const { return samples_; }
  // Best scored sample so far (params() once done()).
  const TuneSample& best() const { return best_; }

  // Normalised coordinates <-> parameters (exposed for tests and logs).
  Point encode(const TunedParams& p) const;
  TunedParams decode(const Point& u) const;

  static constexpr const char* kCsvHeader =
      "fusion_threshold_mb,cycle_time_ms,switch_point_bytes,score_bytes_per_s";

 private:
  explicit Autotuner(AutotuneOptions options);
  TunedParams applyFixed(TunedParams p) const;
  void logRow(const TuneSample& s, bool is_best);
  TunedParams nextToTry();

  AutotuneOptions options_;
  std::unique_ptr<BayesianOptimizer> bo_;
  std::vector<TunedParams> seeds_;
  TunedParams current_;
  std::vector<double> steps_;
  int warmup_remaining_;
  bool done_ = false;
  std::vector<TuneSample> samples_;
  TuneSample best_;
  std::ofstream log_;
};

}  // namespace kolo::autotune
