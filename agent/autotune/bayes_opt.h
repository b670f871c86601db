// Bayesian optimisation over the unit box [0,1]^d (maximisation): a
// Gaussian process over the samples (scores normalised to zero mean and
// unit variance), expected improvement with exploration xi (Horovod: 0.01)
// maximised over random candidates plus a local refinement around the best
// ones. Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "agent/autotune/gaussian_process.h"

namespace kolo::autotune {

struct BayesOptOptions {
  double noise = 0.8;          // GP noise on normalised scores (Horovod's default)
  double xi = 0.01;            // exploration in expected improvement
  int random_candidates = 1000;
  int refine_best = 5;         // candidates refined locally
  int refine_steps = 40;
  uint64_t seed = 0x6b6f6c6f;  // "kolo"
};

class BayesianOptimizer {
 public:
  // `bounds` per dimension inside [0,1]; lo == hi pins a dimension.
  BayesianOptimizer(std::vector<std::pair<double, double>> bounds, BayesOptOptions options = {});

  void addSample(Point x, double y);
  size_t samples() const { return xs_.size(); }
  // The next point to try (the middle of the box when there are no samples).
  Point nextSample();
  // Expected improvement at `p` under the last fit (for tests and logs).
  double expectedImprovement(const Point& p) const;
  // The sample with the best posterior mean: the incumbent, less fooled by
  // one lucky noisy measurement than the best raw score.
  size_t incumbent();

 private:
  bool fitModel();
  Point randomPoint();
  Point clamp(Point p) const;

  std::vector<std::pair<double, double>> bounds_;
  BayesOptOptions options_;
  std::mt19937_64 rng_;
  GaussianProcess gp_;
  std::vector<Point> xs_;
  std::vector<double> ys_;
  double best_mean_ = 0;
  size_t incumbent_ = 0;
};

}  // namespace kolo::autotune
