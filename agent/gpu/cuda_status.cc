#include "agent/gpu/cuda_status.h"

#include <string>

namespace kolo::gpu {
namespace {

Code codeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorMemoryAllocation:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Code::kUnavailable;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidConfiguration:
      return Code::kInvalidArgument;
    default:
      return Code::kInternal;
  }
}

}  // namespace

Status cudaStatus(cudaError_t err, std::string_view api) {
  if (err == cudaSuccess) return okStatus();
  return Status(codeFor(err), std::string(api) + ": " + cudaGetErrorName(err) + ": " +
                                  cudaGetErrorString(err));
}

Status cuStatus(CUresult res, std::string_view api) {
  if (res == CUDA_SUCCESS) return okStatus();
  // The driver's own strings would need a driver entry point; the runtime
  // shares the numbering for the errors that matter here.
  Code code = Code::kInternal;
  switch (res) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_NOT_SUPPORTED:
      code = Code::kUnavailable;
      break;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
      code = Code::kInvalidArgument;
      break;
    default:
      break;
  }
  const auto as_rt = static_cast<cudaError_t>(static_cast<int>(res));
  return Status(code, std::string(api) + ": CUresult " + std::to_string(static_cast<int>(res)) +
                          " (" + cudaGetErrorName(as_rt) + ": " + cudaGetErrorString(as_rt) + ")");
}

StatusOr<int> deviceCount() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return unavailable("no CUDA device: " + cudaStatus(err, "cudaGetDeviceCount").message());
  }
  if (n <= 0) return unavailable("no CUDA device: cudaGetDeviceCount returned 0");
  return n;
}

}  // namespace kolo::gpu
