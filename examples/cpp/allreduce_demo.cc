// kolo-demo: what `kolorun -np 4 kolo-demo` shows a new user.
// Every rank allreduces a few tensors, checks each result against the value
// it must have, and rank 0 prints a bandwidth line for a large allreduce.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kolo/kolo_c.h"

namespace {

constexpr const char* kUsage =
    "usage: kolo-demo [MIB]   (the large allreduce's size, 1 to 65536 MiB; default 64)\n"
    "run under kolorun, e.g. kolorun -np 4 kolo-demo 64\n";

int usageError(const std::string& why) {
  std::fprintf(stderr, "kolo-demo: %s (see kolo-demo --help)\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  size_t big_mb = 64;
  if (argc > 2) return usageError("one argument at most, got " + std::to_string(argc - 1));
  if (argc == 2) {
    const std::string arg = argv[1];
    if (arg == "--version") {
      std::printf("kolo-demo %s\n", KOLO_VERSION);
      return 0;
    }
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (arg[0] == '-') return usageError("unknown flag " + arg);
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(arg.c_str(), &end, 10);
    if (arg.empty() || arg.find_first_not_of("0123456789") != std::string::npos || *end != '\0' ||
        mb < 1 || mb > 65536) {
      return usageError("MIB must be a whole number of MiB from 1 to 65536, got '" + arg + "'");
    }
    big_mb = static_cast<size_t>(mb);
  }
  if (kolo_init() != KOLO_OK) {
    std::fprintf(stderr, "kolo_init failed: %s\n", kolo_last_error());
    return 1;
  }
  const int rank = kolo_rank(), size = kolo_size();
  bool ok = true;

  // 1. A gradient-like float32 tensor, averaged: every rank ends with the mean.
  std::vector<float> grad(1000003);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(rank + 1) * (i % 7);
  int64_t shape[1] = {static_cast<int64_t>(grad.size())};
  if (kolo_allreduce("demo.grad", grad.data(), grad.data(), 1, shape, KOLO_FLOAT32, KOLO_AVERAGE, 1, 1) != KOLO_OK) {
    std::fprintf(stderr, "rank %d: allreduce failed: %s\n", rank, kolo_last_error());
    return 1;
  }
  double mean_factor = (size + 1) / 2.0;
  for (size_t i = 0; i < grad.size() && ok; ++i) {
    if (grad[i] != static_cast<float>((i % 7) * mean_factor)) ok = false;
  }

  // 2. An int64 counter summed, and a max.
  int64_t one[1] = {1};
  int64_t counter = 10 + rank;
  int64_t maxv = rank * 3;
  kolo_allreduce("demo.count", &counter, &counter, 1, one, KOLO_INT64, KOLO_SUM, 1, 1);
  kolo_allreduce("demo.max", &maxv, &maxv, 1, one, KOLO_INT64, KOLO_MAX, 1, 1);
  ok = ok && counter == 10 * size + size * (size - 1) / 2 && maxv == 3 * (size - 1);
  std::printf("rank %d/%d: result check %s (mean of 1000003 floats, sum %lld, max %lld)\n", rank, size,
              ok ? "passed" : "FAILED", static_cast<long long>(counter), static_cast<long long>(maxv));

  // 3. Bandwidth: a large buffer in the shared arena (zero copy), timed.
  size_t count = (big_mb << 20) / sizeof(float);
  auto* buf = static_cast<float*>(kolo_alloc_shared(count * sizeof(float)));
  if (buf == nullptr) {
    std::fprintf(stderr, "rank %d: %s\n", rank, kolo_last_error());
    return 1;
  }
  for (size_t i = 0; i < count; ++i) buf[i] = 1.0f;
  int64_t bshape[1] = {static_cast<int64_t>(count)};
  kolo_allreduce("demo.bw.warmup", buf, buf, 1, bshape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
  const int iters = 5;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    kolo_allreduce("demo.bw", buf, buf, 1, bshape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
  }
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  double algbw = static_cast<double>(count * sizeof(float)) / sec / 1e9;
  double busbw = algbw * 2.0 * (size - 1) / size;
  if (rank == 0) {
    std::printf("rank 0: allreduce of %zu MiB float32 across %d ranks: %.2f ms, algbw %.2f GB/s, busbw %.2f GB/s\n",
                big_mb, size, sec * 1e3, algbw, busbw);
  }
  kolo_free_shared(buf);
  kolo_shutdown();
  return ok ? 0 : 1;
}
