// The reduction kernel (see reduce.h). One template per (storage type, op);
// prescale/postscale are runtime flags. All arithmetic goes through the
// explicitly rounded intrinsics (__fadd_rn, __dmul_rn, ...) so that nvcc
// never contracts into an FMA and results match the CPU path bit for bit.
//
// The kernel's body is __host__ __device__: testing::reduceOnHost runs the
// very same code on the CPU, thread after thread, so its logic (vector
// split, element packing, dispatch) is tested on machines without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "agent/gpu/cuda_status.h"
#include "agent/gpu/plan.h"
#include "agent/gpu/reduce.h"

namespace kolo::gpu {
namespace {

#define KOLO_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define KOLO_UNROLL _Pragma("unroll")
#else
#define KOLO_UNROLL  // the host compiler's own choice (GCC warns on the pragma)
#endif

// Explicitly rounded arithmetic: intrinsics on the device (never fused),
// plain IEEE operations on the host.
KOLO_HD float addRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KOLO_HD float mulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KOLO_HD double addRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KOLO_HD double mulRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KOLO_HD float toFloatRn(double a) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(a);
#else
  return static_cast<float>(a);
#endif
}

struct F16 { uint16_t v; };
struct BF16 { uint16_t v; };

template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<F16> { using type = float; };
template <> struct AccOf<BF16> { using type = float; };

template <typename T>
KOLO_HD typename AccOf<T>::type loadElem(T x) {
  if constexpr (std::is_same_v<T, F16>) return __half2float(__ushort_as_half(x.v));
  else if constexpr (std::is_same_v<T, BF16>) return __bfloat162float(__ushort_as_bfloat16(x.v));
  else return x;
}

template <typename T>
KOLO_HD T storeElem(typename AccOf<T>::type a) {
  if constexpr (std::is_same_v<T, F16>) return F16{__half_as_ushort(__float2half_rn(a))};
  else if constexpr (std::is_same_v<T, BF16>) return BF16{__bfloat16_as_ushort(__float2bfloat16_rn(a))};
  else return a;
}

// As common/reduce.cc scaleVal (Horovod's ScaleBufferCPUImpl): float (and
// the 16-bit floats, accumulated in float) multiply by the factor rounded to
// float, double in double, integers in double truncated toward zero.
template <typename A>
KOLO_HD A scaleBy(A v, double f) {
  if constexpr (std::is_same_v<A, float>) return mulRn(toFloatRn(f), v);
  else if constexpr (std::is_same_v<A, double>) return mulRn(v, f);
  else return static_cast<A>(mulRn(static_cast<double>(v), f));
}

// A prescaled input, rounded back to its type for the 16-bit floats (as
// common/reduce.cc: Horovod scales the buffer in place before reducing).
template <typename T, typename A>
KOLO_HD A preScale(A v, double f) {
  A x = scaleBy(v, f);
  if constexpr (std::is_same_v<T, F16> || std::is_same_v<T, BF16>) return loadElem<T>(storeElem<T>(x));
  else return x;
}

template <typename A, int OP>
KOLO_HD A combine(A acc, A x) {
  if constexpr (OP == static_cast<int>(ReduceOp::kSum)) {
    if constexpr (std::is_floating_point_v<A>) return addRn(acc, x);
    else return static_cast<A>(acc + x);
  } else if constexpr (OP == static_cast<int>(ReduceOp::kProduct)) {
    if constexpr (std::is_floating_point_v<A>) return mulRn(acc, x);
    else return static_cast<A>(acc * x);
  } else if constexpr (OP == static_cast<int>(ReduceOp::kMin)) {
    return x < acc ? x : acc;
  } else {
    return x > acc ? x : acc;
  }
}

struct Params {
  const void* src[kMaxReduceSources];
  void* dst[kMaxReduceOutputs];
  int nsrc;
  int ndst;
  uint64_t head;     // scalar elements [0, head)
  uint64_t vectors;  // 16-byte vectors from element `head`
  uint64_t tail;     // scalar elements after the vectors
  double pre;
  double post;
  bool do_pre;
  bool do_post;
};

template <typename T, int OP>
KOLO_HD void reduceOne(const Params& p, uint64_t i) {
  using A = typename AccOf<T>::type;
  A acc = loadElem<T>(static_cast<const T*>(p.src[0])[i]);
  if (p.do_pre) acc = preScale<T>(acc, p.pre);
  for (int j = 1; j < p.nsrc; ++j) {
    A x = loadElem<T>(static_cast<const T*>(p.src[j])[i]);
    if (p.do_pre) x = preScale<T>(x, p.pre);
    acc = combine<A, OP>(acc, x);
  }
  if (p.do_post) acc = scaleBy(acc, p.post);
  const T out = storeElem<T>(acc);
  for (int d = 0; d < p.ndst; ++d) static_cast<T*>(p.dst[d])[i] = out;
}

// Element e of a 16-byte vector held in registers (little endian), and the
// reverse. With the element loops unrolled every index is a constant, so
// nothing goes through local memory (a union of uint4 and T[] spilled for
// the 2-byte types).
template <typename T>
KOLO_HD T getElem(const uint4& u, int e) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  T t;
  if constexpr (sizeof(T) == 8) {
    const uint64_t b = (static_cast<uint64_t>(w[2 * e + 1]) << 32) | w[2 * e];
    memcpy(&t, &b, 8);
  } else if constexpr (sizeof(T) == 4) {
    memcpy(&t, &w[e], 4);
  } else if constexpr (sizeof(T) == 2) {
    const uint16_t b = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
    memcpy(&t, &b, 2);
  } else {
    const uint8_t b = static_cast<uint8_t>(w[e / 4] >> (8 * (e % 4)));
    memcpy(&t, &b, 1);
  }
  return t;
}

template <typename T>
KOLO_HD void setElem(uint32_t (&w)[4], int e, T t) {
  if constexpr (sizeof(T) == 8) {
    uint64_t b;
    memcpy(&b, &t, 8);
    w[2 * e] = static_cast<uint32_t>(b);
    w[2 * e + 1] = static_cast<uint32_t>(b >> 32);
  } else if constexpr (sizeof(T) == 4) {
    memcpy(&w[e], &t, 4);
  } else if constexpr (sizeof(T) == 2) {
    uint16_t b;
    memcpy(&b, &t, 2);
    w[e / 2] |= static_cast<uint32_t>(b) << (16 * (e % 2));
  } else {
    uint8_t b;
    memcpy(&b, &t, 1);
    w[e / 4] |= static_cast<uint32_t>(b) << (8 * (e % 4));
  }
}

// What thread `tid` of `stride` threads does.
template <typename T, int OP>
KOLO_HD void reduceSlice(const Params& p, uint64_t tid, uint64_t stride) {
  using A = typename AccOf<T>::type;
  constexpr int kE = static_cast<int>(kVectorBytes / sizeof(T));

  // Body: 16-byte vectors. Plain (coherent) loads: an output may alias a source.
  for (uint64_t v = tid; v < p.vectors; v += stride) {
    const uint64_t byte_off = p.head * sizeof(T) + v * kVectorBytes;
    A acc[kE];
    uint4 in = *reinterpret_cast<const uint4*>(static_cast<const char*>(p.src[0]) + byte_off);
KOLO_UNROLL
    for (int e = 0; e < kE; ++e) {
      acc[e] = loadElem<T>(getElem<T>(in, e));
      if (p.do_pre) acc[e] = preScale<T>(acc[e], p.pre);
    }
    for (int j = 1; j < p.nsrc; ++j) {
      in = *reinterpret_cast<const uint4*>(static_cast<const char*>(p.src[j]) + byte_off);
KOLO_UNROLL
      for (int e = 0; e < kE; ++e) {
        A x = loadElem<T>(getElem<T>(in, e));
        if (p.do_pre) x = preScale<T>(x, p.pre);
        acc[e] = combine<A, OP>(acc[e], x);
      }
    }
    uint32_t w[4] = {0, 0, 0, 0};
KOLO_UNROLL
    for (int e = 0; e < kE; ++e) {
      if (p.do_post) acc[e] = scaleBy(acc[e], p.post);
      setElem<T>(w, e, storeElem<T>(acc[e]));
    }
    const uint4 out = make_uint4(w[0], w[1], w[2], w[3]);
    for (int d = 0; d < p.ndst; ++d)
      *reinterpret_cast<uint4*>(static_cast<char*>(p.dst[d]) + byte_off) = out;
  }

  // Head and tail, element by element.
  const uint64_t scalars = p.head + p.tail;
  const uint64_t tail_start = p.head + p.vectors * kE;
  for (uint64_t s = tid; s < scalars; s += stride) {
    reduceOne<T, OP>(p, s < p.head ? s : tail_start + (s - p.head));
  }
}

template <typename T, int OP>
__global__ void __launch_bounds__(256) reduceKernel(const Params p) {
  reduceSlice<T, OP>(p, blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x,
                     static_cast<uint64_t>(gridDim.x) * blockDim.x);
}

// Runs one (T, OP) instantiation: on a stream, or on the host for tests.
struct DeviceRunner {
  cudaStream_t stream;
  template <typename T, int OP>
  Status run(const Params& p) const {
    constexpr int kThreads = 256;
    constexpr uint64_t kMaxBlocks = 8192;  // grid-stride beyond this
    const uint64_t work = std::max(p.vectors, p.head + p.tail);
    const uint64_t blocks =
        std::min(kMaxBlocks, std::max<uint64_t>(1, (work + kThreads - 1) / kThreads));
    reduceKernel<T, OP><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
    KOLO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return okStatus();
  }
};

struct HostRunner {
  int threads;
  template <typename T, int OP>
  Status run(const Params& p) const {
    for (int t = 0; t < threads; ++t) reduceSlice<T, OP>(p, static_cast<uint64_t>(t), static_cast<uint64_t>(threads));
    return okStatus();
  }
};

template <typename T, typename Runner>
Status dispatchOp(ReduceOp op, const Params& p, const Runner& r) {
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      return r.template run<T, static_cast<int>(ReduceOp::kSum)>(p);
    case ReduceOp::kMin:
      return r.template run<T, static_cast<int>(ReduceOp::kMin)>(p);
    case ReduceOp::kMax:
      return r.template run<T, static_cast<int>(ReduceOp::kMax)>(p);
    case ReduceOp::kProduct:
      return r.template run<T, static_cast<int>(ReduceOp::kProduct)>(p);
  }
  return invalidArgument("GPU reduce: unknown op " + std::to_string(static_cast<int>(op)));
}

template <typename Runner>
Status reduceWith(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                  void* const* dsts, int ndst, size_t count, double prescale, double postscale,
                  const Runner& runner) {
  if (nsrc < 1 || nsrc > kMaxReduceSources)
    return invalidArgument("GPU reduce: " + std::to_string(nsrc) + " sources (1.." +
                           std::to_string(kMaxReduceSources) + " supported)");
  if (ndst < 1 || ndst > kMaxReduceOutputs)
    return invalidArgument("GPU reduce: " + std::to_string(ndst) + " outputs (1.." +
                           std::to_string(kMaxReduceOutputs) + " supported)");
  if (!isValidDataType(static_cast<int>(dtype)))
    return invalidArgument("GPU reduce: unknown dtype " + std::to_string(static_cast<int>(dtype)));
  if (!isValidReduceOp(static_cast<int>(op)))
    return invalidArgument("GPU reduce: unknown op " + std::to_string(static_cast<int>(op)));
  if (count == 0) return okStatus();
  Params p = {};
  uintptr_t addrs[kMaxReduceSources + kMaxReduceOutputs];
  for (int j = 0; j < nsrc; ++j) {
    if (srcs[j] == nullptr) return invalidArgument("GPU reduce: source " + std::to_string(j) + " is null");
    p.src[j] = srcs[j];
    addrs[j] = reinterpret_cast<uintptr_t>(srcs[j]);
  }
  for (int d = 0; d < ndst; ++d) {
    if (dsts[d] == nullptr) return invalidArgument("GPU reduce: output " + std::to_string(d) + " is null");
    p.dst[d] = dsts[d];
    addrs[nsrc + d] = reinterpret_cast<uintptr_t>(dsts[d]);
  }
  p.nsrc = nsrc;
  p.ndst = ndst;
  const VectorSplit split = planVectorSplit(addrs, nsrc + ndst, count, dataTypeSize(dtype));
  p.head = split.head;
  p.vectors = split.vectors;
  p.tail = split.tail;
  p.pre = prescale;
  p.post = postscale;
  p.do_pre = prescale != 1.0;
  p.do_post = postscale != 1.0;
  switch (dtype) {
    case DataType::kFloat16: return dispatchOp<F16>(op, p, runner);
    case DataType::kBFloat16: return dispatchOp<BF16>(op, p, runner);
    case DataType::kFloat32: return dispatchOp<float>(op, p, runner);
    case DataType::kFloat64: return dispatchOp<double>(op, p, runner);
    case DataType::kInt8: return dispatchOp<int8_t>(op, p, runner);
    case DataType::kUint8: return dispatchOp<uint8_t>(op, p, runner);
    case DataType::kInt32: return dispatchOp<int32_t>(op, p, runner);
    case DataType::kInt64: return dispatchOp<int64_t>(op, p, runner);
  }
  return invalidArgument("GPU reduce: unknown dtype");
}

}  // namespace

Status launchReduce(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                    void* const* dsts, int ndst, size_t count, double prescale, double postscale,
                    cudaStream_t stream) {
  return reduceWith(dtype, op, srcs, nsrc, dsts, ndst, count, prescale, postscale,
                    DeviceRunner{stream});
}

namespace testing {

Status reduceOnHost(DataType dtype, ReduceOp op, const void* const* srcs, int nsrc,
                    void* const* dsts, int ndst, size_t count, double prescale, double postscale,
                    int threads) {
  if (threads < 1) return invalidArgument("reduceOnHost: threads must be >= 1");
  return reduceWith(dtype, op, srcs, nsrc, dsts, ndst, count, prescale, postscale,
                    HostRunner{threads});
}

}  // namespace testing
}  // namespace kolo::gpu
