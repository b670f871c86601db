#include "tests/coordinator/coordinator_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kolo::coordinator::testing {

namespace {

using Ms = std::chrono::milliseconds;

int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// fork + exec with stdout/stderr to `log_path`; the child dies with us.
pid_t spawn(const std::string& binary, const std::vector<std::string>& args,
            const std::string& log_path) {
  std::vector<std::string> argv_s{binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  ::execv(binary.c_str(), argv.data());
  ::_exit(127);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits until `fd` is readable or `deadline` passes.
bool pollReadable(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now()).count();
    if (left < 0) return false;
    struct pollfd p {
      fd, POLLIN, 0
    };
    int n = ::poll(&p, 1, static_cast<int>(left));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

}  // namespace

CoordinatorProcess::CoordinatorProcess() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kolo-coord-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
}

CoordinatorProcess::~CoordinatorProcess() {
  kill();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

bool CoordinatorProcess::start(const std::string& binary, const std::vector<std::string>& args,
                               Ms timeout, std::string* error) {
  if (dir_.empty()) {
    *error = "cannot create a temp dir";
    return false;
  }
  std::string ready = dir_ + "/ready";
  // Watch the dir before the child starts, so the rename cannot be missed.
  int ino = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (ino < 0 || ::inotify_add_watch(ino, dir_.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
    *error = std::string("inotify: ") + std::strerror(errno);
    if (ino >= 0) ::close(ino);
    return false;
  }
  std::vector<std::string> full{"--listen", "127.0.0.1:0", "--ready-file", ready};
  full.insert(full.end(), args.begin(), args.end());
  pid_ = spawn(binary, full, dir_ + "/coordinator.log");
  if (pid_ < 0) {
    ::close(ino);
    *error = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  pidfd_ = pidfdOpen(pid_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ok = false;
  for (;;) {
    if (std::filesystem::exists(ready)) {
      std::string text = readFile(ready);
      if (!text.empty() && text.back() == '\n') {
        address_ = text.substr(0, text.size() - 1);
        ok = true;
        break;
      }
    }
    auto left = std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now()).count();
    if (left < 0) {
      *error = "kolo-coordinator did not write its ready file within " +
               std::to_string(timeout.count()) + " ms";
      break;
    }
    struct pollfd p[2] = {{ino, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    int n = ::poll(p, pidfd_ >= 0 ? 2 : 1, static_cast<int>(left));
    if (n > 0 && (p[1].revents & POLLIN) != 0 && !std::filesystem::exists(ready)) {
      *error = "kolo-coordinator exited before it was ready";
      break;
    }
    char buf[4096];
    while (::read(ino, buf, sizeof buf) > 0) {
    }
  }
  ::close(ino);
  if (!ok) *error += "; its log:\n" + log();
  return ok;
}

std::string CoordinatorProcess::log() const { return readFile(dir_ + "/coordinator.log"); }

void CoordinatorProcess::signal(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

std::optional<int> CoordinatorProcess::waitExit(Ms timeout) {
  if (pid_ <= 0 || reaped_) return std::nullopt;
  if (pidfd_ >= 0 && !pollReadable(pidfd_, std::chrono::steady_clock::now() + timeout)) {
    return std::nullopt;
  }
  int status = 0;
  if (::waitpid(pid_, &status, pidfd_ >= 0 ? 0 : WNOHANG) != pid_) return std::nullopt;
  reaped_ = true;
  return status;
}

void CoordinatorProcess::kill() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
  }
  if (pidfd_ >= 0) {
    ::close(pidfd_);
    pidfd_ = -1;
  }
}

RunResult runToCompletion(const std::string& binary, const std::vector<std::string>& args,
                          Ms timeout) {
  RunResult r;
  CoordinatorProcess scratch;  // only for its temp dir
  std::string log_path = scratch.dir() + "/run.log";
  pid_t pid = spawn(binary, args, log_path);
  if (pid < 0) return r;
  int pidfd = pidfdOpen(pid);
  bool exited = pidfd >= 0 && pollReadable(pidfd, std::chrono::steady_clock::now() + timeout);
  if (!exited) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (pidfd >= 0) ::close(pidfd);
  if (exited && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.output = readFile(log_path);
  return r;
}

}  // namespace kolo::coordinator::testing
