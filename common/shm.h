// Anonymous shared memory (memfd) regions: created by the agent, passed by
// descriptor only, so no other process can open them by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace kolo {

class SharedRegion {
 public:
  SharedRegion() = default;
  ~SharedRegion();
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  // Creates a sealed-size memfd of `bytes` and maps it read/write.
  static StatusOr<SharedRegion> create(const std::string& name, size_t bytes);
  // Maps a received memfd; checks its size is at least `min_bytes`.
  static StatusOr<SharedRegion> attach(UniqueFd fd, size_t min_bytes);
  // Maps a received memfd read-only (a peer's arena, split reduction).
  static StatusOr<SharedRegion> attachReadOnly(UniqueFd fd);
  // A new read-only descriptor of this memfd (to pass to another process).
  // The file's mode becomes 0400 first, so that a process that is not its
  // owner (the agent's user) cannot reopen it writable through /proc.
  StatusOr<UniqueFd> readOnlyFd() const;

  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  bool valid() const { return addr_ != nullptr; }

 private:
  static StatusOr<SharedRegion> map(UniqueFd fd, size_t min_bytes, bool writable);

  UniqueFd fd_;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kolo
