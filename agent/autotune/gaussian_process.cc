#include "agent/autotune/gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace kolo::autotune {

namespace {

// Solves L z = b (forward) in place.
void forwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= l[i * n + k] * b[k];
    b[i] = s / l[i * n + i];
  }
}

// Solves L^T z = b (backward) in place.
void backwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t ii = n; ii-- > 0;) {
    double s = b[ii];
    for (size_t k = ii + 1; k < n; ++k) s -= l[k * n + ii] * b[k];
    b[ii] = s / l[ii * n + ii];
  }
}

}  // namespace

double GaussianProcess::kernel(const Point& a, const Point& b, double length,
                               double sigma_f) const {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return sigma_f * sigma_f * std::exp(-0.5 * d2 / (length * length));
}

bool GaussianProcess::factor(double length, double sigma_f, std::vector<double>* out) const {
  const size_t n = x_.size();
  std::vector<double>& l = *out;
  l.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double kij = kernel(x_[i], x_[j], length, sigma_f);
      if (i == j) kij += noise_ * noise_ + 1e-10;
      double s = kij;
      for (size_t k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
      if (i == j) {
        if (!(s > 0)) return false;
        l[i * n + i] = std::sqrt(s);
      } else {
        l[i * n + j] = s / l[j * n + j];
      }
    }
  }
  return true;
}

double GaussianProcess::negLogLikelihood(double length, double sigma_f) const {
  const size_t n = x_.size();
  std::vector<double> l;
  if (!factor(length, sigma_f, &l)) return std::numeric_limits<double>::infinity();
  std::vector<double> z = y_;
  forwardSolve(l, n, z);  // z = L^-1 y, so y^T K^-1 y = |z|^2
  double quad = 0, logdet = 0;
  for (size_t i = 0; i < n; ++i) {
    quad += z[i] * z[i];
    logdet += std::log(l[i * n + i]);
  }
  return 0.5 * quad + logdet + 0.5 * static_cast<double>(n) * std::log(2 * std::numbers::pi);
}

Status GaussianProcess::fit(const std::vector<Point>& x, const std::vector<double>& y) {
  if (x.empty() || x.size() != y.size()) {
    return invalidArgument("gaussian process: need as many values as points (and at least one)");
  }
  for (const auto& p : x) {
    if (p.size() != x[0].size()) return invalidArgument("gaussian process: mixed dimensions");
  }
  x_ = x;
  y_ = y;
  static constexpr double kLengths[] = {0.05, 0.08, 0.12, 0.18, 0.25, 0.35, 0.5, 0.7, 1.0, 1.5, 2.5};
  static constexpr double kSigmas[] = {0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0};
  double best = std::numeric_limits<double>::infinity();
  double best_l = 1.0, best_s = 1.0;
  for (double len : kLengths) {
    for (double s : kSigmas) {
      double nll = negLogLikelihood(len, s);
      if (nll < best) {
        best = nll;
        best_l = len;
        best_s = s;
      }
    }
  }
  length_ = best_l;
  sigma_f_ = best_s;
  if (!factor(length_, sigma_f_, &l_)) {
    return internalError("gaussian process: kernel matrix is not positive definite");
  }
  alpha_ = y_;
  forwardSolve(l_, x_.size(), alpha_);
  backwardSolve(l_, x_.size(), alpha_);
  return okStatus();
}

void GaussianProcess::predict(const Point& p, double* mean, double* stddev) const {
  const size_t n = x_.size();
  std::vector<double> ks(n);
  double mu = 0;
  for (size_t i = 0; i < n; ++i) {
    ks[i] = kernel(x_[i], p, length_, sigma_f_);
    mu += ks[i] * alpha_[i];
  }
  forwardSolve(l_, n, ks);  // v = L^-1 k_s; var = k(p,p) - |v|^2
  double var = sigma_f_ * sigma_f_ + 1e-8;
  for (double v : ks) var -= v * v;
  *mean = mu;
  if (stddev) *stddev = std::sqrt(std::max(var, 0.0));
}

}  // namespace kolo::autotune
