// kolo-gpu-bench: the device path's kernels against the device's own copy
// bandwidth, as nccl-tests-style tables (docs/gpu.md):
//   1. cudaMemcpyAsync device-to-device: the reference bandwidth, bytes read
//      + written (2 S per copy of S bytes).
//   2. the local reduction kernel, k sources of S bytes into one output:
//      (k + 1) S bytes per run; %copy = its bandwidth over the copy's.
//   3. the batched copy kernel moving N small tensors in one launch versus
//      N cudaMemcpyAsync calls; 2 x total bytes per run.
// Times are the median of --iters runs (after --warmup) measured with CUDA
// events on one stream. #wrong counts wrong elements of one checked run.
//
// Usage: kolo-gpu-bench [--device D] [--min-bytes B] [--max-bytes B]
//                       [--warmup N] [--iters N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "agent/gpu/batched_copy.h"
#include "agent/gpu/cuda_status.h"
#include "agent/gpu/device.h"
#include "agent/gpu/reduce.h"

namespace kolo::gpu::bench {
void fillFloat(float* p, size_t n, float v, cudaStream_t s);
}

using namespace kolo;
using namespace kolo::gpu;

namespace {

struct Options {
  int device = 0;
  uint64_t min_bytes = 1 << 20;
  uint64_t max_bytes = uint64_t{256} << 20;
  int warmup = 5;
  int iters = 20;
};

[[noreturn]] void die(const Status& s) {
  std::fprintf(stderr, "kolo-gpu-bench: %s\n", s.toString().c_str());
  std::exit(1);
}
template <typename T>
T check(StatusOr<T> v) {
  if (!v.isOk()) die(v.status());
  return std::move(v).value();
}
void check(const Status& s) {
  if (!s.isOk()) die(s);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kolo-gpu-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") o.device = std::atoi(next());
    else if (a == "--min-bytes") o.min_bytes = std::strtoull(next(), nullptr, 10);
    else if (a == "--max-bytes") o.max_bytes = std::strtoull(next(), nullptr, 10);
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--iters") o.iters = std::max(1, std::atoi(next()));
    else {
      std::fprintf(stderr,
                   "usage: kolo-gpu-bench [--device D] [--min-bytes B] [--max-bytes B] "
                   "[--warmup N] [--iters N]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

// Median time in microseconds of `iters` runs of `body` on `stream`.
double timeIt(cudaStream_t stream, int warmup, int iters, const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i) body();
  Event start = check(Event::create(cudaEventDefault));
  Event stop = check(Event::create(cudaEventDefault));
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    check(start.record(stream));
    body();
    check(stop.record(stream));
    if (cudaEventSynchronize(stop.get()) != cudaSuccess) die(cudaStatus(cudaGetLastError(), "cudaEventSynchronize"));
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start.get(), stop.get()) != cudaSuccess)
      die(cudaStatus(cudaGetLastError(), "cudaEventElapsedTime"));
    us.push_back(ms * 1000.0);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

double gbps(double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0; }

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  check(deviceCount().status());
  check(setDevice(o.device));
  cudaDeviceProp prop = {};
  if (cudaGetDeviceProperties(&prop, o.device) != cudaSuccess) die(internalError("cudaGetDeviceProperties"));
  Stream stream = check(Stream::create());
  cudaStream_t s = stream.get();
  constexpr int kMaxK = 8;
  std::vector<DeviceBuffer> bufs;
  for (int j = 0; j < kMaxK + 1; ++j) bufs.push_back(check(DeviceBuffer::allocate(o.max_bytes)));

  std::printf("# kolo-gpu-bench on %s (sm_%d%d, %d SMs), device %d\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, o.device);
  std::printf("# warmup %d, iters %d; GB/s counts bytes read + written\n#\n", o.warmup, o.iters);

  // 1 + 2: copy bandwidth and the reduction kernel.
  std::printf("#%11s %13s %9s %7s %3s %11s %12s %8s %8s\n", "size", "count", "type", "op", "k",
              "time(us)", "GB/s", "%copy", "#wrong");
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    const double copy_us = timeIt(s, o.warmup, o.iters, [&] {
      if (cudaMemcpyAsync(bufs[1].data(), bufs[0].data(), bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        die(cudaStatus(cudaGetLastError(), "cudaMemcpyAsync"));
    });
    const double copy_bw = gbps(2.0 * bytes, copy_us);
    std::printf("%12" PRIu64 " %13zu %9s %7s %3d %11.1f %12.1f %8.1f %8s\n", bytes, count, "bytes",
                "memcpy", 1, copy_us, copy_bw, 100.0, "N/A");
    for (int k : {2, 4, 8}) {
      std::vector<const void*> srcs;
      for (int j = 0; j < k; ++j) {
        bench::fillFloat(bufs[j].as<float>(), count, static_cast<float>(j + 1), s);
        srcs.push_back(bufs[j].data());
      }
      void* dst = bufs[kMaxK].data();
      const double us = timeIt(s, o.warmup, o.iters, [&] {
        check(launchReduce(DataType::kFloat32, ReduceOp::kSum, srcs.data(), k, &dst, 1, count, 1.0, 1.0, s));
      });
      check(stream.synchronize(60000));
      std::vector<float> host(count);
      if (cudaMemcpy(host.data(), dst, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        die(cudaStatus(cudaGetLastError(), "cudaMemcpy"));
      const float want = static_cast<float>(k * (k + 1) / 2);
      const auto wrong = std::count_if(host.begin(), host.end(), [&](float v) { return v != want; });
      const double bw = gbps(static_cast<double>(k + 1) * bytes, us);
      std::printf("%12" PRIu64 " %13zu %9s %7s %3d %11.1f %12.1f %8.1f %8ld\n", bytes, count,
                  "float32", "sum", k, us, bw, 100.0 * bw / copy_bw, static_cast<long>(wrong));
    }
  }

  // 3: batched copy of many small tensors vs one cudaMemcpyAsync each.
  std::printf("#\n#%11s %9s %11s %13s %12s %13s %12s %8s\n", "tensor", "tensors", "launches",
              "batched(us)", "GB/s", "memcpys(us)", "GB/s", "speedup");
  for (size_t tensor : {size_t{256}, size_t{4096}, size_t{65536}}) {
    for (size_t n : {size_t{64}, size_t{1024}}) {
      if (tensor * n > o.max_bytes) continue;
      std::vector<CopySegment> segs;
      for (size_t i = 0; i < n; ++i)
        segs.push_back({bufs[0].as<char>() + i * tensor, bufs[1].as<char>() + i * tensor, tensor});
      int launches = 0;
      const double b_us = timeIt(s, o.warmup, o.iters, [&] { launches = check(batchedCopy(segs, s)); });
      const double m_us = timeIt(s, o.warmup, o.iters, [&] {
        for (const auto& g : segs) {
          if (cudaMemcpyAsync(g.dst, g.src, g.bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
            die(cudaStatus(cudaGetLastError(), "cudaMemcpyAsync"));
        }
      });
      const double total = 2.0 * tensor * n;
      std::printf("%12zu %9zu %11d %13.1f %12.1f %13.1f %12.1f %7.1fx\n", tensor, n, launches, b_us,
                  gbps(total, b_us), m_us, gbps(total, m_us), m_us / b_us);
    }
  }
  return 0;
}
