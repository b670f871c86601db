#include <cuda_runtime.h>

#include "tests/gpu/device_rank_kernels.h"

namespace kolo::gpu::testing {
namespace {
// Spins ~`cycles` SM cycles, then writes v + i into p[i]: a trainer kernel
// whose output is ready only long after it was enqueued.
__global__ void spinThenFill(float* p, size_t n, float v, unsigned long long cycles) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned long long start = clock64();
    while (clock64() - start < cycles) {
    }
  }
  __syncthreads();
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = v + static_cast<float>(i % 1024);
}
}  // namespace

void launchSpinThenFill(cudaStream_t stream, float* p, size_t n, float v, unsigned long long cycles) {
  spinThenFill<<<1, 256, 0, stream>>>(p, n, v, cycles);
}

}  // namespace kolo::gpu::testing
