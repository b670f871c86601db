#include "agent/core/cross_memory.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "common/log.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace kolo {

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// The calling thread's ids become the trainer's for one copy, and back.
// Raw system calls: glibc's setresuid() would change every thread of the
// agent. Keeping saved ids as they were (root's) lets the thread return;
// while its effective uid is not 0 the kernel clears its effective
// capabilities (no CAP_SYS_PTRACE), and restores them on return.
class AsTrainer {
 public:
  AsTrainer(bool active, uid_t uid, gid_t gid) : active_(active) {
    if (!active_) return;
    ::syscall(SYS_getresuid, &ruid_, &euid_, &suid_);
    ::syscall(SYS_getresgid, &rgid_, &egid_, &sgid_);
    if (::syscall(SYS_setresgid, gid, gid, static_cast<gid_t>(-1)) != 0 ||
        ::syscall(SYS_setresuid, uid, uid, static_cast<uid_t>(-1)) != 0) {
      err_ = errno;
      restore();
    }
  }
  ~AsTrainer() { restore(); }
  int error() const { return err_; }

 private:
  void restore() {
    if (!active_) return;
    active_ = false;
    if (::syscall(SYS_setresuid, ruid_, euid_, static_cast<uid_t>(-1)) != 0 ||
        ::syscall(SYS_setresgid, rgid_, egid_, static_cast<gid_t>(-1)) != 0) {
      // A thread left with a trainer's ids would be a hole: never go on.
      std::fprintf(stderr, "kolo-agent: cannot restore the agent's ids after a direct copy: %s\n",
                   std::strerror(errno));
      std::abort();
    }
  }
  bool active_;
  int err_ = 0;
  uid_t ruid_ = 0, euid_ = 0, suid_ = 0;
  gid_t rgid_ = 0, egid_ = 0, sgid_ = 0;
};

// The four ids of a "Uid:" or "Gid:" line of /proc/PID/status all `want`.
bool allIds(const std::string& status, const char* key, unsigned want, std::string* seen) {
  auto at = status.find(key);
  if (at == std::string::npos) return false;
  std::istringstream in(status.substr(at + std::strlen(key)));
  unsigned v[4] = {};
  for (unsigned& x : v) {
    if (!(in >> x)) return false;
  }
  *seen = std::to_string(v[0]) + "/" + std::to_string(v[1]) + "/" + std::to_string(v[2]) + "/" +
          std::to_string(v[3]);
  return v[0] == want && v[1] == want && v[2] == want && v[3] == want;
}

Status readAll(int dir, const char* name, std::string* out) {
  UniqueFd f(::openat(dir, name, O_RDONLY | O_CLOEXEC));
  if (!f.valid()) return errnoStatus(std::string("open ") + name, errno);
  char buf[4096];
  ssize_t got;
  while ((got = ::read(f.get(), buf, sizeof buf)) > 0) out->append(buf, static_cast<size_t>(got));
  if (got < 0) return errnoStatus(std::string("read ") + name, errno);
  return okStatus();
}

}  // namespace

int peerPidfd(int sock, pid_t pid) {
  int fd = -1;
  socklen_t len = sizeof fd;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) {
    (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
  }
  if (pid <= 0) return -1;
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

void dropPtraceCapability() {
  if (::geteuid() == 0) return;  // root switches to each trainer's ids for its copies instead
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (::syscall(SYS_capget, &h, d) != 0) return;
  const unsigned bit = CAP_SYS_PTRACE;
  if ((d[bit / 32].effective & (1u << (bit % 32))) == 0) return;
  d[bit / 32].effective &= ~(1u << (bit % 32));
  if (::syscall(SYS_capset, &h, d) == 0) {
    log::get("ipc")->warn(
        "dropped CAP_SYS_PTRACE: the direct user-memory path copies with each trainer's own "
        "credentials, "
        "never with a capability (docs/security.md)");
  }
}

StatusOr<std::shared_ptr<TrainerProcess>> TrainerProcess::bind(pid_t pid, uid_t uid, gid_t gid,
                                                               uint64_t anchor, int pidfd) {
  const std::string who = "pid " + std::to_string(pid);
  if (pid <= 0) return unavailable("the trainer's pid is not visible in the agent's pid namespace");
  std::shared_ptr<TrainerProcess> p(new TrainerProcess(pid, uid, gid, anchor));
  p->pidfd_.reset(pidfd >= 0 ? pidfd : static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!p->pidfd_.valid()) return unavailable("no pidfd for " + who + ": " + std::strerror(errno));
  const uid_t me = ::geteuid();
  if (me != uid || ::getegid() != gid) {
    if (me != 0) {
      return permissionDenied(
          "the agent runs as uid " + std::to_string(me) +
          " and cannot act with the credentials of " + who + " (uid " + std::to_string(uid) +
          "): the direct path needs an agent running as the trainer's user or as root");
    }
    p->switch_creds_ = true;
  }
  p->proc_dir_.reset(
      ::open(("/proc/" + std::to_string(pid)).c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!p->proc_dir_.valid())
    return unavailable("cannot open /proc/" + std::to_string(pid) + ": " + std::strerror(errno));
  std::string status;
  if (Status st = readAll(p->proc_dir_.get(), "status", &status); !st.isOk()) {
    return unavailable(who + ": " + st.message());
  }
  std::string seen;
  if (!allIds(status, "\nUid:", uid, &seen)) {
    return permissionDenied(who + " runs with uids " + seen +
                            " (real/effective/saved/fs), not the connection's " +
                            std::to_string(uid) + " on every one");
  }
  if (!allIds(status, "\nGid:", gid, &seen)) {
    return permissionDenied(who + " runs with gids " + seen +
                            " (real/effective/saved/fs), not the connection's " +
                            std::to_string(gid) + " on every one");
  }
  {
    AsTrainer as(p->switch_creds_, uid, gid);
    if (as.error() != 0)
      return permissionDenied("cannot take uid " + std::to_string(uid) + ": " +
                              std::strerror(as.error()));
    p->mem_.reset(::openat(p->proc_dir_.get(), "mem", O_RDONLY | O_CLOEXEC));
  }
  if (!p->mem_.valid()) {
    int e = errno;
    return e == EACCES || e == EPERM
               ? permissionDenied(
                     "the trainer's own user may not read " + who +
                     "'s memory (not dumpable, or a ptrace policy forbids it): " + std::strerror(e))
               : unavailable("cannot open /proc/" + std::to_string(pid) +
                             "/mem: " + std::strerror(e));
  }
  // Alive after /proc/PID was opened: that directory is this process's.
  if (Status st = p->check(); !st.isOk()) return st;
  return p;
}

Status TrainerProcess::check() const {
  pollfd pf{pidfd_.get(), POLLIN, 0};
  if (::poll(&pf, 1, 0) != 0) {
    return unavailable("pid " + std::to_string(pid_) +
                       " has exited: the direct user-memory path ended with it");
  }
  char b;
  ssize_t got = ::pread(mem_.get(), &b, 1, static_cast<off_t>(anchor_));
  if (got != 1) {
    return unavailable(
        "pid " + std::to_string(pid_) +
        " no longer has the address space it connected with (it exec'd a program or is exiting): "
        "the direct user-memory path ended with it");
  }
  return okStatus();
}

Status TrainerProcess::transfer(bool write, uint64_t addr, char* local, size_t n) const {
  const char* what = write ? "write" : "read";
  if (addr + n < addr) {
    return invalidArgument("the range [" + hex(addr) + ", +" + std::to_string(n) + ") of pid " +
                           std::to_string(pid_) + " wraps around the address space");
  }
  if (Status st = check(); !st.isOk()) return st;
  AsTrainer as(switch_creds_, uid_, gid_);
  if (as.error() != 0)
    return permissionDenied("cannot take uid " + std::to_string(uid_) + ": " +
                            std::strerror(as.error()));
  size_t done = 0;
  while (done < n) {
    iovec l{local + done, n - done};
    iovec r{reinterpret_cast<void*>(addr + done), n - done};
    ssize_t got = write ? ::process_vm_writev(pid_, &l, 1, &r, 1, 0)
                        : ::process_vm_readv(pid_, &l, 1, &r, 1, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    int e = got == 0 ? EFAULT : errno;
    if (e == EINTR) continue;
    std::string msg = std::string("cannot ") + what + " " + std::to_string(n - done) +
                      " bytes at " + hex(addr + done) + " of pid " + std::to_string(pid_) + ": " +
                      std::strerror(e);
    if (e == EPERM)
      return permissionDenied(msg + " (the trainer's own credentials do not allow it)");
    if (e == ESRCH) return unavailable(msg + " (the process is gone)");
    if (e == EFAULT) {
      return invalidArgument(msg + " (not mapped or not " + (write ? "writable" : "readable") + " in that process)");
    }
    return internalError(msg);
  }
  return okStatus();
}

Status TrainerProcess::read(uint64_t addr, void* dst, size_t n) const {
  return transfer(false, addr, static_cast<char*>(dst), n);
}

Status TrainerProcess::write(uint64_t addr, const void* src, size_t n) const {
  return transfer(true, addr, const_cast<char*>(static_cast<const char*>(src)), n);
}

}  // namespace kolo
