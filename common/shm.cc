#include "common/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace kolo {

SharedRegion::~SharedRegion() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
}

SharedRegion::SharedRegion(SharedRegion&& o) noexcept
    : fd_(std::move(o.fd_)), addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  if (this != &o) {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    fd_ = std::move(o.fd_);
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

StatusOr<SharedRegion> SharedRegion::create(const std::string& name, size_t bytes) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errnoStatus("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return errnoStatus("ftruncate memfd to " + std::to_string(bytes) + " bytes", errno);
  }
  // The size can no longer change: a client cannot shrink it under the agent.
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errnoStatus("mmap arena", errno);
  SharedRegion r;
  r.fd_ = std::move(fd);
  r.addr_ = p;
  r.size_ = bytes;
  return r;
}

StatusOr<SharedRegion> SharedRegion::map(UniqueFd fd, size_t min_bytes, bool writable) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return errnoStatus("fstat arena", errno);
  if (static_cast<size_t>(st.st_size) < min_bytes) {
    return invalidArgument("arena is " + std::to_string(st.st_size) + " bytes, expected at least " +
                           std::to_string(min_bytes));
  }
  size_t bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
                   fd.get(), 0);
  if (p == MAP_FAILED) return errnoStatus("mmap arena", errno);
  SharedRegion r;
  r.fd_ = std::move(fd);
  r.addr_ = p;
  r.size_ = bytes;
  return r;
}

StatusOr<SharedRegion> SharedRegion::attach(UniqueFd fd, size_t min_bytes) {
  return map(std::move(fd), min_bytes, true);
}

StatusOr<SharedRegion> SharedRegion::attachReadOnly(UniqueFd fd) {
  return map(std::move(fd), 1, false);
}

StatusOr<UniqueFd> SharedRegion::readOnlyFd() const {
  if (!fd_.valid()) return invalidArgument("the region has no descriptor");
  if (::fchmod(fd_.get(), 0400) != 0) return errnoStatus("fchmod memfd 0400", errno);
  const std::string path = "/proc/self/fd/" + std::to_string(fd_.get());
  UniqueFd ro(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ro.valid()) return errnoStatus("open " + path + " read-only", errno);
  return ro;
}

}  // namespace kolo
