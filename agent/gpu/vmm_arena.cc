#include "agent/gpu/vmm_arena.h"

#include <cuda.h>

#include <cstdint>
#include <string>

#include "agent/gpu/device.h"
#include "agent/gpu/driver_api.h"

namespace kolo::gpu {
namespace {

CUmemAllocationProp exportableProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

size_t roundUp(size_t n, size_t g) { return (n + g - 1) / g * g; }

}  // namespace

StatusOr<size_t> vmmGranularity(int device) {
  ASSIGN_OR_RETURN(const DriverApi* d, driverApi());
  CUmemAllocationProp prop = exportableProp(device);
  size_t g = 0;
  KOLO_CU_RETURN_IF_ERROR(
      d->memGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (g == 0) return internalError("cuMemGetAllocationGranularity returned 0");
  return g;
}

VmmMapping::~VmmMapping() {
  auto d = driverApi();
  if (!d.isOk()) return;
  const auto va = reinterpret_cast<CUdeviceptr>(ptr_);
  if (mapped_) (void)(*d)->memUnmap(va, bytes_);
  if (ptr_ != nullptr) (void)(*d)->memAddressFree(va, bytes_);
  if (has_handle_) (void)(*d)->memRelease(static_cast<CUmemGenericAllocationHandle>(handle_));
}

Status VmmMapping::mapHandle(unsigned long long handle, size_t bytes, size_t alignment, int device) {
  ASSIGN_OR_RETURN(const DriverApi* d, driverApi());
  handle_ = handle;
  has_handle_ = true;
  bytes_ = bytes;
  device_ = device;
  CUdeviceptr va = 0;
  KOLO_CU_RETURN_IF_ERROR(d->memAddressReserve(&va, bytes, alignment, 0, 0));
  ptr_ = reinterpret_cast<void*>(va);
  KOLO_CU_RETURN_IF_ERROR(d->memMap(va, bytes, 0, static_cast<CUmemGenericAllocationHandle>(handle), 0));
  mapped_ = true;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  KOLO_CU_RETURN_IF_ERROR(d->memSetAccess(va, bytes, &access, 1));
  return okStatus();
}

StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::create(int device, size_t min_bytes) {
  if (min_bytes == 0) return invalidArgument("device arena size must be > 0");
  RETURN_IF_ERROR(setDevice(device));
  ASSIGN_OR_RETURN(const DriverApi* d, driverApi());
  int vmm = 0, fd_ok = 0;
  KOLO_CU_RETURN_IF_ERROR(d->deviceGetAttribute(
      &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device));
  KOLO_CU_RETURN_IF_ERROR(d->deviceGetAttribute(
      &fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device));
  if (!vmm || !fd_ok) {
    return unavailable("not viable: CUDA device " + std::to_string(device) +
                       " cannot export VMM allocations as POSIX fds (vmm=" + std::to_string(vmm) +
                       ", posix_fd=" + std::to_string(fd_ok) + ")");
  }
  ASSIGN_OR_RETURN(const size_t g, vmmGranularity(device));
  const size_t bytes = roundUp(min_bytes, g);
  CUmemAllocationProp prop = exportableProp(device);
  CUmemGenericAllocationHandle h = 0;
  KOLO_CU_RETURN_IF_ERROR(d->memCreate(&h, bytes, &prop, 0));
  auto arena = std::unique_ptr<DeviceArena>(new DeviceArena());
  RETURN_IF_ERROR(arena->mapHandle(h, bytes, g, device));
  return arena;
}

StatusOr<UniqueFd> DeviceArena::exportFd() const {
  ASSIGN_OR_RETURN(const DriverApi* d, driverApi());
  int fd = -1;
  KOLO_CU_RETURN_IF_ERROR(d->memExportToShareableHandle(
      &fd, static_cast<CUmemGenericAllocationHandle>(handle_),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return UniqueFd(fd);
}

StatusOr<std::unique_ptr<ImportedDeviceArena>> ImportedDeviceArena::import(int fd, size_t bytes,
                                                                           int device) {
  if (fd < 0) return invalidArgument("device arena import: bad fd " + std::to_string(fd));
  RETURN_IF_ERROR(setDevice(device));
  ASSIGN_OR_RETURN(const size_t g, vmmGranularity(device));
  if (bytes == 0 || bytes % g != 0) {
    return invalidArgument("device arena import: size " + std::to_string(bytes) +
                           " is not a positive multiple of the granularity " + std::to_string(g));
  }
  ASSIGN_OR_RETURN(const DriverApi* d, driverApi());
  CUmemGenericAllocationHandle h = 0;
  KOLO_CU_RETURN_IF_ERROR(d->memImportFromShareableHandle(
      &h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  auto arena = std::unique_ptr<ImportedDeviceArena>(new ImportedDeviceArena());
  RETURN_IF_ERROR(arena->mapHandle(h, bytes, g, device));
  return arena;
}

}  // namespace kolo::gpu
