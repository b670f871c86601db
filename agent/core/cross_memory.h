// Reading and writing another process's memory (cross-memory attach,
// process_vm_readv/writev): the agent's side of the direct user-memory
// path (docs/architecture.md, "Direct user memory"). The kernel checks the
// permission on every call (PTRACE_MODE_ATTACH: the same user and a
// dumpable target, or CAP_SYS_PTRACE), so a trainer can only ever name
// addresses in its own process: the pid is the connection's SO_PEERCRED,
// never a value the trainer sends.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kolo {

// `bytes` at address `addr` of process `pid` (one contiguous range).
struct RemoteSpan {
  pid_t pid = 0;  // 0: none (the pointer beside it is local)
  uint64_t addr = 0;
};

// Copies exactly `n` bytes from `pid`'s `addr` into `dst` (or to `pid`'s
// `addr` from `src`), looping over partial transfers. Errors name the pid,
// the range and errno's text: EFAULT (not mapped, or not writable) is
// InvalidArgument, EPERM PermissionDenied, ESRCH (the process is gone)
// Unavailable.
Status readRemote(pid_t pid, uint64_t addr, void* dst, size_t n);
Status writeRemote(pid_t pid, uint64_t addr, const void* src, size_t n);

}  // namespace kolo
