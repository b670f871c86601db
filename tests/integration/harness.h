// Multi-process test harness: starts the real kolo-coordinator and
// kolo-agent binaries in a private temp dir (as a user would, with flags),
// spawns rank processes with the environment kolorun would give them, and
// cleans everything up (processes, sockets, files) even when a test fails.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace kolo::testing {

struct Proc {
  pid_t pid = -1;
  std::string log_path;
  int exit_code = -1;     // valid once exited
  int term_signal = 0;
  bool exited = false;
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point ended;
  std::string output() const;
  double seconds() const { return std::chrono::duration<double>(ended - started).count(); }
};

// Spawns argv with extra env; stdout+stderr go to log_path.
Proc spawnProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& log_path);
// Waits for the process to exit up to timeout; returns false on timeout.
bool waitProcess(Proc& p, std::chrono::milliseconds timeout);
void killProcess(Proc& p, int sig);
// Waits (bounded) until `path` holds a non-empty first line, read into
// `content`; false on timeout or when `owner` exits first.
bool waitForFile(const std::string& path, Proc& owner, std::chrono::milliseconds timeout,
                 std::string* content);

struct ClusterOptions {
  int agents = 1;
  std::map<std::string, std::string> agent_env;               // for every agent
  std::vector<std::map<std::string, std::string>> per_agent_env;  // extra, by agent index
  std::vector<std::string> coordinator_prefix;                  // e.g. {"ip","netns","exec","ns-a"}
  std::vector<std::vector<std::string>> agent_prefix;           // by agent index
  std::string coordinator_listen = "127.0.0.1:0";
  std::vector<std::string> coordinator_args;                    // extra flags
  // Appended to the coordinator's address in the agents' --coordinator,
  // e.g. ",127.0.0.1:PORT" for a second coordinator started later.
  std::string agent_coordinator_suffix;
  std::string agent_coordinator_prefix;  // prepended, e.g. "STANDBY:PORT,"
  // Non-empty: no coordinator is started; the agents are given this list
  // (coordinators the test runs itself, e.g. on etcd). coordinator() is
  // then a Proc that never ran and coordinatorAddress() this list.
  std::string external_coordinators;
};

class Cluster {
 public:
  // Starts a coordinator and `agents` agents (agent i has socket dir/agent-i.sock).
  explicit Cluster(int agents = 1, std::map<std::string, std::string> agent_env = {});
  explicit Cluster(const ClusterOptions& options);
  ~Cluster();
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }
  std::string socket(int agent = 0) const { return dir_ + "/agent-" + std::to_string(agent) + ".sock"; }
  const std::string& coordinatorAddress() const { return coord_addr_; }
  const std::string& agentRpc(int agent = 0) const { return agent_rpc_[agent]; }
  // host:port of the agent's Prometheus endpoint (from its ready file).
  std::string agentMetrics(int agent = 0) const;
  Proc& agent(int i) { return agents_[i]; }
  Proc& coordinator() { return coord_; }
  std::string agentLog(int i) const { return agents_[i].output(); }

  // Env for one rank of a job placed on agent `agent`.
  std::map<std::string, std::string> rankEnv(const std::string& job, const std::string& token, int world,
                                             int local_rank, int local_size, int agent = 0) const;
  // Spawns a whole job on agent 0: `world` ranks running argv.
  std::vector<Proc> launchJob(const std::string& job, int world, const std::vector<std::string>& argv,
                              std::map<std::string, std::string> extra_env = {});
  // Spawns a job over several agents: local_sizes[a] ranks on agent a.
  std::vector<Proc> launchMultiJob(const std::string& job, const std::vector<int>& local_sizes,
                                   const std::vector<std::string>& argv,
                                   std::map<std::string, std::string> extra_env = {});
  // Waits for every rank (bounded); kills leftovers. Returns false on timeout.
  bool waitJob(std::vector<Proc>& ranks, std::chrono::milliseconds timeout);

 private:
  bool ok_ = false;
  std::string error_;
  std::string dir_;
  std::string coord_addr_;
  Proc coord_;
  std::vector<Proc> agents_;
  std::vector<std::string> agent_rpc_;
  std::vector<Proc*> owned_;
  int log_seq_ = 0;
};

std::string binDir();  // where kolo-agent etc. are (KOLO_BIN_DIR compile definition)

// "1_2_1" for a layout of ranks per agent (test parameter names).
std::string layoutName(const std::vector<int>& sizes);
// Every agent's log, each under a "--- agent i" header (failure messages).
std::string allLogs(Cluster& c, int agents);
// GET http://addr/path over a plain socket (bounded by a receive timeout):
// the whole response, headers included; empty if nothing answered.
std::string httpGet(const std::string& addr, const std::string& path);
// Runs `bin args...` on every rank of a job laid out as `sizes` (ranks per
// agent) on a fresh cluster and expects every rank to exit 0 printing
// `needle` (gtest expectations; the logs go into the failure messages).
void runCheckJob(const std::string& bin, const std::vector<int>& sizes, const std::string& job,
                 const std::vector<std::string>& args, const std::string& needle,
                 std::chrono::seconds timeout = std::chrono::seconds(180));

// Runs `bin args...` as job `job` with one rank on each of 2 agents, the
// timeline on, and returns, from node0's trace, the "fused" argument of
// every event of `activities`: "ACTIVITY tensor" -> fused ("1" when the
// event has none). `trace` (optional) receives the trace text, for failure
// messages. A failed job or a trace that is not JSON is a gtest failure and
// gives an empty map.
std::map<std::string, std::string> fusedInTimeline(const std::string& bin, const std::vector<std::string>& args,
                                                   const std::string& job,
                                                   const std::vector<std::string>& activities,
                                                   std::string* trace = nullptr);
// The same for any argument `arg` of the events (`missing` when an event
// has none), with extra environment for the agents (their configuration)
// and for the job's two ranks (rank_env).
std::map<std::string, std::string> timelineArgs(const std::string& bin, const std::vector<std::string>& args,
                                                const std::string& job, const std::vector<std::string>& activities,
                                                const std::string& arg, const std::string& missing,
                                                const std::map<std::string, std::string>& agent_env,
                                                std::string* trace = nullptr, std::map<std::string, std::string> rank_env = {});

}  // namespace kolo::testing
