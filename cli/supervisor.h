// kolorun's process supervisor: spawns children (ranks and embedded
// daemons), reads their output through pipes line by line, reaps them and
// receives kolorun's own SIGINT/SIGTERM/SIGHUP, all from one thread with
// poll() (signals arrive through a signalfd, so nothing runs in a signal
// handler).
//
// Every child runs in its own process group (signals go to the group, so a
// rank's subprocesses are stopped with it) and gets PR_SET_PDEATHSIG
// SIGKILL. stdin is /dev/null, or a pipe holding SpawnSpec::stdin_data.
//
// PR_SET_PDEATHSIG reaches only the direct children: what a rank started
// through a shell wrapper would survive a SIGKILLed kolorun. So create()
// also forks a reaper ("kolorun-reaper"): kolorun tells it, through a pipe,
// every child's process group and every directory to remove; when the pipe
// ends without kolorun's "done" (kolorun died), the reaper SIGKILLs those
// groups, removes those directories and exits.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/line_splitter.h"
#include "common/fd.h"
#include "common/status.h"

namespace kolo::cli {

using Clock = std::chrono::steady_clock;

struct ExitInfo {
  bool exited = false;   // normal exit: `code` holds the exit code
  int code = 0;
  int signal = 0;        // killed by this signal
  int exec_errno = 0;    // the program could not be started (code is 127)
  Clock::duration wall{};

  bool success() const { return exited && code == 0; }
  // The code a shell would report: the exit code, or 128 + signal.
  int shellCode() const { return exited ? code : 128 + signal; }
  // "exited with code 3", "was killed by signal SIGTERM",
  // "could not be started: No such file or directory".
  std::string describe() const;
};

// A regular file we may execute.
bool isExecutableFile(const std::string& path);
// `name` itself when it holds a '/', else the first executable PATH/name.
std::optional<std::string> findExecutable(const std::string& name);

// "SIGTERM" for 15 (or "signal 15" when unknown).
std::string signalName(int sig);

// Bound on SpawnSpec::stdin_data: it is written into the pipe before the
// child starts, so it must fit in the pipe's buffer.
constexpr size_t kMaxStdinData = 16384;

struct SpawnSpec {
  std::string name;                                       // for messages
  std::vector<std::string> argv;                          // argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;   // set on top of kolorun's environment
  // What the child reads on stdin, then EOF (at most kMaxStdinData bytes;
  // e.g. secrets for a remote rank, which must not be on a command line).
  // Empty: stdin is /dev/null.
  std::string stdin_data;
  // The child's working directory (empty: kolorun's). A relative argv[0]
  // with a '/' is then found from there, as after mpirun's -wdir.
  std::string cwd;
  // Either a file that receives stdout and stderr directly (appended)...
  std::string log_path;
  // ...or pipes: each complete line goes to these (partial last lines at EOF).
  LineSplitter::LineFn on_stdout;
  LineSplitter::LineFn on_stderr;
  // Called once the child has been reaped (its output so far delivered).
  std::function<void(const ExitInfo&)> on_exit;
};

class Supervisor {
 public:
  // Blocks SIGCHLD/SIGINT/SIGTERM/SIGHUP in the calling (only) thread and
  // reads them from a signalfd; ignores SIGPIPE. Children get the original
  // signal mask and default SIGPIPE back.
  static StatusOr<std::unique_ptr<Supervisor>> create();
  // Kills (SIGKILL, to the group) and reaps every child still running.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Returns the child's id (0, 1, ...). A program that cannot be executed is
  // not an error here: the child "exits" with code 127 and exec_errno set.
  StatusOr<int> spawn(SpawnSpec spec);

  // Waits up to `timeout` for output, child exits, signals or watched fds,
  // and handles whatever arrived.
  void pump(std::chrono::milliseconds timeout);
  // Pumps until done() or the deadline; returns done(). done() is checked
  // after every event, and at least every `tick` as a safety net.
  bool pumpUntil(const std::function<bool()>& done, Clock::time_point deadline,
                 std::chrono::milliseconds tick = std::chrono::milliseconds(250));

  bool running(int id) const;
  int runningCount() const;
  pid_t pid(int id) const;
  const std::string& name(int id) const;
  // Sends `sig` to the child's process group (also after the child itself
  // exited, to reach what it left behind). Errors (no such group) are ignored.
  void signalGroup(int id, int sig);

  // The reaper removes `dir` (recursively) if kolorun dies without ~Supervisor.
  void removeOnDeath(const std::string& dir);
  // The reaper's pid (-1 if it could not be started).
  pid_t reaperPid() const { return reaper_pid_; }

  // kolorun's own SIGINT/SIGTERM/SIGHUP received since the last call.
  std::vector<int> takeSignals();

  // Calls `cb` when `fd` is readable (e.g. an inotify fd).
  void watch(int fd, std::function<void()> cb);
  void unwatch(int fd);

  // Pumps until every pipe of the children `ids` is at EOF or `deadline`
  // passes, then delivers their partial last lines and closes their pipes.
  void drainOutput(const std::vector<int>& ids, Clock::time_point deadline);

 private:
  struct Pipe {
    UniqueFd fd;
    std::unique_ptr<LineSplitter> lines;
  };
  struct Child {
    std::string name;
    pid_t pid = -1;
    bool running = false;
    Clock::time_point started;
    Pipe out, err;
    std::function<void(const ExitInfo&)> on_exit;
  };
  struct Watch {
    int fd;
    std::function<void()> cb;
  };

  Supervisor() = default;
  void handleSignals();
  void reapAll();
  // Reads what is available; returns false at EOF (the pipe is then closed).
  bool readPipe(Pipe& p);
  bool anyPipeOpen(const std::vector<int>& ids) const;

  void tellReaper(char kind, const std::string& arg);

  UniqueFd sigfd_;
  UniqueFd devnull_;
  UniqueFd reaper_w_;
  pid_t reaper_pid_ = -1;
  bool mask_saved_ = false;
  sigset_t old_mask_{};
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<Watch> watches_;
  std::vector<int> signals_;
};

// Writes all of `data` to `fd` (retrying on EINTR/EAGAIN); errors such as
// EPIPE are dropped: output that cannot be written is lost, not fatal.
void writeAll(int fd, std::string_view data);

}  // namespace kolo::cli
