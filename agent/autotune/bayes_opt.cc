#include "agent/autotune/bayes_opt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

namespace kolo::autotune {

BayesianOptimizer::BayesianOptimizer(std::vector<std::pair<double, double>> bounds,
                                     BayesOptOptions options)
    : bounds_(std::move(bounds)), options_(options), rng_(options.seed), gp_(options.noise) {}

void BayesianOptimizer::addSample(Point x, double y) {
  xs_.push_back(std::move(x));
  ys_.push_back(y);
}

Point BayesianOptimizer::randomPoint() {
  Point p(bounds_.size());
  for (size_t i = 0; i < bounds_.size(); ++i) {
    std::uniform_real_distribution<double> d(bounds_[i].first, bounds_[i].second);
    p[i] = bounds_[i].first == bounds_[i].second ? bounds_[i].first : d(rng_);
  }
  return p;
}

Point BayesianOptimizer::clamp(Point p) const {
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::clamp(p[i], bounds_[i].first, bounds_[i].second);
  return p;
}

double BayesianOptimizer::expectedImprovement(const Point& p) const {
  double mu, sigma;
  gp_.predict(p, &mu, &sigma);
  if (sigma <= 0) return 0.0;
  double imp = mu - best_mean_ - options_.xi;
  double z = imp / sigma;
  double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
  return imp * cdf + sigma * pdf;
}

bool BayesianOptimizer::fitModel() {
  if (xs_.empty()) return false;
  // Normalise scores: zero mean, unit variance.
  const double n = static_cast<double>(ys_.size());
  double mean = std::accumulate(ys_.begin(), ys_.end(), 0.0) / n;
  double var = 0;
  for (double y : ys_) var += (y - mean) * (y - mean);
  double sd = std::sqrt(var / n);
  if (!(sd > 1e-12)) sd = 1.0;
  std::vector<double> yn(ys_.size());
  for (size_t i = 0; i < ys_.size(); ++i) yn[i] = (ys_[i] - mean) / sd;
  if (!gp_.fit(xs_, yn).isOk()) return false;
  // Incumbent: best posterior mean at a sampled point (robust to noise).
  best_mean_ = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < xs_.size(); ++i) {
    double mu;
    gp_.predict(xs_[i], &mu, nullptr);
    if (mu > best_mean_) {
      best_mean_ = mu;
      incumbent_ = i;
    }
  }
  return true;
}

size_t BayesianOptimizer::incumbent() {
  if (!fitModel()) {
    return static_cast<size_t>(std::max_element(ys_.begin(), ys_.end()) - ys_.begin());
  }
  return incumbent_;
}

Point BayesianOptimizer::nextSample() {
  if (xs_.empty()) {
    Point mid(bounds_.size());
    for (size_t i = 0; i < bounds_.size(); ++i) mid[i] = 0.5 * (bounds_[i].first + bounds_[i].second);
    return mid;
  }
  if (!fitModel()) return randomPoint();

  std::vector<std::pair<double, Point>> cands;
  cands.reserve(static_cast<size_t>(options_.random_candidates));
  for (int i = 0; i < options_.random_candidates; ++i) {
    Point p = randomPoint();
    cands.emplace_back(expectedImprovement(p), std::move(p));
  }
  auto better = [](const auto& a, const auto& b) { return a.first > b.first; };
  size_t top = std::min(cands.size(), static_cast<size_t>(std::max(options_.refine_best, 1)));
  std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(top), cands.end(),
                    better);
  std::normal_distribution<double> step(0.0, 1.0);
  for (size_t c = 0; c < top; ++c) {
    double radius = 0.1;
    for (int s = 0; s < options_.refine_steps; ++s) {
      Point q = cands[c].second;
      for (double& v : q) v += radius * step(rng_);
      q = clamp(std::move(q));
      double ei = expectedImprovement(q);
      if (ei > cands[c].first) {
        cands[c] = {ei, std::move(q)};
      } else {
        radius *= 0.85;
      }
    }
  }
  auto best = std::max_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(top),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
  return best->second;
}

}  // namespace kolo::autotune
