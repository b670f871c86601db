#include "cli/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "common/log.h"

extern char** environ;

namespace kolo::cli {

namespace {

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

// What the child needs, prepared before fork() so that the child only makes
// async-signal-safe calls.
struct ExecImage {
  std::string path;
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
};

ExecImage makeImage(const SpawnSpec& spec) {
  ExecImage im;
  // Not found: execve fails with ENOENT and the child reports it.
  im.path = findExecutable(spec.argv.at(0)).value_or(spec.argv.at(0));
  im.argv_storage = spec.argv;
  std::map<std::string, std::string> overrides(spec.env.begin(), spec.env.end());
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    std::string key(kv.substr(0, kv.find('=')));
    if (overrides.count(key) == 0) im.env_storage.emplace_back(kv);
  }
  for (auto& [k, v] : spec.env) im.env_storage.push_back(k + "=" + v);
  for (auto& s : im.argv_storage) im.argv.push_back(s.data());
  im.argv.push_back(nullptr);
  for (auto& s : im.env_storage) im.envp.push_back(s.data());
  im.envp.push_back(nullptr);
  return im;
}

StatusOr<std::pair<UniqueFd, UniqueFd>> makePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errnoStatus("pipe", errno);
  UniqueFd r(fds[0]), w(fds[1]);
  int fl = ::fcntl(r.get(), F_GETFL);
  ::fcntl(r.get(), F_SETFL, fl | O_NONBLOCK);
  return std::make_pair(std::move(r), std::move(w));
}

// The reaper's side of the pipe (fd 3 in it): lines "g <pgid>" (a child's
// process group), "d <dir>" (a directory to remove) and "x" (kolorun is
// done: nothing to do). At EOF without "x", kolorun died: kill, remove, exit.
[[noreturn]] void runReaper(int fd, pid_t kolorun) {
  std::vector<pid_t> groups;
  std::vector<std::string> dirs;
  std::string pending;
  bool done = false;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (line.size() > 2 && line[0] == 'g') {
        pid_t pg = static_cast<pid_t>(std::strtol(line.c_str() + 2, nullptr, 10));
        if (pg > 1) groups.push_back(pg);
      } else if (line.size() > 2 && line[0] == 'd') {
        dirs.push_back(line.substr(2));
      } else if (line == "x") {
        done = true;
      }
    }
  }
  if (done) ::_exit(0);
  // Twice: a group member may have been forking at the first round.
  for (int round = 0; round < 2; ++round) {
    for (pid_t pg : groups) ::kill(-pg, SIGKILL);
  }
  std::error_code ec;
  for (auto& d : dirs) std::filesystem::remove_all(d, ec);
  std::string msg = "kolorun-reaper: kolorun (pid " + std::to_string(kolorun) + ") died; killed " +
                    std::to_string(groups.size()) + " process group(s)";
  for (auto& d : dirs) msg += ", removed " + d;
  msg += "\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
  (void)ignored;
  ::_exit(0);
}

}  // namespace

bool isExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::optional<std::string> findExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path_env = std::getenv("PATH");
  std::stringstream dirs(path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = dir.empty() ? std::string(".") : dir;
    candidate.append("/").append(name);
    if (isExecutableFile(candidate)) return candidate;
  }
  return std::nullopt;
}

std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev == nullptr) return "signal " + std::to_string(sig);
  return std::string("SIG") + abbrev;
}

std::string ExitInfo::describe() const {
  if (exec_errno != 0) return std::string("could not be started: ") + std::strerror(exec_errno);
  if (exited) return "exited with code " + std::to_string(code);
  return "was killed by signal " + signalName(signal);
}

void writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) return;  // a stuck reader: drop the rest
    } else {
      return;
    }
  }
}

StatusOr<std::unique_ptr<Supervisor>> Supervisor::create() {
  std::unique_ptr<Supervisor> s(new Supervisor());
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : kHandledSignals) sigaddset(&mask, sig);
  if (::sigprocmask(SIG_BLOCK, &mask, &s->old_mask_) != 0) return errnoStatus("sigprocmask", errno);
  s->mask_saved_ = true;
  s->sigfd_.reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!s->sigfd_.valid()) return errnoStatus("signalfd", errno);
  ::signal(SIGPIPE, SIG_IGN);
  s->devnull_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!s->devnull_.valid()) return errnoStatus("open /dev/null", errno);

  // The reaper (see supervisor.h). Forked now, while kolorun holds few fds
  // and runs one thread.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errnoStatus("pipe", errno);
  UniqueFd r(fds[0]), w(fds[1]);
  const pid_t kolorun = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return errnoStatus("fork", errno);
  if (pid == 0) {
    // Its own process group: a SIGKILL to kolorun's group leaves it to clean up.
    ::setpgid(0, 0);
    ::prctl(PR_SET_NAME, "kolorun-reaper");
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTTOU, SIGTTIN})
      ::signal(sig, SIG_IGN);
    ::sigprocmask(SIG_SETMASK, &s->old_mask_, nullptr);
    ::dup2(s->devnull_.get(), STDIN_FILENO);
    ::dup2(s->devnull_.get(), STDOUT_FILENO);
    ::dup2(r.get(), 3);  // devnull_ and r are above 2: r is not clobbered above
    ::close_range(4, ~0U, 0);
    runReaper(3, kolorun);
  }
  s->reaper_pid_ = pid;
  s->reaper_w_ = std::move(w);
  return s;
}

void Supervisor::tellReaper(char kind, const std::string& arg) {
  if (!reaper_w_.valid()) return;
  std::string line(1, kind);
  if (!arg.empty()) line += " " + arg;
  line += "\n";
  writeAll(reaper_w_.get(), line);
}

void Supervisor::removeOnDeath(const std::string& dir) { tellReaper('d', dir); }

Supervisor::~Supervisor() {
  for (auto& c : children_) {
    if (!c->running) continue;
    ::kill(-c->pid, SIGKILL);
    ::kill(c->pid, SIGKILL);
    int st;
    while (::waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
    }
    c->running = false;
  }
  if (reaper_w_.valid()) {
    tellReaper('x', "");
    reaper_w_.reset();
    int st;
    while (::waitpid(reaper_pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  if (mask_saved_) ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
}

StatusOr<int> Supervisor::spawn(SpawnSpec spec) {
  if (spec.argv.empty()) return invalidArgument("spawn " + spec.name + ": empty command");
  auto child = std::make_unique<Child>();
  child->name = spec.name;
  child->on_exit = std::move(spec.on_exit);

  UniqueFd out_w, err_w;
  if (!spec.log_path.empty()) {
    out_w.reset(::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!out_w.valid()) return errnoStatus("cannot open " + spec.log_path, errno);
  } else {
    ASSIGN_OR_RETURN(auto out, makePipe());
    ASSIGN_OR_RETURN(auto err, makePipe());
    child->out.fd = std::move(out.first);
    out_w = std::move(out.second);
    child->err.fd = std::move(err.first);
    err_w = std::move(err.second);
    auto discard = [](std::string_view) {};
    child->out.lines = std::make_unique<LineSplitter>(spec.on_stdout ? spec.on_stdout : discard);
    child->err.lines = std::make_unique<LineSplitter>(spec.on_stderr ? spec.on_stderr : discard);
  }
  // The child reports a failed exec through this pipe; a successful exec
  // closes it (O_CLOEXEC) and the parent reads EOF.
  int status_fds[2];
  if (::pipe2(status_fds, O_CLOEXEC) != 0) return errnoStatus("pipe", errno);
  UniqueFd status_r(status_fds[0]), status_w(status_fds[1]);

  // stdin_data goes into a pipe before the fork; the child finds it, then EOF.
  UniqueFd in_r;
  if (!spec.stdin_data.empty()) {
    if (spec.stdin_data.size() > kMaxStdinData) {
      return invalidArgument("spawn " + spec.name + ": more than " + std::to_string(kMaxStdinData) +
                             " bytes for its stdin");
    }
    int in_fds[2];
    if (::pipe2(in_fds, O_CLOEXEC) != 0) return errnoStatus("pipe", errno);
    in_r.reset(in_fds[0]);
    UniqueFd in_w(in_fds[1]);
    std::string_view left = spec.stdin_data;
    while (!left.empty()) {
      ssize_t w = ::write(in_w.get(), left.data(), left.size());
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return errnoStatus("spawn " + spec.name + ": cannot fill its stdin", errno);
      left.remove_prefix(static_cast<size_t>(w));
    }
  }

  ExecImage im = makeImage(spec);
  const pid_t parent = ::getpid();
  const int in_fd = in_r.valid() ? in_r.get() : devnull_.get();
  const int out_fd = out_w.get();
  const int err_fd = err_w.valid() ? err_w.get() : out_w.get();
  const int report_fd = status_w.get();
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();

  pid_t pid = ::fork();
  if (pid < 0) return errnoStatus("fork", errno);
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // kolorun died before prctl
    ::dup2(in_fd, STDIN_FILENO);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    if (cwd == nullptr || ::chdir(cwd) == 0) ::execve(im.path.c_str(), im.argv.data(), im.envp.data());
    int e = errno;
    ssize_t ignored = ::write(report_fd, &e, sizeof e);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no window where a signal misses the group
  tellReaper('g', std::to_string(pid));
  status_w.reset();
  in_r.reset();
  out_w.reset();
  err_w.reset();
  child->pid = pid;
  child->running = true;
  child->started = Clock::now();

  int exec_errno = 0;
  ssize_t n;
  while ((n = ::read(status_r.get(), &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;

  int id = static_cast<int>(children_.size());
  log::get("kolorun")->debug("started {} as pid {}: {}", child->name, pid, im.path);
  children_.push_back(std::move(child));
  if (exec_errno != 0) {
    Child& c = *children_.back();
    int st;
    while (::waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {
    }
    c.running = false;
    c.out.fd.reset();
    c.err.fd.reset();
    ExitInfo info;
    info.exited = true;
    info.code = 127;
    info.exec_errno = exec_errno;
    info.wall = Clock::now() - c.started;
    if (c.on_exit) c.on_exit(info);
  }
  return id;
}

bool Supervisor::readPipe(Pipe& p) {
  if (!p.fd.valid()) return false;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(p.fd.get(), buf, sizeof buf);
    if (n > 0) {
      p.lines->feed(std::string_view(buf, static_cast<size_t>(n)));
      if (static_cast<size_t>(n) < sizeof buf) return true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    // EOF (or an error, treated alike): deliver the partial last line.
    p.lines->flush();
    p.fd.reset();
    return false;
  }
}

void Supervisor::reapAll() {
  // By index: an on_exit callback may spawn (and grow children_).
  for (size_t i = 0; i < children_.size(); ++i) {
    Child* c = children_[i].get();
    if (!c->running) continue;
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(c->pid, &st, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r != c->pid) continue;
    c->running = false;
    ExitInfo info;
    info.wall = Clock::now() - c->started;
    if (WIFEXITED(st)) {
      info.exited = true;
      info.code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      info.signal = WTERMSIG(st);
    }
    log::get("kolorun")->debug("{} (pid {}) {}", c->name, c->pid, info.describe());
    // Everything the child wrote is in the pipes now: deliver it first.
    readPipe(c->out);
    readPipe(c->err);
    if (c->on_exit) c->on_exit(info);
  }
}

void Supervisor::handleSignals() {
  signalfd_siginfo si;
  bool child = false;
  for (;;) {
    ssize_t n = ::read(sigfd_.get(), &si, sizeof si);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof si)) break;
    if (static_cast<int>(si.ssi_signo) == SIGCHLD) {
      child = true;
    } else {
      signals_.push_back(static_cast<int>(si.ssi_signo));
    }
  }
  if (child) reapAll();
}

void Supervisor::pump(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  // What each pollfd is: -1 signalfd, -2 - i watch i, else 2 * child + (0 out, 1 err).
  std::vector<long> what;
  fds.push_back({sigfd_.get(), POLLIN, 0});
  what.push_back(-1);
  for (size_t i = 0; i < watches_.size(); ++i) {
    fds.push_back({watches_[i].fd, POLLIN, 0});
    what.push_back(-2 - static_cast<long>(i));
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i]->out.fd.valid()) {
      fds.push_back({children_[i]->out.fd.get(), POLLIN, 0});
      what.push_back(static_cast<long>(2 * i));
    }
    if (children_[i]->err.fd.valid()) {
      fds.push_back({children_[i]->err.fd.get(), POLLIN, 0});
      what.push_back(static_cast<long>(2 * i + 1));
    }
  }
  int ms = static_cast<int>(std::max<int64_t>(0, timeout.count()));
  int n = ::poll(fds.data(), fds.size(), ms);
  if (n < 0) return;  // EINTR: the caller pumps again
  std::vector<std::function<void()>> watch_cbs;
  for (size_t k = 1; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    long w = what[k];
    if (w <= -2) {
      watch_cbs.push_back(watches_[static_cast<size_t>(-2 - w)].cb);
    } else {
      Child& c = *children_[static_cast<size_t>(w / 2)];
      readPipe(w % 2 == 0 ? c.out : c.err);
    }
  }
  // Pipes first, then exits: a child's last lines come before its exit report.
  handleSignals();
  reapAll();  // cheap, and robust against a coalesced SIGCHLD
  for (auto& cb : watch_cbs) cb();
}

bool Supervisor::pumpUntil(const std::function<bool()>& done, Clock::time_point deadline,
                           std::chrono::milliseconds tick) {
  while (!done()) {
    auto now = Clock::now();
    if (now >= deadline) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                std::chrono::milliseconds(1);
    pump(std::min(left, tick));
  }
  return true;
}

bool Supervisor::running(int id) const { return children_.at(static_cast<size_t>(id))->running; }

int Supervisor::runningCount() const {
  int n = 0;
  for (auto& c : children_) n += c->running ? 1 : 0;
  return n;
}

pid_t Supervisor::pid(int id) const { return children_.at(static_cast<size_t>(id))->pid; }

const std::string& Supervisor::name(int id) const { return children_.at(static_cast<size_t>(id))->name; }

void Supervisor::signalGroup(int id, int sig) {
  const Child& c = *children_.at(static_cast<size_t>(id));
  if (c.pid <= 0) return;
  if (::kill(-c.pid, sig) != 0 && c.running) ::kill(c.pid, sig);
}

std::vector<int> Supervisor::takeSignals() {
  std::vector<int> s;
  s.swap(signals_);
  return s;
}

void Supervisor::watch(int fd, std::function<void()> cb) { watches_.push_back({fd, std::move(cb)}); }

void Supervisor::unwatch(int fd) {
  std::erase_if(watches_, [fd](const Watch& w) { return w.fd == fd; });
}

bool Supervisor::anyPipeOpen(const std::vector<int>& ids) const {
  for (int id : ids) {
    const Child& c = *children_.at(static_cast<size_t>(id));
    if (c.out.fd.valid() || c.err.fd.valid()) return true;
  }
  return false;
}

void Supervisor::drainOutput(const std::vector<int>& ids, Clock::time_point deadline) {
  pumpUntil([&] { return !anyPipeOpen(ids); }, deadline);
  for (int id : ids) {
    Child& c = *children_.at(static_cast<size_t>(id));
    for (Pipe* p : {&c.out, &c.err}) {
      if (!p->fd.valid()) continue;
      readPipe(*p);
      if (p->lines) p->lines->flush();
      p->fd.reset();
    }
  }
}

}  // namespace kolo::cli
