#include "agent/gpu/driver_api.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "agent/gpu/cuda_status.h"

namespace kolo::gpu {
namespace {

// Driver ABI version the entry points are requested at (the VMM calls have
// not changed since CUDA 10.2; 12.0 is the oldest driver CUDA 13 supports).
constexpr unsigned int kDriverApiVersion = 12000;

template <typename Fn>
Status resolve(const char* symbol, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverApiVersion, cudaEnableDefault, &q);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return unavailable("no CUDA driver: " +
                       cudaStatus(err, std::string("cudaGetDriverEntryPointByVersion(") + symbol +
                                           ")").message());
  }
  if (q != cudaDriverEntryPointSuccess || fn == nullptr)
    return unavailable(std::string("CUDA driver has no entry point ") + symbol);
  *out = reinterpret_cast<Fn>(fn);
  return okStatus();
}

Status load(DriverApi* d) {
  RETURN_IF_ERROR(resolve("cuGetErrorString", &d->getErrorString));
  RETURN_IF_ERROR(resolve("cuDeviceGetAttribute", &d->deviceGetAttribute));
  RETURN_IF_ERROR(resolve("cuMemGetAllocationGranularity", &d->memGetAllocationGranularity));
  RETURN_IF_ERROR(resolve("cuMemCreate", &d->memCreate));
  RETURN_IF_ERROR(resolve("cuMemRelease", &d->memRelease));
  RETURN_IF_ERROR(resolve("cuMemAddressReserve", &d->memAddressReserve));
  RETURN_IF_ERROR(resolve("cuMemAddressFree", &d->memAddressFree));
  RETURN_IF_ERROR(resolve("cuMemMap", &d->memMap));
  RETURN_IF_ERROR(resolve("cuMemUnmap", &d->memUnmap));
  RETURN_IF_ERROR(resolve("cuMemSetAccess", &d->memSetAccess));
  RETURN_IF_ERROR(resolve("cuMemExportToShareableHandle", &d->memExportToShareableHandle));
  RETURN_IF_ERROR(resolve("cuMemImportFromShareableHandle", &d->memImportFromShareableHandle));
  return okStatus();
}

}  // namespace

StatusOr<const DriverApi*> driverApi() {
  static std::once_flag once;
  static DriverApi api;
  static Status loaded;
  std::call_once(once, [] { loaded = load(&api); });
  if (!loaded.isOk()) return loaded;
  return &api;
}

Status driverStatus(CUresult res, const char* api) {
  if (res == CUDA_SUCCESS) return okStatus();
  Status s = cuStatus(res, api);
  auto d = driverApi();
  const char* text = nullptr;
  if (d.isOk() && (*d)->getErrorString(res, &text) == CUDA_SUCCESS && text != nullptr)
    return Status(s.code(), std::string(api) + ": CUresult " + std::to_string(static_cast<int>(res)) +
                                ": " + text);
  return s;
}

}  // namespace kolo::gpu
