// A trainer's busy kernel for the device path tests (device_rank.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kolo::gpu::testing {
// On `stream`: spin ~`cycles` SM cycles, then p[i] = v + (i % 1024).
void launchSpinThenFill(cudaStream_t stream, float* p, size_t n, float v, unsigned long long cycles);
}  // namespace kolo::gpu::testing
