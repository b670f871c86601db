#include "agent/core/cross_memory.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace kolo {

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

Status transfer(bool write, pid_t pid, uint64_t addr, char* local, size_t n) {
  const char* what = write ? "write" : "read";
  if (pid <= 0) return internalError(std::string("cross-memory ") + what + " without a process");
  if (addr + n < addr) {
    return invalidArgument("the range [" + hex(addr) + ", +" + std::to_string(n) + ") of pid " +
                           std::to_string(pid) + " wraps around the address space");
  }
  size_t done = 0;
  while (done < n) {
    iovec l{local + done, n - done};
    iovec r{reinterpret_cast<void*>(addr + done), n - done};
    ssize_t got = write ? ::process_vm_writev(pid, &l, 1, &r, 1, 0) : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    int e = got == 0 ? EFAULT : errno;
    if (e == EINTR) continue;
    std::string msg = std::string("cannot ") + what + " " + std::to_string(n - done) + " bytes at " +
                      hex(addr + done) + " of pid " + std::to_string(pid) + ": " + std::strerror(e);
    if (e == EPERM) return permissionDenied(msg);
    if (e == ESRCH) return unavailable(msg + " (the process is gone)");
    if (e == EFAULT) {
      return invalidArgument(msg + " (not mapped or not " + (write ? "writable" : "readable") + " in that process)");
    }
    return internalError(msg);
  }
  return okStatus();
}

}  // namespace

Status readRemote(pid_t pid, uint64_t addr, void* dst, size_t n) {
  return transfer(false, pid, addr, static_cast<char*>(dst), n);
}

Status writeRemote(pid_t pid, uint64_t addr, const void* src, size_t n) {
  return transfer(true, pid, addr, const_cast<char*>(static_cast<const char*>(src)), n);
}

}  // namespace kolo
