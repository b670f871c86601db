// Backend peers as separate processes for the multi-process tests
// (tests/backend/multiprocess_test.cc over the host backends,
// tests/gpu/nccl_process_test.cc over NCCL): each child's stdout+stderr on a
// pipe, a FileKvStore directory they meet in, and bounded waits for a line
// or an exit. Children are killed and reaped, and the directory removed,
// even when a check fails.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/fd.h"

extern char** environ;

namespace kolo {

class PeerProcesses {
 public:
  using Clock = std::chrono::steady_clock;

  PeerProcesses() {
    char tmpl[] = "/tmp/kolo-backend-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) dir_ = tmpl;
  }
  ~PeerProcesses() {
    for (auto& c : children_) {
      if (!c.reaped) {
        ::kill(c.pid, SIGKILL);
        int st;
        ::waitpid(c.pid, &st, 0);
      }
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;

  const std::string& dir() const { return dir_; }

  // Starts one peer with this process's environment plus `env` (which
  // replaces variables of the same name); false on failure.
  bool spawn(const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env = {}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    UniqueFd rd(fds[0]), wr(fds[1]);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);
    posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string v = *e;
      if (env.count(v.substr(0, v.find('='))) == 0) vars.push_back(v);
    }
    for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    pid_t pid;
    int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return false;
    Child c;
    c.pid = pid;
    c.out_fd = std::move(rd);
    children_.push_back(std::move(c));
    return true;
  }

  pid_t pid(int i) const { return children_[i].pid; }
  const std::string& output(int i) const { return children_[i].out; }

  // Reads child i's output until it contains `needle` (true) or the deadline / EOF passes.
  bool waitFor(int i, const std::string& needle, Clock::time_point deadline) {
    Child& c = children_[i];
    while (c.out.find(needle) == std::string::npos) {
      if (c.eof || !readSome(c, deadline)) return c.out.find(needle) != std::string::npos;
    }
    return true;
  }

  // Waits until child i exits (its output reaches EOF) and reaps it; false at the deadline.
  bool waitExit(int i, Clock::time_point deadline, int* exit_code) {
    Child& c = children_[i];
    while (!c.eof) {
      if (!readSome(c, deadline)) return false;
    }
    int st = 0;
    if (::waitpid(c.pid, &st, 0) != c.pid) return false;
    c.reaped = true;
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }

 private:
  struct Child {
    pid_t pid = -1;
    UniqueFd out_fd;
    std::string out;
    bool eof = false;
    bool reaped = false;
  };

  // One poll+read; false once the deadline has passed with nothing to read.
  static bool readSome(Child& c, Clock::time_point deadline) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{c.out_fd.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc <= 0) return rc < 0 && errno == EINTR;
    char buf[4096];
    ssize_t n = ::read(c.out_fd.get(), buf, sizeof buf);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) return true;
      c.eof = true;
      return true;
    }
    c.out.append(buf, static_cast<size_t>(n));
    return true;
  }

  std::string dir_;
  std::vector<Child> children_;
};

}  // namespace kolo
