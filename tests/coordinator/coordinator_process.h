// Runs the real kolo-coordinator binary as a child process for a test: a
// private temp dir, a ready file, the child's log, and a kill + reap + clean
// up in the destructor whatever happened.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kolo::coordinator::testing {

class CoordinatorProcess {
 public:
  CoordinatorProcess();
  ~CoordinatorProcess();
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;

  // Starts `binary --listen 127.0.0.1:0 --ready-file DIR/ready <args>` and
  // waits up to `timeout` for the ready file. False (with `error`) otherwise.
  bool start(const std::string& binary, const std::vector<std::string>& args,
             std::chrono::milliseconds timeout, std::string* error);

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string log() const;  // what the child wrote to stdout/stderr

  void signal(int sig);
  // Waits up to `timeout` for the child to exit; its wait status, or nullopt.
  std::optional<int> waitExit(std::chrono::milliseconds timeout);
  // SIGKILL and reap, if still running.
  void kill();

 private:
  std::string dir_;
  std::string address_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
};

// Runs `binary args...` to completion (bounded); returns its exit code and output.
struct RunResult {
  int exit_code = -1;
  std::string output;
};
RunResult runToCompletion(const std::string& binary, const std::vector<std::string>& args,
                          std::chrono::milliseconds timeout);

}  // namespace kolo::coordinator::testing
