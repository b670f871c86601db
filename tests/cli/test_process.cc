#include "test_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <stdexcept>

extern char** environ;

namespace kolo::clitest {

namespace {

using Clock = std::chrono::steady_clock;

int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

std::chrono::milliseconds leftUntil(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0ms : left;
}

void drainFd(int& fd, std::string& buf) {
  if (fd < 0) return;
  char tmp[65536];
  for (;;) {
    ssize_t n = ::read(fd, tmp, sizeof tmp);
    if (n > 0) {
      buf.append(tmp, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    ::close(fd);
    fd = -1;
    return;
  }
}

}  // namespace

TestProcess::TestProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                         const std::vector<std::string>& unset) {
  std::vector<std::string> env;
  std::set<std::string> drop(unset.begin(), unset.end());
  for (auto& [k, v] : set) drop.insert(k);
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    if (drop.count(kv.substr(0, kv.find('='))) == 0) env.push_back(kv);
  }
  for (auto& [k, v] : set) env.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  for (auto& s : env) cenv.push_back(s.data());
  cenv.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork");
  if (pid_ == 0) {
    ::setpgid(0, 0);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  ::fcntl(err_fd_, F_SETFL, O_NONBLOCK);
  pidfd_ = pidfdOpen(pid_);
}

TestProcess::~TestProcess() {
  if (!exited_ && pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
  for (int fd : {out_fd_, err_fd_, pidfd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void TestProcess::pumpOnce(std::chrono::milliseconds timeout) {
  pollfd fds[3] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}, {exited_ ? -1 : pidfd_, POLLIN, 0}};
  ::poll(fds, 3, static_cast<int>(timeout.count()));
  drainFd(out_fd_, out_);
  drainFd(err_fd_, err_);
  if (!exited_ && (fds[2].revents != 0 || pidfd_ < 0)) {
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
  }
}

bool TestProcess::waitForText(const std::string& text, const std::string* buf, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (buf->find(text) == std::string::npos) {
    if (Clock::now() >= deadline || (exited_ && out_fd_ < 0 && err_fd_ < 0)) return false;
    pumpOnce(std::min(leftUntil(deadline), 1000ms));
  }
  return true;
}

bool TestProcess::waitForStdout(const std::string& text, std::chrono::milliseconds timeout) {
  return waitForText(text, &out_, timeout);
}

bool TestProcess::waitForStderr(const std::string& text, std::chrono::milliseconds timeout) {
  return waitForText(text, &err_, timeout);
}

std::optional<int> TestProcess::wait(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!exited_ || out_fd_ >= 0 || err_fd_ >= 0) {
    if (Clock::now() >= deadline) break;
    pumpOnce(std::min(leftUntil(deadline), 1000ms));
  }
  if (!exited_) return std::nullopt;
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  return 128 + WTERMSIG(status_);
}

void TestProcess::signal(int sig) {
  if (!exited_) ::kill(pid_, sig);
}

RunResult runCommand(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                     std::chrono::milliseconds timeout, const std::vector<std::string>& unset) {
  TestProcess p(argv, set, unset);
  RunResult r;
  r.code = p.wait(timeout);
  r.out = p.out();
  r.err = p.err();
  return r;
}

TempDir::TempDir() {
  std::string templ = std::filesystem::temp_directory_path().string() + "/kolo-cli-test-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp");
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> TempDir::list() const {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(path_, ec)) names.push_back(e.path().filename().string());
  return names;
}

bool waitForFile(const std::string& path, std::chrono::milliseconds timeout) {
  auto exists = [&] {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && st.st_size > 0;
  };
  auto deadline = Clock::now() + timeout;
  int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (in >= 0) ::inotify_add_watch(in, dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE);
  bool ok = exists();
  while (!ok && Clock::now() < deadline) {
    pollfd p{in, POLLIN, 0};
    // inotify wakes us at once; the cap is a safety net if it is unavailable.
    ::poll(&p, in >= 0 ? 1 : 0, static_cast<int>(std::min(leftUntil(deadline), 200ms).count()));
    char buf[4096];
    while (in >= 0 && ::read(in, buf, sizeof buf) > 0) {
    }
    ok = exists();
  }
  if (in >= 0) ::close(in);
  return ok;
}

bool waitProcessGone(pid_t pid, std::chrono::milliseconds timeout) {
  int fd = pidfdOpen(pid);
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  ::close(fd);
  return n == 1;
}

std::string binDir() { return KOLO_TEST_BIN_DIR; }
std::string standinDaemon() { return KOLO_TEST_STANDIN; }

}  // namespace kolo::clitest
