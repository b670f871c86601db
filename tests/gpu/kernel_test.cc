// The reduction and batched-copy kernels against host references: the CPU
// reduction (common/reduce.h, the agent's host path) must give the very same
// bytes for every dtype x op, odd sizes, misaligned buffers (scalar heads and
// tails, and the all-scalar fallback), in-place outputs and scale factors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "agent/gpu/batched_copy.h"
#include "agent/gpu/device.h"
#include "agent/gpu/reduce.h"
#include "common/half.h"
#include "common/reduce.h"
#include "tests/gpu/gpu_test_util.h"

namespace kolo::gpu {
namespace {

using Bytes = std::vector<unsigned char>;

// Random elements of `t` (floats with fractions, integers over their range
// for sum/min/max, small ones for product so that some products do not wrap).
Bytes randomElems(DataType t, ReduceOp op, size_t count, std::mt19937_64& rng) {
  Bytes b(count * dataTypeSize(t));
  std::uniform_real_distribution<double> real(-4.0, 4.0);
  const bool small = op == ReduceOp::kProduct;
  for (size_t i = 0; i < count; ++i) {
    unsigned char* p = b.data() + i * dataTypeSize(t);
    const double r = real(rng);
    // int64 sums stay far from overflow (signed overflow is undefined on the host).
    const int64_t k = small ? static_cast<int64_t>(rng() % 5) - 2 : static_cast<int64_t>(rng()) >> 24;
    switch (t) {
      case DataType::kFloat16: { uint16_t h = floatToHalf(static_cast<float>(r)); std::memcpy(p, &h, 2); break; }
      case DataType::kBFloat16: { uint16_t h = floatToBf16(static_cast<float>(r)); std::memcpy(p, &h, 2); break; }
      case DataType::kFloat32: { float f = static_cast<float>(r); std::memcpy(p, &f, 4); break; }
      case DataType::kFloat64: std::memcpy(p, &r, 8); break;
      case DataType::kInt8: { int8_t x = static_cast<int8_t>(k); std::memcpy(p, &x, 1); break; }
      case DataType::kUint8: { uint8_t x = static_cast<uint8_t>(k); std::memcpy(p, &x, 1); break; }
      case DataType::kInt32: { int32_t x = static_cast<int32_t>(small ? k : k % 100000); std::memcpy(p, &x, 4); break; }
      case DataType::kInt64: std::memcpy(p, &k, 8); break;
    }
  }
  return b;
}

::testing::AssertionResult sameBytes(const Bytes& got, const Bytes& want, size_t es) {
  if (got == want) return ::testing::AssertionSuccess();
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  return ::testing::AssertionFailure() << "first difference in element " << i / es << " of "
                                       << got.size() / es;
}

struct Shape {
  size_t count;
  size_t offset;  // elements past a 256-byte aligned base (misaligned when != 0)
  int nsrc;
  bool skew;      // one source at a different offset: the all-scalar path
  bool in_place;  // output 0 is source 0
  int ndst;
  double pre, post;
};

// Sizes, misalignments, source/output counts and scale factors every
// reduction test goes through.
std::vector<Shape> reduceShapes() {
  std::vector<Shape> shapes;
  for (size_t count : {size_t{1}, size_t{7}, size_t{33}, size_t{1000}}) {
    for (size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {
      for (int nsrc : {1, 2, 3, 8}) {
        shapes.push_back({count, offset, nsrc, false, false, 1, 1.0, 1.0});
      }
    }
    shapes.push_back({count, 0, 4, true, false, 1, 1.0, 1.0});
    shapes.push_back({count, 1, 3, false, true, 2, 1.0, 1.0});
    shapes.push_back({count, 0, 4, false, false, 1, 0.5, 1.0 / 3.0});
  }
  shapes.push_back({(size_t{1} << 20) + 3, 0, 2, false, false, 1, 1.0, 1.0});
  shapes.push_back({(size_t{1} << 20) + 3, 1, 4, false, true, 3, 1.0, 0.25});
  shapes.push_back({size_t{1} << 16, 0, kMaxReduceSources, false, false, kMaxReduceOutputs, 1.0, 1.0});
  return shapes;
}

struct KernelCase {
  DataType dtype;
  ReduceOp op;
};

class ReduceKernelTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(ReduceKernelTest, MatchesTheCpuReductionBitForBit) {
  KOLO_REQUIRE_GPU();
  const auto [t, op] = GetParam();
  const size_t es = dataTypeSize(t);
  auto stream = Stream::create();
  ASSERT_TRUE(stream.isOk()) << stream.status().toString();
  std::mt19937_64 rng(static_cast<uint64_t>(t) * 131 + static_cast<uint64_t>(op));

  const std::vector<Shape> shapes = reduceShapes();
  for (const Shape& sh : shapes) {
    SCOPED_TRACE("count=" + std::to_string(sh.count) + " offset=" + std::to_string(sh.offset) +
                 " nsrc=" + std::to_string(sh.nsrc) + " skew=" + std::to_string(sh.skew) +
                 " in_place=" + std::to_string(sh.in_place) + " ndst=" + std::to_string(sh.ndst) +
                 " pre=" + std::to_string(sh.pre) + " post=" + std::to_string(sh.post));
    const size_t bytes = sh.count * es;
    const size_t slot = (bytes + 16 * es + 255) / 256 * 256 + 256;
    const int nbuf = sh.nsrc + sh.ndst;
    auto pool = DeviceBuffer::allocate(slot * nbuf);
    ASSERT_TRUE(pool.isOk()) << pool.status().toString();
    std::vector<Bytes> in;
    std::vector<const void*> dsrc;
    std::vector<const void*> hsrc;
    for (int j = 0; j < sh.nsrc; ++j) {
      in.push_back(randomElems(t, op, sh.count, rng));
      const size_t off = (sh.offset + (sh.skew && j == 1 ? 1 : 0)) * es;
      char* p = pool->as<char>() + j * slot + off;
      KOLO_ASSERT_CUDA(cudaMemcpy(p, in.back().data(), bytes, cudaMemcpyHostToDevice));
      dsrc.push_back(p);
    }
    for (const auto& b : in) hsrc.push_back(b.data());
    std::vector<void*> ddst;
    for (int d = 0; d < sh.ndst; ++d) {
      if (d == 0 && sh.in_place) {
        ddst.push_back(const_cast<void*>(dsrc[0]));
      } else {
        char* p = pool->as<char>() + (sh.nsrc + d) * slot + sh.offset * es;
        KOLO_ASSERT_CUDA(cudaMemset(p, 0xA5, bytes));
        ddst.push_back(p);
      }
    }
    // Reference: the CPU reduction.
    Bytes want(bytes);
    void* hdst[1] = {want.data()};
    reduceBlocks(t, op, hsrc.data(), sh.nsrc, hdst, 1, sh.count, sh.pre, sh.post);

    KOLO_ASSERT_OK(launchReduce(t, op, dsrc.data(), sh.nsrc, ddst.data(), sh.ndst, sh.count, sh.pre,
                                sh.post, stream->get()));
    KOLO_ASSERT_OK(stream->synchronize(60000));
    for (int d = 0; d < sh.ndst; ++d) {
      Bytes got(bytes);
      KOLO_ASSERT_CUDA(cudaMemcpy(got.data(), ddst[d], bytes, cudaMemcpyDeviceToHost));
      EXPECT_TRUE(sameBytes(got, want, es)) << "output " << d;
    }
  }
}

// The kernel's own code run on the CPU (testing::reduceOnHost): needs no
// GPU, so the vector split, element packing and dispatch of the device code
// are checked on every CUDA build.
TEST_P(ReduceKernelTest, KernelCodeRunOnTheHostMatchesTheCpuReduction) {
  const auto [t, op] = GetParam();
  const size_t es = dataTypeSize(t);
  std::mt19937_64 rng(static_cast<uint64_t>(t) * 977 + static_cast<uint64_t>(op));
  const std::vector<Shape> shapes = reduceShapes();
  const int kThreads[] = {1, 37, 256};
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& sh = shapes[si];
    const int threads = kThreads[si % 3];
    SCOPED_TRACE("count=" + std::to_string(sh.count) + " offset=" + std::to_string(sh.offset) +
                 " nsrc=" + std::to_string(sh.nsrc) + " skew=" + std::to_string(sh.skew) +
                 " in_place=" + std::to_string(sh.in_place) + " ndst=" + std::to_string(sh.ndst) +
                 " threads=" + std::to_string(threads));
    const size_t bytes = sh.count * es;
    const size_t slot = (bytes + 16 * es + 255) / 256 * 256 + 256;
    const int nbuf = sh.nsrc + sh.ndst;
    Bytes pool(slot * nbuf + 256);
    char* base = reinterpret_cast<char*>(
        (reinterpret_cast<uintptr_t>(pool.data()) + 255) / 256 * 256);
    std::vector<Bytes> in;
    std::vector<const void*> psrc;
    std::vector<const void*> hsrc;
    for (int j = 0; j < sh.nsrc; ++j) {
      in.push_back(randomElems(t, op, sh.count, rng));
      const size_t off = (sh.offset + (sh.skew && j == 1 ? 1 : 0)) * es;
      char* p = base + j * slot + off;
      std::memcpy(p, in.back().data(), bytes);
      psrc.push_back(p);
      hsrc.push_back(in.back().data());
    }
    std::vector<void*> pdst;
    for (int d = 0; d < sh.ndst; ++d) {
      if (d == 0 && sh.in_place) {
        pdst.push_back(const_cast<void*>(psrc[0]));
      } else {
        char* p = base + (sh.nsrc + d) * slot + sh.offset * es;
        std::memset(p, 0xA5, bytes);
        pdst.push_back(p);
      }
    }
    Bytes want(bytes);
    void* hdst[1] = {want.data()};
    reduceBlocks(t, op, hsrc.data(), sh.nsrc, hdst, 1, sh.count, sh.pre, sh.post);
    KOLO_ASSERT_OK(testing::reduceOnHost(t, op, psrc.data(), sh.nsrc, pdst.data(), sh.ndst,
                                         sh.count, sh.pre, sh.post, threads));
    for (int d = 0; d < sh.ndst; ++d) {
      Bytes got(static_cast<unsigned char*>(pdst[d]), static_cast<unsigned char*>(pdst[d]) + bytes);
      EXPECT_TRUE(sameBytes(got, want, es)) << "output " << d;
    }
  }
}

std::vector<KernelCase> kernelCases() {
  std::vector<KernelCase> out;
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                        ReduceOp::kProduct}) {
      out.push_back({static_cast<DataType>(t), op});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceKernelTest, ::testing::ValuesIn(kernelCases()),
                         [](const ::testing::TestParamInfo<KernelCase>& i) {
                           return std::string(dataTypeName(i.param.dtype)) + "_" +
                                  std::string(reduceOpName(i.param.op));
                         });

TEST(ReduceKernel, RefusesBadArguments) {
  // Argument checks come before any CUDA call: no GPU needed.
  const void* srcs[kMaxReduceSources + 1] = {};
  void* dsts[1] = {};
  Status s = launchReduce(DataType::kFloat32, ReduceOp::kSum, srcs, kMaxReduceSources + 1, dsts, 1,
                          10, 1.0, 1.0, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "GPU reduce: 17 sources (1..16 supported)");
  s = launchReduce(DataType::kFloat32, ReduceOp::kSum, srcs, 2, dsts, 1, 10, 1.0, 1.0, nullptr);
  EXPECT_EQ(s.message(), "GPU reduce: source 0 is null");
  s = launchReduce(static_cast<DataType>(42), ReduceOp::kSum, srcs, 2, dsts, 1, 10, 1.0, 1.0, nullptr);
  EXPECT_EQ(s.message(), "GPU reduce: unknown dtype 42");
}

TEST(BatchedCopyKernel, KernelCodeRunOnTheHostCopiesEverySegmentExactly) {
  // testing::batchedCopyOnHost: the kernel's per-item code on the CPU.
  std::mt19937_64 rng(11);
  constexpr size_t kPool = 2 << 20;
  Bytes src(kPool), dst(kPool, 0), want(kPool, 0);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  std::vector<CopySegment> segs;
  size_t dpos = 0;
  for (int i = 0; i < 300; ++i) {
    const size_t n = i % 50 == 0 ? 0 : rng() % 5000;
    const size_t soff = rng() % (kPool - n);
    size_t doff = dpos;
    const uintptr_t sa = reinterpret_cast<uintptr_t>(src.data()) + soff;
    const uintptr_t da = reinterpret_cast<uintptr_t>(dst.data()) + doff;
    switch (i % 3) {
      case 0: doff += (sa - da) % 16; break;  // same address offset mod 16
      case 1: doff += (sa - da + 4) % 16; break;  // 4 bytes apart mod 16: same mod 4 only
      default: doff += rng() % 16; break;
    }
    ASSERT_LT(doff + n, kPool);
    segs.push_back({src.data() + soff, dst.data() + doff, n});
    std::memcpy(want.data() + doff, src.data() + soff, n);
    dpos = doff + n + 1;
  }
  auto launches = testing::batchedCopyOnHost(segs, 1024);
  ASSERT_TRUE(launches.isOk()) << launches.status().toString();
  EXPECT_GT(*launches, 1);
  EXPECT_TRUE(sameBytes(dst, want, 1));
}

TEST(BatchedCopyKernel, CopiesEverySegmentExactly) {
  KOLO_REQUIRE_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.isOk()) << stream.status().toString();
  std::mt19937_64 rng(7);
  // 500 segments (several launches) of 0..9000 bytes at every alignment
  // relation: same offset mod 16, same mod 4 only, and unrelated.
  constexpr size_t kPool = 8 << 20;
  auto src = DeviceBuffer::allocate(kPool);
  auto dst = DeviceBuffer::allocate(kPool);
  ASSERT_TRUE(src.isOk() && dst.isOk());
  Bytes hsrc(kPool);
  for (auto& b : hsrc) b = static_cast<unsigned char>(rng());
  KOLO_ASSERT_CUDA(cudaMemcpy(src->data(), hsrc.data(), kPool, cudaMemcpyHostToDevice));
  KOLO_ASSERT_CUDA(cudaMemset(dst->data(), 0, kPool));
  Bytes want(kPool, 0);
  std::vector<CopySegment> segs;
  size_t dpos = 0;
  for (int i = 0; i < 500; ++i) {
    const size_t n = i % 50 == 0 ? 0 : rng() % 9000;
    const size_t soff = rng() % (kPool - n);
    size_t doff = dpos;
    switch (i % 3) {
      case 0: doff += (soff - doff) % 16; break;  // same offset mod 16
      case 1: doff += (soff - doff + 4) % 16; break;  // 4 bytes apart mod 16: same mod 4 only
      default: doff += rng() % 16; break;
    }
    ASSERT_LT(doff + n, kPool);
    segs.push_back({src->as<char>() + soff, dst->as<char>() + doff, n});
    std::memcpy(want.data() + doff, hsrc.data() + soff, n);
    dpos = doff + n + 1;
  }
  auto launches = batchedCopy(segs, stream->get(), 4096);
  ASSERT_TRUE(launches.isOk()) << launches.status().toString();
  auto plan = planBatchedCopy(segs, 4096, kMaxCopyItemsPerLaunch);
  ASSERT_TRUE(plan.isOk());
  EXPECT_EQ(*launches, static_cast<int>(plan->size()));
  EXPECT_GT(*launches, 1);
  KOLO_ASSERT_OK(stream->synchronize(60000));
  Bytes got(kPool);
  KOLO_ASSERT_CUDA(cudaMemcpy(got.data(), dst->data(), kPool, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(sameBytes(got, want, 1));
}

TEST(BatchedCopyKernel, RunsAfterEarlierWorkOnTheSameStream) {
  KOLO_REQUIRE_GPU();
  // Ordering: a busy kernel, then an async fill, then the copy must see the fill.
  auto stream = Stream::create();
  ASSERT_TRUE(stream.isOk());
  auto a = DeviceBuffer::allocate(1 << 20);
  auto b = DeviceBuffer::allocate(1 << 20);
  ASSERT_TRUE(a.isOk() && b.isOk());
  KOLO_ASSERT_CUDA(cudaMemset(a->data(), 0, 1 << 20));
  KOLO_ASSERT_CUDA(cudaDeviceSynchronize());
  testing::launchBusy(stream->get(), 50'000'000);
  KOLO_ASSERT_CUDA(cudaMemsetAsync(a->data(), 0x5C, 1 << 20, stream->get()));
  auto n = batchedCopy({{a->data(), b->data(), size_t{1} << 20}}, stream->get());
  ASSERT_TRUE(n.isOk()) << n.status().toString();
  KOLO_ASSERT_OK(stream->synchronize(60000));
  Bytes got(1 << 20);
  KOLO_ASSERT_CUDA(cudaMemcpy(got.data(), b->data(), got.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(sameBytes(got, Bytes(1 << 20, 0x5C), 1));
}

}  // namespace
}  // namespace kolo::gpu
