#include "common/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/half.h"
#include "common/stream_copy.h"

namespace kolo {
namespace {

constexpr size_t kBlock = 2048;  // elements per block: the accumulator stays in L1

struct F16 { uint16_t v; };
struct BF16 { uint16_t v; };

template <typename T> struct Acc { using type = T; };
template <> struct Acc<F16> { using type = float; };
template <> struct Acc<BF16> { using type = float; };

template <typename T>
inline typename Acc<T>::type load(const T* p, size_t i) {
  if constexpr (std::is_same_v<T, F16>) return halfToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
  else if constexpr (std::is_same_v<T, BF16>) return bf16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
  else return p[i];
}

template <typename T>
inline void store(T* p, size_t i, typename Acc<T>::type v) {
  if constexpr (std::is_same_v<T, F16>) reinterpret_cast<uint16_t*>(p)[i] = floatToHalf(v);
  else if constexpr (std::is_same_v<T, BF16>) reinterpret_cast<uint16_t*>(p)[i] = floatToBf16(v);
  else p[i] = v;
}

// Scale factors as Horovod applies them on the CPU (ScaleBufferCPUImpl):
// float32 (and the 16-bit floats, in float) multiply by the factor rounded
// to float, float64 in double, integers in double truncated toward zero.
// Results are bit for bit Horovod's.
template <typename A>
inline A scaleVal(A v, double f) {
  if constexpr (std::is_floating_point_v<A>) {
    if constexpr (std::is_same_v<A, float>) return static_cast<float>(f) * v;
    else return f * v;
  } else {
    return static_cast<A>(f * static_cast<double>(v));
  }
}

// A prescaled 16-bit float input is rounded back to its type before the
// reduction, as Horovod scales the buffer in place before reducing it.
template <typename T>
inline typename Acc<T>::type roundTrip(typename Acc<T>::type v) {
  if constexpr (std::is_same_v<T, F16>) return halfToFloat(floatToHalf(v));
  else if constexpr (std::is_same_v<T, BF16>) return bf16ToFloat(floatToBf16(v));
  else return v;
}

// Integer sums and products wrap modulo 2^bits, as on the GPU kernel and
// in MPI's and Gloo's loops on every machine kolo runs on; written in
// unsigned arithmetic (at least unsigned int wide, so that 16-bit operands
// do not promote to int), because a signed overflow is undefined
// behaviour in C++ (UBSan stops on it). The same bits for every result
// that does not overflow.
template <typename A>
using WrapT = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
template <typename A>
inline A addOf(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<WrapT<A>>(a) + static_cast<WrapT<A>>(b));
  } else {
    return static_cast<A>(a + b);
  }
}
template <typename A>
inline A mulOf(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<WrapT<A>>(a) * static_cast<WrapT<A>>(b));
  } else {
    return static_cast<A>(a * b);
  }
}

template <typename A>
inline void combine(ReduceOp op, A* __restrict acc, const A* __restrict x, size_t n) {
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) acc[i] = addOf(acc[i], x[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
      break;
    case ReduceOp::kProduct:
      for (size_t i = 0; i < n; ++i) acc[i] = mulOf(acc[i], x[i]);
      break;
  }
}

template <typename T>
void reduceTyped(ReduceOp op, const void* const* srcs, int nsrc, void* const* dsts, int ndst,
                 size_t count, double pre, double post) {
  using A = typename Acc<T>::type;
  alignas(64) A acc[kBlock];
  alignas(64) A tmp[kBlock];
  const bool do_pre = pre != 1.0;
  const bool do_post = post != 1.0;
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    if constexpr (std::is_same_v<T, A>) {
      std::memcpy(acc, s0, n * sizeof(A));
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] = load(s0, i);
    }
    if (do_pre) for (size_t i = 0; i < n; ++i) acc[i] = roundTrip<T>(scaleVal(acc[i], pre));
    for (int j = 1; j < nsrc; ++j) {
      const T* sj = static_cast<const T*>(srcs[j]) + base;
      const A* x;
      if constexpr (std::is_same_v<T, A>) {
        if (do_pre) {
          for (size_t i = 0; i < n; ++i) tmp[i] = scaleVal(sj[i], pre);
          x = tmp;
        } else {
          x = sj;
        }
      } else {
        for (size_t i = 0; i < n; ++i) tmp[i] = load(sj, i);
        if (do_pre) for (size_t i = 0; i < n; ++i) tmp[i] = roundTrip<T>(scaleVal(tmp[i], pre));
        x = tmp;
      }
      combine<A>(op, acc, x, n);
    }
    if (do_post) for (size_t i = 0; i < n; ++i) acc[i] = scaleVal(acc[i], post);
    for (int d = 0; d < ndst; ++d) {
      T* dd = static_cast<T*>(dsts[d]) + base;
      if constexpr (std::is_same_v<T, A>) {
        std::memcpy(dd, acc, n * sizeof(A));
      } else {
        for (size_t i = 0; i < n; ++i) store(dd, i, acc[i]);
      }
    }
  }
}

}  // namespace

void reduceBlocks(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                  void* const* dsts, int ndst, size_t count, double prescale, double postscale) {
  if (count == 0 || nsrc <= 0) return;
  if (nsrc == 1 && prescale == 1.0 && postscale == 1.0) {
    // A plain copy (one local rank's slot into the staging buffer, or the
    // agents' result back into it): large ones stream past the cache, as
    // the next reader is another thread or process (stream_copy.h).
    const size_t bytes = count * dataTypeSize(dtype);
    for (int d = 0; d < ndst; ++d) {
      if (dsts[d] != srcs[0]) streamCopy(dsts[d], srcs[0], bytes);
    }
    return;
  }
  switch (dtype) {
    case DataType::kFloat16: return reduceTyped<F16>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kBFloat16: return reduceTyped<BF16>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kFloat32: return reduceTyped<float>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kFloat64: return reduceTyped<double>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kInt8: return reduceTyped<int8_t>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kUint8: return reduceTyped<uint8_t>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kInt32: return reduceTyped<int32_t>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
    case DataType::kInt64: return reduceTyped<int64_t>(op, srcs, nsrc, dsts, ndst, count, prescale, postscale);
  }
}

void scaleBuffer(DataType dtype, void* buf, size_t count, double factor) {
  if (factor == 1.0) return;
  const void* s[1] = {buf};
  void* d[1] = {buf};
  reduceBlocks(dtype, ReduceOp::kSum, s, 1, d, 1, count, factor, 1.0);
}

}  // namespace kolo
