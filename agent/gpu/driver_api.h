// The few CUDA driver entry points the device path uses (VMM), resolved at
// run time through cudaGetDriverEntryPointByVersion. Nothing links libcuda
// directly, so every kolo binary (tests included) loads and runs on machines
// without a driver; there the loader answers Unavailable.
#pragma once

#include <cuda.h>

#include "common/status.h"

namespace kolo::gpu {

struct DriverApi {
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) memCreate = nullptr;
  decltype(&::cuMemRelease) memRelease = nullptr;
  decltype(&::cuMemAddressReserve) memAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) memAddressFree = nullptr;
  decltype(&::cuMemMap) memMap = nullptr;
  decltype(&::cuMemUnmap) memUnmap = nullptr;
  decltype(&::cuMemSetAccess) memSetAccess = nullptr;
  decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle = nullptr;
};

// Resolved once (thread-safe); Unavailable when there is no driver.
StatusOr<const DriverApi*> driverApi();

// A driver result as Status, with the driver's own error text when available.
Status driverStatus(CUresult res, const char* api);

}  // namespace kolo::gpu

#define KOLO_CU_RETURN_IF_ERROR(call)                                                  \
  do {                                                                                 \
    const CUresult _kolo_cu_res = (call);                                              \
    if (_kolo_cu_res != CUDA_SUCCESS) return ::kolo::gpu::driverStatus(_kolo_cu_res, #call); \
  } while (0)
