// Shared by the GPU tests: skip without a device, checked CUDA calls.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "agent/gpu/cuda_status.h"

// Skips the test (cleanly, with the reason) when there is no usable GPU.
#define KOLO_REQUIRE_GPU()                                                       \
  do {                                                                           \
    auto _kolo_n = ::kolo::gpu::deviceCount();                                   \
    if (!_kolo_n.isOk()) GTEST_SKIP() << "skipped: " << _kolo_n.status().message(); \
  } while (0)

#define KOLO_ASSERT_CUDA(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

#define KOLO_ASSERT_OK(expr)                       \
  do {                                             \
    const ::kolo::Status _kolo_s = (expr);         \
    ASSERT_TRUE(_kolo_s.isOk()) << _kolo_s.toString(); \
  } while (0)

namespace kolo::gpu::testing {
// Spins the GPU for about `ns` nanoseconds on `stream` (busy_kernel.cu): a
// stand-in for a trainer's long-running kernel when testing ordering.
void launchBusy(cudaStream_t stream, unsigned long long ns);
}  // namespace kolo::gpu::testing
