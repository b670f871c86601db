#include "agent/autotune/autotuner.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "common/log.h"

namespace kolo::autotune {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

StatusOr<std::unique_ptr<Autotuner>> Autotuner::create(AutotuneOptions options) {
  if (options.steps_per_sample < 1) return invalidArgument("autotune-steps-per-sample must be >= 1");
  if (options.max_samples < 1) return invalidArgument("autotune-bayes-opt-max-samples must be >= 1");
  if (options.warmup_samples < 0) return invalidArgument("autotune-warmup-samples must be >= 0");
  if (!(options.gp_noise > 0)) return invalidArgument("autotune-gaussian-process-noise must be > 0");
  if (options.min_switch_point_bytes == 0 ||
      options.min_switch_point_bytes > options.max_switch_point_bytes) {
    return invalidArgument("autotune: bad switch point range");
  }
  std::unique_ptr<Autotuner> t(new Autotuner(std::move(options)));
  if (!t->options_.log_file.empty()) {
    t->log_.open(t->options_.log_file, std::ios::out | std::ios::trunc);
    if (!t->log_.good()) {
      return errnoStatus("autotune: cannot open log file " + t->options_.log_file, errno);
    }
    t->log_ << kCsvHeader << '\n' << std::flush;
  }
  return t;
}

Autotuner::Autotuner(AutotuneOptions options)
    : options_(std::move(options)), warmup_remaining_(options_.warmup_samples) {
  // Pinned dimensions get an empty interval.
  TunedParams init = applyFixed(options_.initial);
  Point u0 = encode(init);
  std::vector<std::pair<double, double>> bounds = {{0.0, 1.0}, {0.0, 1.0}, {0.0, 1.0}};
  if (options_.fixed_fusion_threshold_mb) bounds[0] = {u0[0], u0[0]};
  if (options_.fixed_cycle_time_ms) bounds[1] = {u0[1], u0[1]};
  if (options_.fixed_switch_point_bytes) bounds[2] = {u0[2], u0[2]};
  BayesOptOptions bo;
  bo.noise = options_.gp_noise;
  bo.xi = options_.xi;
  bo.seed = options_.seed;
  bo_ = std::make_unique<BayesianOptimizer>(std::move(bounds), bo);

  // The configured values first, then Horovod's seed points (fusion MB 4, 32,
  // 16, 8; its cycle times scaled to our range), spread over the switch range.
  seeds_.push_back(init);
  const double c = options_.max_cycle_time_ms / 100.0;
  seeds_.push_back(applyFixed({4.0, 5 * c, 16 * 1024}));
  seeds_.push_back(applyFixed({32.0, 50 * c, 1024 * 1024}));
  seeds_.push_back(applyFixed({16.0, 25 * c, 256 * 1024}));
  seeds_.push_back(applyFixed({8.0, 10 * c, 4 * 1024 * 1024}));
  current_ = init;
  best_.params = init;
}

TunedParams Autotuner::applyFixed(TunedParams p) const {
  if (options_.fixed_fusion_threshold_mb) p.fusion_threshold_mb = *options_.fixed_fusion_threshold_mb;
  if (options_.fixed_cycle_time_ms) p.cycle_time_ms = *options_.fixed_cycle_time_ms;
  if (options_.fixed_switch_point_bytes) p.switch_point_bytes = *options_.fixed_switch_point_bytes;
  return p;
}

Point Autotuner::encode(const TunedParams& p) const {
  const double fmax = std::log2(options_.max_fusion_threshold_mb + 1.0);
  const double smin = std::log2(static_cast<double>(options_.min_switch_point_bytes));
  const double smax = std::log2(static_cast<double>(options_.max_switch_point_bytes));
  Point u(3);
  u[0] = fmax > 0 ? std::log2(std::max(p.fusion_threshold_mb, 0.0) + 1.0) / fmax : 0.0;
  u[1] = options_.max_cycle_time_ms > 0 ? p.cycle_time_ms / options_.max_cycle_time_ms : 0.0;
  u[2] = smax > smin ? (std::log2(static_cast<double>(std::max<uint64_t>(p.switch_point_bytes, 1))) -
                        smin) / (smax - smin)
                     : 0.0;
  for (double& v : u) v = std::clamp(v, 0.0, 1.0);
  return u;
}

TunedParams Autotuner::decode(const Point& u) const {
  const double fmax = std::log2(options_.max_fusion_threshold_mb + 1.0);
  const double smin = std::log2(static_cast<double>(options_.min_switch_point_bytes));
  const double smax = std::log2(static_cast<double>(options_.max_switch_point_bytes));
  TunedParams p;
  p.fusion_threshold_mb = std::exp2(std::clamp(u[0], 0.0, 1.0) * fmax) - 1.0;
  p.cycle_time_ms = std::clamp(u[1], 0.0, 1.0) * options_.max_cycle_time_ms;
  double sw = std::exp2(smin + std::clamp(u[2], 0.0, 1.0) * (smax - smin));
  p.switch_point_bytes = static_cast<uint64_t>(std::llround(sw / 64.0)) * 64;  // whole cache lines
  p.switch_point_bytes = std::clamp(p.switch_point_bytes, options_.min_switch_point_bytes,
                                    options_.max_switch_point_bytes);
  return applyFixed(p);
}

void Autotuner::logRow(const TuneSample& s, bool is_best) {
  log::get("agent.autotune")
      ->info("autotune {}: fusion threshold {:.3f} MB, cycle time {:.3f} ms, switch point {} B: "
             "{:.4g} B/s",
             is_best ? "best" : "sample", s.params.fusion_threshold_mb, s.params.cycle_time_ms,
             s.params.switch_point_bytes, s.score);
  if (log_.is_open()) {
    log_ << s.params.fusion_threshold_mb << ',' << s.params.cycle_time_ms << ','
         << s.params.switch_point_bytes << ',' << s.score << '\n'
         << std::flush;
  }
}

TunedParams Autotuner::nextToTry() {
  size_t n = samples_.size();
  if (n < seeds_.size()) return seeds_[n];
  return decode(bo_->nextSample());
}

bool Autotuner::report(uint64_t bytes, double seconds) {
  if (done_ || !(seconds > 0)) return false;
  steps_.push_back(static_cast<double>(bytes) / seconds);
  if (static_cast<int>(steps_.size()) < options_.steps_per_sample) return false;
  double score = median(steps_);
  steps_.clear();
  if (warmup_remaining_ > 0) {
    --warmup_remaining_;
    return false;
  }

  TuneSample s{current_, score};
  samples_.push_back(s);
  bo_->addSample(encode(current_), score);
  logRow(s, false);

  TunedParams previous = current_;
  if (static_cast<int>(samples_.size()) >= options_.max_samples) {
    best_ = samples_[bo_->incumbent()];
    done_ = true;
    current_ = best_.params;
    logRow(best_, true);
  } else {
    current_ = nextToTry();
    if (score > best_.score) best_ = s;
  }
  return !(current_ == previous);
}

}  // namespace kolo::autotune
