// Test helpers: a child process with captured stdout/stderr and bounded
// waits (poll on its pipes and a pidfd: no sleeps), a private temp dir, and
// waiting for a file to appear (inotify).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kolo::clitest {

using namespace std::chrono_literals;

class TestProcess {
 public:
  // Starts argv[0] (looked up in PATH) with `set` added to this process's
  // environment and `unset` removed. The child runs in its own process group.
  TestProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
              const std::vector<std::string>& unset = {});
  // SIGKILLs the child's process group if it is still running, and reaps it.
  ~TestProcess();
  TestProcess(const TestProcess&) = delete;
  TestProcess& operator=(const TestProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `text` appears in stdout (or stderr) or the timeout.
  bool waitForStdout(const std::string& text, std::chrono::milliseconds timeout);
  bool waitForStderr(const std::string& text, std::chrono::milliseconds timeout);
  // Waits for the exit (and the end of its output); the exit code, or
  // 128 + signal; nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  void signal(int sig);

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  bool waitForText(const std::string& text, const std::string* buf, std::chrono::milliseconds timeout);
  // One poll round over the pipes and the pidfd.
  void pumpOnce(std::chrono::milliseconds timeout);

  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string out_, err_;
};

// Runs a command to completion (bounded) and returns {exit code, stdout, stderr}.
struct RunResult {
  std::optional<int> code;
  std::string out, err;
};
RunResult runCommand(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                     std::chrono::milliseconds timeout, const std::vector<std::string>& unset = {});

// A private temporary directory, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  // Names of the entries in it.
  std::vector<std::string> list() const;

 private:
  std::string path_;
};

// Waits until `path` exists and is non-empty (inotify on its directory).
bool waitForFile(const std::string& path, std::chrono::milliseconds timeout);
// True when `pid` is gone (or a zombie) within the timeout (pidfd).
bool waitProcessGone(pid_t pid, std::chrono::milliseconds timeout);

// The build's bin directory (kolorun, kolo, kolo-agent, kolo-coordinator).
std::string binDir();
std::string standinDaemon();

}  // namespace kolo::clitest
