#include <cuda_runtime.h>

#include "tests/gpu/gpu_test_util.h"

namespace kolo::gpu::testing {
namespace {
__global__ void busyKernel(unsigned long long ns) {
  const unsigned long long start = clock64();
  // clock64 counts SM cycles; ~1 GHz or more, so cycles >= ns is long enough.
  while (clock64() - start < ns) {
  }
}
}  // namespace

void launchBusy(cudaStream_t stream, unsigned long long ns) { busyKernel<<<1, 1, 0, stream>>>(ns); }

}  // namespace kolo::gpu::testing
