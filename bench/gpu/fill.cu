#include <cuda_runtime.h>

#include <cstddef>

namespace kolo::gpu::bench {
namespace {
__global__ void fillKernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}
}  // namespace

void fillFloat(float* p, size_t n, float v, cudaStream_t s) { fillKernel<<<1024, 256, 0, s>>>(p, n, v); }

}  // namespace kolo::gpu::bench
