// kolorun's embedded mode: with no agent on this machine, kolorun starts a
// private kolo-coordinator and K kolo-agents (one per "node"), waits until
// each has written its ready file, and stops them at the end.
//
// Everything lives in one private directory (mkdtemp under $TMPDIR or /tmp,
// mode 0700): the agents' sockets, the ready files, the daemons' logs
// (coordinator.log, agent-<i>.log) and agent-admin.token (0600), a random
// token the agents require on their admin calls (--rpc-auth-token-file):
// their gRPC port is on loopback, which every user of the machine reaches.
// It is removed at the end; when a daemon failed, its logs are kept there
// and the error names them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/supervisor.h"
#include "common/status.h"

namespace kolo::cli {

// The CPUs this process may run on (its affinity mask), at least 1.
int usableCpus();

// The path of a kolo program: `override_env` (e.g. KOLO_AGENT_BIN) when set,
// else the directory of this executable (/proc/self/exe), else PATH.
StatusOr<std::string> findKoloProgram(const std::string& name, const char* override_env);

// The last `max_lines` lines of a file ("" if unreadable).
std::string fileTail(const std::string& path, int max_lines);

struct EmbeddedOptions {
  std::string coordinator_bin;
  std::string agent_bin;
  int num_agents = 1;
  std::string log_level;  // passed as --log-level when non-empty
  bool verbose = false;   // also echo the daemons' output, prefixed, on stderr
  std::chrono::milliseconds start_timeout{30000};
  std::chrono::milliseconds stop_grace{5000};
  // Environment for the agents (the tuning knobs as KOLO_*).
  std::vector<std::pair<std::string, std::string>> agent_env;
  // Elastic jobs (docs/elastic.md): extra coordinator flags, agent ids to
  // start instead of node<i> (one per host), and an agent that exits is
  // reported through lostAgents() instead of being a failure.
  std::vector<std::string> coordinator_args;
  std::vector<std::string> agent_ids;
  bool elastic = false;
};

struct EmbeddedAgent {
  std::string id;           // node<i>
  std::string socket;       // DIR/agent-<i>.sock
  std::string ready_file;   // DIR/agent-<i>.ready
  std::string log_path;     // DIR/agent-<i>.log
  std::string rpc_address;  // from the ready file
  int child = -1;
};

class EmbeddedDaemons {
 public:
  // Makes the private directory; starts nothing yet.
  static StatusOr<std::unique_ptr<EmbeddedDaemons>> create(Supervisor& sup, EmbeddedOptions opts);
  // Starts the coordinator, waits for it, then starts the agents and waits
  // for all of them, each wait bounded by start_timeout. `cancelled` is
  // polled while waiting (kolorun got SIGINT/SIGTERM): the start is then
  // abandoned with Code::kAborted. On error, call stop().
  Status start(const std::function<bool()>& cancelled);
  // Elastic: starts one more agent (waits until it is ready) / stops one
  // (SIGTERM, then SIGKILL after stop_grace); a stopped agent is not lost.
  StatusOr<EmbeddedAgent> addAgent(const std::string& id, const std::function<bool()>& cancelled);
  void stopAgent(const std::string& id);
  // Elastic: ids of the agents that exited on their own, since the last call.
  std::vector<std::string> takeLostAgents();
  ~EmbeddedDaemons();
  EmbeddedDaemons(const EmbeddedDaemons&) = delete;
  EmbeddedDaemons& operator=(const EmbeddedDaemons&) = delete;

  const std::string& dir() const { return dir_; }
  // The agents' admin token file (for KOLO_AGENT_TOKEN_FILE in the ranks).
  const std::string& adminTokenFile() const { return admin_token_file_; }
  const std::string& coordinatorAddress() const { return coordinator_address_; }
  const std::vector<EmbeddedAgent>& agents() const { return agents_; }
  // Set once a daemon exited while it should have been running: which one,
  // how, and the tail of its log.
  const std::optional<std::string>& failure() const { return failure_; }

  // SIGTERM to the agents, then to the coordinator, each waited for up to
  // stop_grace before SIGKILL; then removes the directory, except the logs
  // when a daemon failed (and says so on stderr). Idempotent.
  void stop();

 private:
  EmbeddedDaemons(Supervisor& sup, EmbeddedOptions opts) : sup_(sup), opts_(std::move(opts)) {}
  Status makeDir();
  StatusOr<int> spawnDaemon(const std::string& label, std::vector<std::string> argv,
                            std::vector<std::pair<std::string, std::string>> env,
                            const std::string& log_path);
  // Waits until every (label, child, ready file) in `waits` is ready.
  Status waitReady(const std::vector<std::tuple<std::string, int, std::string, std::string>>& waits,
                   const std::function<bool()>& cancelled);
  void stopChildren(const std::vector<int>& ids);
  void onDaemonExit(const std::string& label, const std::string& log_path, const ExitInfo& info);
  // Spawns agent `id` (paths DIR/agent-<n>.*); appended to agents_.
  StatusOr<EmbeddedAgent*> spawnAgent(const std::string& id);

  Supervisor& sup_;
  EmbeddedOptions opts_;
  std::string dir_;
  std::string admin_token_file_;
  UniqueFd inotify_;
  std::string coordinator_address_;
  std::string coordinator_log_;
  int coordinator_child_ = -1;
  std::vector<EmbeddedAgent> agents_;
  std::vector<std::unique_ptr<UniqueFd>> log_fds_;  // verbose mode: kolorun writes the logs
  bool stopping_ = false;
  bool stopped_ = false;
  bool keep_logs_ = false;
  std::optional<std::string> failure_;
  int next_agent_ = 0;
  std::vector<std::string> stopped_agents_;  // elastic: stopped on purpose
  std::vector<std::string> lost_agents_;     // elastic: exited on their own
};

// Environment that turns off, for the private daemons, the TLS and token
// settings a user may have exported for a shared coordinator (KOLO_TLS_CERT,
// KOLO_COORDINATOR_CA, ...): the private coordinator is plain text on loopback.
std::vector<std::pair<std::string, std::string>> privateCoordinatorEnv();
std::vector<std::pair<std::string, std::string>> privateAgentEnv();
// For the ranks of an embedded job (and `kolo` run inside them): the agent's
// client settings above and the same for KOLO_AGENT_CA ... KOLO_AGENT_TOKEN_FILE.
std::vector<std::pair<std::string, std::string>> privateClientEnv();

// Reads a ready file: its first word ("host:port") once the file is complete
// (ends with '\n'); nullopt until then. Later words are ignored.
std::optional<std::string> readReadyFile(const std::string& path);

}  // namespace kolo::cli
