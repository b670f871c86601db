#include "bench/bench_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/half.h"

namespace kolo::bench {

namespace {

// Storage type of each dtype and its conversions to and from double.
template <DataType D>
struct Elem;
template <>
struct Elem<DataType::kFloat16> {
  using T = uint16_t;
  static T from(double v) { return floatToHalf(static_cast<float>(v)); }
  static double to(T v) { return halfToFloat(v); }
};
template <>
struct Elem<DataType::kBFloat16> {
  using T = uint16_t;
  static T from(double v) { return floatToBf16(static_cast<float>(v)); }
  static double to(T v) { return bf16ToFloat(v); }
};
template <typename S>
struct Plain {
  using T = S;
  static T from(double v) { return static_cast<T>(v); }
  static double to(T v) { return static_cast<double>(v); }
};
template <>
struct Elem<DataType::kFloat32> : Plain<float> {};
template <>
struct Elem<DataType::kFloat64> : Plain<double> {};
template <>
struct Elem<DataType::kInt8> : Plain<int8_t> {};
template <>
struct Elem<DataType::kUint8> : Plain<uint8_t> {};
template <>
struct Elem<DataType::kInt32> : Plain<int32_t> {};
template <>
struct Elem<DataType::kInt64> : Plain<int64_t> {};

// Calls f(Elem<D>{}) for the runtime dtype.
template <typename F>
auto dispatch(DataType d, F&& f) {
  switch (d) {
    case DataType::kFloat16:
      return f(Elem<DataType::kFloat16>{});
    case DataType::kBFloat16:
      return f(Elem<DataType::kBFloat16>{});
    case DataType::kFloat32:
      return f(Elem<DataType::kFloat32>{});
    case DataType::kFloat64:
      return f(Elem<DataType::kFloat64>{});
    case DataType::kInt8:
      return f(Elem<DataType::kInt8>{});
    case DataType::kUint8:
      return f(Elem<DataType::kUint8>{});
    case DataType::kInt32:
      return f(Elem<DataType::kInt32>{});
    case DataType::kInt64:
      return f(Elem<DataType::kInt64>{});
  }
  return f(Elem<DataType::kFloat32>{});
}

// Inputs and results repeat with this period in i.
int period(const CheckPattern& p) { return p.op == ReduceOp::kProduct ? 3 : p.modulus; }

int mantissaBits(DataType d) {
  switch (d) {
    case DataType::kFloat16:
      return 10;
    case DataType::kBFloat16:
      return 7;
    case DataType::kFloat32:
      return 23;
    case DataType::kFloat64:
      return 52;
    default:
      return -1;  // integers
  }
}

int clampModulus(double limit, double per_unit) {
  return static_cast<int>(std::clamp(std::floor(limit / per_unit), 1.0, 7.0));
}

}  // namespace

double exactIntegerLimit(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return 2048.0;
    case DataType::kBFloat16:
      return 256.0;
    case DataType::kFloat32:
      return 16777216.0;
    case DataType::kFloat64:
      return 9007199254740992.0;
    case DataType::kInt8:
      return 127.0;
    case DataType::kUint8:
      return 255.0;
    case DataType::kInt32:
      return 2147483647.0;
    case DataType::kInt64:
      return 9007199254740992.0;  // compared through double
  }
  return 0.0;
}

CheckPattern CheckPattern::make(DataType dtype, ReduceOp op, int nranks) {
  CheckPattern p;
  p.dtype = dtype;
  p.op = op;
  p.nranks = std::max(1, nranks);
  const double n = p.nranks;
  const double limit = exactIntegerLimit(dtype);
  // The largest value any partial result reaches per unit of base(i), with
  // rank weights and without them.
  double weighted = 0, plain = 0;
  switch (op) {
    case ReduceOp::kSum:
      weighted = n * (n + 1) / 2;
      plain = n;
      break;
    case ReduceOp::kAverage:
      weighted = n * n;
      plain = n;
      break;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      weighted = n;
      plain = 1;
      break;
    case ReduceOp::kProduct: {
      double twos = std::ceil(n / 3.0);
      p.modulus = 1;
      p.rank_weights = twos < 60 && std::ldexp(1.0, static_cast<int>(twos)) <= limit;
      return p;
    }
  }
  if (weighted <= limit) {
    p.modulus = clampModulus(limit, weighted);
  } else if (plain <= limit) {
    p.rank_weights = false;
    p.modulus = clampModulus(limit, plain);
  } else {
    p.rank_weights = false;
    p.modulus = 1;
    p.feasible = false;
  }
  return p;
}

double CheckPattern::input(int rank, uint64_t i) const {
  if (op == ReduceOp::kProduct) {
    if (!rank_weights) return 1.0;
    return (i + static_cast<uint64_t>(rank)) % 3 == 0 ? 2.0 : 1.0;
  }
  double base = static_cast<double>(i % static_cast<uint64_t>(modulus) + 1);
  if (!rank_weights) return base;
  double w = op == ReduceOp::kAverage ? 2.0 * rank + 1 : rank + 1.0;
  return w * base;
}

double CheckPattern::expected(uint64_t i) const {
  const double n = nranks;
  if (op == ReduceOp::kProduct) {
    if (!rank_weights) return 1.0;
    int twos = 0;
    for (int r = 0; r < nranks; ++r) twos += (i + static_cast<uint64_t>(r)) % 3 == 0 ? 1 : 0;
    return std::ldexp(1.0, twos);
  }
  double base = static_cast<double>(i % static_cast<uint64_t>(modulus) + 1);
  switch (op) {
    case ReduceOp::kSum:
      return base * (rank_weights ? n * (n + 1) / 2 : n);
    case ReduceOp::kAverage:
      return base * (rank_weights ? n : 1.0);
    case ReduceOp::kMin:
      return base;
    case ReduceOp::kMax:
      return base * (rank_weights ? n : 1.0);
    case ReduceOp::kProduct:
      break;
  }
  return 0.0;
}

double CheckPattern::tolerance(double expected_value) const {
  if (op != ReduceOp::kAverage) return 0.0;
  int bits = mantissaBits(dtype);
  if (bits < 0) return 1.0;
  return 2.0 * std::ldexp(std::fabs(expected_value), -bits);
}

void fillInput(const CheckPattern& p, int rank, void* buf, uint64_t count) {
  dispatch(p.dtype, [&](auto e) {
    using E = decltype(e);
    using T = typename E::T;
    const int per = period(p);
    std::vector<T> cycle(per);
    for (int k = 0; k < per; ++k) cycle[k] = E::from(p.input(rank, static_cast<uint64_t>(k)));
    T* out = static_cast<T*>(buf);
    int k = 0;
    for (uint64_t i = 0; i < count; ++i) {
      out[i] = cycle[k];
      if (++k == per) k = 0;
    }
    return 0;
  });
}

void fillValue(DataType dtype, void* buf, uint64_t count, double value) {
  dispatch(dtype, [&](auto e) {
    using E = decltype(e);
    using T = typename E::T;
    std::fill_n(static_cast<T*>(buf), count, E::from(value));
    return 0;
  });
}

uint64_t countWrong(const CheckPattern& p, const void* buf, uint64_t count, uint64_t first) {
  return dispatch(p.dtype, [&](auto e) -> uint64_t {
    using E = decltype(e);
    using T = typename E::T;
    const int per = period(p);
    std::vector<double> want(per), tol(per);
    for (int k = 0; k < per; ++k) {
      want[k] = p.expected(static_cast<uint64_t>(k));
      tol[k] = p.tolerance(want[k]);
    }
    const T* in = static_cast<const T*>(buf);
    uint64_t wrong = 0;
    int k = static_cast<int>(first % static_cast<uint64_t>(per));
    for (uint64_t i = 0; i < count; ++i) {
      // Written so that NaN counts as wrong.
      if (!(std::fabs(E::to(in[i]) - want[k]) <= tol[k])) ++wrong;
      if (++k == per) k = 0;
    }
    return wrong;
  });
}

int movedPeriod(DataType dtype) {
  return static_cast<int>(std::min(251.0, exactIntegerLimit(dtype)));
}

namespace {
// Index into the cycle of movedPeriod values where element 0 of (src, dst) starts.
uint64_t movedOffset(DataType dtype, int src, int dst) {
  const uint64_t l = static_cast<uint64_t>(movedPeriod(dtype));
  return (3 * static_cast<uint64_t>(src) + 5 * static_cast<uint64_t>(dst)) % l;
}
}  // namespace

double movedValue(DataType dtype, int src, int dst, uint64_t i) {
  const uint64_t l = static_cast<uint64_t>(movedPeriod(dtype));
  return static_cast<double>((i % l + movedOffset(dtype, src, dst)) % l + 1);
}

void fillMoved(DataType dtype, int src, int dst, void* buf, uint64_t count) {
  dispatch(dtype, [&](auto e) {
    using E = decltype(e);
    using T = typename E::T;
    const int per = movedPeriod(dtype);
    std::vector<T> cycle(per);
    for (int k = 0; k < per; ++k) cycle[k] = E::from(k + 1);
    T* out = static_cast<T*>(buf);
    int k = static_cast<int>(movedOffset(dtype, src, dst));
    for (uint64_t i = 0; i < count; ++i) {
      out[i] = cycle[k];
      if (++k == per) k = 0;
    }
    return 0;
  });
}

uint64_t countWrongMoved(DataType dtype, int src, int dst, const void* buf, uint64_t count) {
  return dispatch(dtype, [&](auto e) -> uint64_t {
    using E = decltype(e);
    using T = typename E::T;
    const int per = movedPeriod(dtype);
    const T* in = static_cast<const T*>(buf);
    uint64_t wrong = 0;
    int k = static_cast<int>(movedOffset(dtype, src, dst));
    for (uint64_t i = 0; i < count; ++i) {
      if (!(E::to(in[i]) == static_cast<double>(k + 1))) ++wrong;
      if (++k == per) k = 0;
    }
    return wrong;
  });
}

}  // namespace kolo::bench
