// Reading and writing a trainer's memory (cross-memory attach,
// process_vm_readv/writev): the agent's side of the direct user-memory
// path (docs/architecture.md, "Direct user memory"; docs/security.md,
// "The direct path: the agent in the trainer's memory").
//
// The agent touches only the process that connected, and with no more
// privilege than that process's own credentials give:
// - a TrainerProcess is bound at admission to the connection's peer (its
//   pidfd, taken with SO_PEERPIDFD at accept, so a pid is never guessed),
//   its credentials (the same uid and gid as the connection's, real,
//   effective, saved and filesystem) and its address space (/proc/PID/mem
//   held open: that address space and no later one);
// - before every copy it checks that the process is alive (the pidfd) and
//   still has that address space (an exec replaces it: a read through the
//   held file then returns nothing); a process that exited or exec'd loses
//   the path for good, and its pid is never used again;
// - every copy runs with the trainer's uid and gid on the copying thread
//   (raw setresuid/setresgid: this thread only; an agent running as root
//   drops its capabilities for the copy), so the kernel's ptrace check
//   (same user on every id, a dumpable target) is the one the trainer
//   itself would pass: a setuid program it exec'd, or a process it made
//   non-dumpable, is refused by the kernel even inside that window.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace kolo {

class TrainerProcess {
 public:
  // Binds the process `pid` (the connection's peer; `pidfd` its pidfd from
  // SO_PEERPIDFD, or -1 to open one now) whose credentials the connection
  // gave as `uid`/`gid`. `anchor` is an address mapped in it for as long as
  // it runs (libkolo's probe): the address-space check reads one byte there.
  // Refused (PermissionDenied, Unavailable, InvalidArgument) with the
  // reason when the process is gone, runs with other credentials, cannot
  // be opened by the trainer's own user, or when this agent cannot act
  // with those credentials (it runs as another user and is not root).
  static StatusOr<std::shared_ptr<TrainerProcess>> bind(pid_t pid, uid_t uid, gid_t gid,
                                                        uint64_t anchor, int pidfd = -1);

  pid_t pid() const { return pid_; }

  // OK while it is the same process with the same address space (both
  // ends are for good: an exited or exec'd process never passes again).
  Status check() const;

  // Copies exactly `n` bytes from its `addr` into `dst` (or to its `addr`
  // from `src`), looping over partial transfers, after check(). Errors
  // name the pid, the range and errno's text: EFAULT (not mapped, or not
  // writable) is InvalidArgument, EPERM PermissionDenied, a process gone or
  // exec'd Unavailable.
  Status read(uint64_t addr, void* dst, size_t n) const;
  Status write(uint64_t addr, const void* src, size_t n) const;

 private:
  TrainerProcess(pid_t pid, uid_t uid, gid_t gid, uint64_t anchor)
      : pid_(pid), uid_(uid), gid_(gid), anchor_(anchor) {}
  Status transfer(bool write, uint64_t addr, char* local, size_t n) const;

  pid_t pid_;
  uid_t uid_;
  gid_t gid_;
  uint64_t anchor_;
  bool switch_creds_ = false;  // this agent's ids differ from the trainer's: copy as the trainer
  UniqueFd pidfd_;
  UniqueFd proc_dir_;  // /proc/PID of that process
  UniqueFd mem_;       // /proc/PID/mem: its address space at bind
};

// `bytes` at address `addr` of a trainer process (one contiguous range).
struct RemoteSpan {
  std::shared_ptr<const TrainerProcess> proc;  // null: none (the pointer beside it is local)
  uint64_t addr = 0;
};

// The connection's pidfd (SO_PEERPIDFD, Linux 6.5), or pidfd_open of its
// pid on older kernels; -1 when neither works.
int peerPidfd(int sock, pid_t pid);

// An agent that is not root may still hold CAP_SYS_PTRACE (an ambient
// capability): it is dropped from the effective set at start, so that the
// kernel's check on every copy is the trainer's own.
void dropPtraceCapability();

}  // namespace kolo
