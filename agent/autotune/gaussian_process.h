// Gaussian-process regression for the autotuner (plain C++, small dense
// Cholesky). Squared-exponential (RBF) kernel with one length scale for all
// dimensions, sigma_f^2 * exp(-|a-b|^2 / (2 l^2)), plus noise^2 on the
// diagonal (Horovod's GP with alpha = noise). The kernel's length scale and
// sigma_f are chosen to maximise the marginal likelihood over a fixed grid,
// which keeps fitting deterministic and cheap (n <= a few dozen points).
#pragma once

#include <cstddef>
#include <vector>

#include "common/status.h"

namespace kolo::autotune {

using Point = std::vector<double>;

class GaussianProcess {
 public:
  explicit GaussianProcess(double noise) : noise_(noise) {}

  // Fits to n points (all of the same dimension) and their values.
  Status fit(const std::vector<Point>& x, const std::vector<double>& y);
  // Posterior mean and standard deviation at `p`.
  void predict(const Point& p, double* mean, double* stddev) const;

  double lengthScale() const { return length_; }
  double sigmaF() const { return sigma_f_; }
  double noise() const { return noise_; }

  // Negative log marginal likelihood of the data under (length, sigma_f);
  // +inf when the kernel matrix is not positive definite.
  double negLogLikelihood(double length, double sigma_f) const;

 private:
  double kernel(const Point& a, const Point& b, double length, double sigma_f) const;
  // Fills l_ (lower Cholesky factor of K) for the given parameters.
  bool factor(double length, double sigma_f, std::vector<double>* l) const;

  double noise_;
  double length_ = 1.0;
  double sigma_f_ = 1.0;
  std::vector<Point> x_;
  std::vector<double> y_;
  std::vector<double> l_;      // n x n lower triangle, row-major
  std::vector<double> alpha_;  // K^-1 y
};

}  // namespace kolo::autotune
