// Every dtype x op reduction against a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "common/reduce.h"

namespace kolo {
namespace {

double loadAsDouble(DataType t, const char* p, size_t i) {
  switch (t) {
    case DataType::kFloat16: return halfToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return bf16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32: return reinterpret_cast<const float*>(p)[i];
    case DataType::kFloat64: return reinterpret_cast<const double*>(p)[i];
    case DataType::kInt8: return reinterpret_cast<const int8_t*>(p)[i];
    case DataType::kUint8: return reinterpret_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return reinterpret_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void storeFromDouble(DataType t, char* p, size_t i, double v) {
  switch (t) {
    case DataType::kFloat16: reinterpret_cast<uint16_t*>(p)[i] = floatToHalf(static_cast<float>(v)); break;
    case DataType::kBFloat16: reinterpret_cast<uint16_t*>(p)[i] = floatToBf16(static_cast<float>(v)); break;
    case DataType::kFloat32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: reinterpret_cast<double*>(p)[i] = v; break;
    case DataType::kInt8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DataType::kUint8: reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DataType::kInt32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

struct Case {
  DataType dtype;
  ReduceOp op;
};

class ReduceAllTypes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

// Small integer-valued inputs: every dtype represents them and every
// partial result exactly, so the float64 reference must match bit for bit.
TEST_P(ReduceAllTypes, MatchesFloat64Reference) {
  auto dtype = static_cast<DataType>(std::get<0>(GetParam()));
  auto op = static_cast<ReduceOp>(std::get<1>(GetParam()));
  int k = std::get<2>(GetParam());
  const size_t count = 5003;  // a multiple of nothing
  size_t es = dataTypeSize(dtype);
  std::mt19937 rng(42 + k);
  std::uniform_int_distribution<int> dist(op == ReduceOp::kProduct ? -2 : -3, 3);
  bool is_unsigned = dtype == DataType::kUint8;
  std::vector<std::vector<char>> in(k, std::vector<char>(count * es));
  std::vector<double> ref(count);
  for (size_t i = 0; i < count; ++i) {
    double acc = 0;
    for (int j = 0; j < k; ++j) {
      double v = dist(rng);
      if (is_unsigned) v = std::abs(v);
      if (op == ReduceOp::kProduct && (i % 7 == 0)) v = 1;  // keep products small
      storeFromDouble(dtype, in[j].data(), i, v);
      if (j == 0) {
        acc = v;
      } else if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
        acc += v;
      } else if (op == ReduceOp::kMin) {
        acc = std::min(acc, v);
      } else if (op == ReduceOp::kMax) {
        acc = std::max(acc, v);
      } else {
        acc *= v;
      }
    }
    ref[i] = acc;
  }
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  for (auto& b : in) {
    srcs.push_back(b.data());
    dsts.push_back(b.data());  // in place, written to every slot
  }
  reduceBlocks(dtype, op, srcs.data(), k, dsts.data(), k, count, 1.0, 1.0);
  for (int j = 0; j < k; ++j) {
    for (size_t i = 0; i < count; ++i) {
      double got = loadAsDouble(dtype, in[j].data(), i);
      double want = ref[i];
      if (dtype == DataType::kInt8) want = static_cast<int8_t>(static_cast<int64_t>(want));
      if (dtype == DataType::kUint8) want = static_cast<uint8_t>(static_cast<int64_t>(want));
      ASSERT_EQ(got, want) << dataTypeName(dtype) << " " << reduceOpName(op) << " k=" << k
                           << " slot " << j << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllOps, ReduceAllTypes,
                         ::testing::Combine(::testing::Range(0, kNumDataTypes),
                                            ::testing::Values(0, 1, 3, 4, 5),
                                            ::testing::Values(1, 2, 3, 4)));

TEST(Reduce, ScaleFactorsFloat64) {
  std::vector<double> a = {1.5, -2.25, 3.0}, b = {0.5, 0.25, -1.0}, out(3);
  const void* s[] = {a.data(), b.data()};
  void* d[] = {out.data()};
  reduceBlocks(DataType::kFloat64, ReduceOp::kSum, s, 2, d, 1, 3, 2.0, 0.5);
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(out[i], 0.5 * (2.0 * a[i] + 2.0 * b[i]));
}

// Scale factors as Horovod applies them on the CPU (ScaleBufferCPUImpl), bit
// for bit: float32 multiplies by the factor rounded to float; a prescaled
// float16 input is rounded back to float16 before the reduction; integers
// scale in double and truncate toward zero.
TEST(Reduce, ScaleFactorsBitForBitAsHorovod) {
  const double pre = 0.1915194503788923, post = 0.6221087710398319;  // not representable as float
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> dist(-100, 99);
  const size_t n = 4099;
  std::vector<float> a(n), b(n), out(n);
  std::vector<uint16_t> ha(n), hb(n), hout(n);
  std::vector<int32_t> ia(n), ib(n), iout(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(dist(rng)) * 1.37f;
    b[i] = static_cast<float>(dist(rng)) * 0.71f;
    ha[i] = floatToHalf(static_cast<float>(dist(rng)));
    hb[i] = floatToHalf(static_cast<float>(dist(rng)));
    ia[i] = dist(rng);
    ib[i] = dist(rng);
  }
  {
    const void* s[] = {a.data(), b.data()};
    void* d[] = {out.data()};
    reduceBlocks(DataType::kFloat32, ReduceOp::kSum, s, 2, d, 1, n, pre, post);
    const float fpre = static_cast<float>(pre), fpost = static_cast<float>(post);
    for (size_t i = 0; i < n; ++i) {
      float want = fpost * (fpre * a[i] + fpre * b[i]);
      ASSERT_EQ(std::memcmp(&out[i], &want, sizeof want), 0) << i << ": " << out[i] << " vs " << want;
    }
  }
  {
    const void* s[] = {ha.data(), hb.data()};
    void* d[] = {hout.data()};
    reduceBlocks(DataType::kFloat16, ReduceOp::kSum, s, 2, d, 1, n, pre, 1.0);
    const float fpre = static_cast<float>(pre);
    for (size_t i = 0; i < n; ++i) {
      float x = halfToFloat(floatToHalf(fpre * halfToFloat(ha[i])));
      float y = halfToFloat(floatToHalf(fpre * halfToFloat(hb[i])));
      ASSERT_EQ(hout[i], floatToHalf(x + y)) << i;
    }
  }
  {
    const void* s[] = {ia.data(), ib.data()};
    void* d[] = {iout.data()};
    reduceBlocks(DataType::kInt32, ReduceOp::kSum, s, 2, d, 1, n, pre, post);
    for (size_t i = 0; i < n; ++i) {
      auto x = static_cast<int32_t>(pre * ia[i]), y = static_cast<int32_t>(pre * ib[i]);
      ASSERT_EQ(iout[i], static_cast<int32_t>(post * static_cast<double>(x + y))) << i;
    }
  }
}

TEST(Reduce, Float32RandomAgainstFloat64Tolerance) {
  const size_t n = 100000;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> a(n), b(n), c(n), out(n);
  for (size_t i = 0; i < n; ++i) a[i] = nd(rng), b[i] = nd(rng), c[i] = nd(rng);
  const void* s[] = {a.data(), b.data(), c.data()};
  void* d[] = {out.data()};
  reduceBlocks(DataType::kFloat32, ReduceOp::kSum, s, 3, d, 1, n, 1.0, 1.0 / 3);
  for (size_t i = 0; i < n; ++i) {
    double ref = (double(a[i]) + b[i] + c[i]) / 3;
    ASSERT_NEAR(out[i], ref, 1e-5 * (1 + std::abs(ref)));
  }
}

TEST(Half, RoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7c00) == 0x7c00) continue;  // inf/nan
    ASSERT_EQ(floatToHalf(halfToFloat(v)), v) << std::hex << h;
  }
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(floatToHalf(1.0f + 1.0f / 2048), 0x3c00);  // tie to even
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16ToFloat(floatToBf16(3.0f)), 3.0f);
  EXPECT_EQ(floatToBf16(bitsToFloat(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(floatToBf16(bitsToFloat(0x3f818000u)), 0x3f82);
}

// One source without scaling is a copy (the agent's path for one local rank):
// every destination gets the source's bytes exactly, below and above the
// streaming threshold, for every dtype, and the source is not touched.
TEST(Reduce, OneSourceWithoutScalingCopiesEveryByteToEveryDestination) {
  for (int t = 0; t < kNumDataTypes; ++t) {
    const DataType dtype = static_cast<DataType>(t);
    const size_t es = dataTypeSize(dtype);
    for (size_t count : {size_t{1}, size_t{2049}, (size_t{3} << 20) / es + 3}) {
      std::vector<uint8_t> src(count * es);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + (i >> 9) + 5);
      const std::vector<uint8_t> before = src;
      std::vector<uint8_t> d0(src.size() + 1, 0xEE), d1(src.size() + 1, 0xEE);
      const void* s[] = {src.data()};
      void* d[] = {d0.data() + 1, d1.data() + 1};  // destinations off the source's alignment
      reduceBlocks(dtype, ReduceOp::kSum, s, 1, d, 2, count, 1.0, 1.0);
      ASSERT_EQ(std::memcmp(d0.data() + 1, src.data(), src.size()), 0) << dataTypeName(dtype) << " " << count;
      ASSERT_EQ(std::memcmp(d1.data() + 1, src.data(), src.size()), 0) << dataTypeName(dtype) << " " << count;
      ASSERT_EQ(d0[0], 0xEE);
      ASSERT_EQ(d1[0], 0xEE);
      ASSERT_EQ(src, before);
    }
  }
}

}  // namespace
}  // namespace kolo
