// Device staging arenas shared between the agent and a trainer process.
//
// The agent allocates physical device memory with the CUDA VMM API
// (cuMemCreate, requesting CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), maps it
// into its own address space, and exports it as a file descriptor
// (cuMemExportToShareableHandle). The fd travels over the agent's Unix
// socket with SCM_RIGHTS, exactly like the host memfd arena; the trainer
// imports it (cuMemImportFromShareableHandle), reserves an address range,
// maps and enables access. Physical memory is freed when the last mapping
// and the last fd are gone, so a trainer that dies with the arena mapped
// leaves nothing behind once the agent drops its side. See docs/gpu.md.
#pragma once

#include <cstddef>
#include <memory>

#include "common/fd.h"
#include "common/status.h"

namespace kolo::gpu {

// The mapping both sides share: reserve + map + set access, undone in order.
class VmmMapping {
 public:
  ~VmmMapping();
  VmmMapping(const VmmMapping&) = delete;
  VmmMapping& operator=(const VmmMapping&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }

 protected:
  VmmMapping() = default;
  // Maps `handle` (a CUmemGenericAllocationHandle) of `bytes` (a multiple of
  // the granularity) read-write for `device`, and takes ownership of it.
  Status mapHandle(unsigned long long handle, size_t bytes, size_t alignment, int device);

  unsigned long long handle_ = 0;
  bool has_handle_ = false;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  bool mapped_ = false;
};

// The agent's side: owns the physical allocation.
class DeviceArena : public VmmMapping {
 public:
  // At least `min_bytes` (rounded up to the allocation granularity, size()
  // says how much) on `device`. Unavailable "not viable: ..." when the
  // device or driver cannot export POSIX fds.
  static StatusOr<std::unique_ptr<DeviceArena>> create(int device, size_t min_bytes);

  // A new fd for the allocation (the caller owns it; each call makes one).
  StatusOr<UniqueFd> exportFd() const;

 private:
  DeviceArena() = default;
};

// The trainer's side: maps an arena received as an fd.
class ImportedDeviceArena : public VmmMapping {
 public:
  // `bytes` is the exporter's size(); `fd` may be closed afterwards.
  static StatusOr<std::unique_ptr<ImportedDeviceArena>> import(int fd, size_t bytes, int device);

 private:
  ImportedDeviceArena() = default;
};

// Allocation granularity for exportable device memory on `device`.
StatusOr<size_t> vmmGranularity(int device);

}  // namespace kolo::gpu
