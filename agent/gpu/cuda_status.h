// CUDA errors as kolo::Status: "<api>: <cudaGetErrorName>: <cudaGetErrorString>".
// No device needed (tested on machines without a GPU).
//   - no device / no driver -> Unavailable (the GPU path is not viable here)
//   - out of memory          -> Unavailable
//   - invalid value/handle   -> InvalidArgument
//   - anything else          -> Internal
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "common/status.h"

namespace kolo::gpu {

Status cudaStatus(cudaError_t err, std::string_view api);
// Driver API results (reached through cudaGetDriverEntryPointByVersion).
Status cuStatus(CUresult res, std::string_view api);

// Number of usable devices; Unavailable "no CUDA device: ..." when there is
// none or no driver (what the GPU tests skip on).
StatusOr<int> deviceCount();

}  // namespace kolo::gpu

#define KOLO_CUDA_RETURN_IF_ERROR(call)                                                  \
  do {                                                                                   \
    const cudaError_t _kolo_cuda_err = (call);                                           \
    if (_kolo_cuda_err != cudaSuccess) return ::kolo::gpu::cudaStatus(_kolo_cuda_err, #call); \
  } while (0)
