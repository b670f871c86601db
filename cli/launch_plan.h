// kolorun's launch plan: which rank runs on which node, with which
// environment and which command line. Pure functions (no processes, no I/O
// except newJobIdentity), so the whole plan is unit-tested.
//
// A "node" is one agent: a host of -H/--hostfile, or one of the --agents
// embedded agents on this machine. Ranks fill nodes in contiguous blocks.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kolo::cli {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// "h1:2,h2:4" (a host without ":N" has 1 slot).
StatusOr<std::vector<HostSlots>> parseHostList(std::string_view spec);
// A hostfile's text: one "host slots=N" per line ("host" alone: 1 slot);
// blank lines and "# comments" are skipped. `origin` names the file in errors.
StatusOr<std::vector<HostSlots>> parseHostfile(std::string_view text, std::string_view origin);

struct RankPlacement {
  int rank = 0;
  int node = 0;         // index into LaunchPlan::nodes
  int local_rank = 0;
  int local_size = 0;
  // Horovod's meaning: the ranks with the same local_rank form a "cross"
  // group; cross_rank is this rank's index in it (= the node's index among
  // the nodes that have this local rank), cross_size its size.
  int cross_rank = 0;
  int cross_size = 0;
};

// np ranks split into k contiguous blocks, as even as possible, larger blocks
// first: evenBlocks(5, 2) == {3, 2}. Requires 1 <= k <= np.
std::vector<int> evenBlocks(int np, int k);
// Ranks per node when filling nodes of the given capacities in order (like
// horovodrun -H): error when np exceeds the total. Nodes left empty are
// dropped from the result (trailing zeros).
StatusOr<std::vector<int>> fillSlots(int np, const std::vector<int>& slots);
// Places ranks given the number of ranks on each node (no empty nodes).
std::vector<RankPlacement> placeRanks(const std::vector<int>& ranks_per_node);

struct NodeEndpoint {
  std::string host;          // "localhost" for this machine
  bool local = true;         // false: ranks start through ssh
  std::string agent_id;      // embedded agents: "node<i>"; empty for a system agent
  std::string agent_socket;  // KOLO_AGENT_SOCKET for its ranks
  std::string agent_rpc;     // KOLO_AGENT_RPC (empty: not set)
};

struct JobIdentity {
  std::string job_id;  // "job-" + 12 hex digits
  std::string token;   // 32 hex digits
};
// Random id and token from /dev/urandom.
StatusOr<JobIdentity> newJobIdentity();

struct LaunchPlan {
  JobIdentity job;
  std::vector<NodeEndpoint> nodes;
  std::vector<RankPlacement> ranks;
  std::string coordinator;     // KOLO_COORDINATOR (empty: not set)
  int start_timeout_s = 30;
  // Extra variables for every rank (the tuning knobs as KOLO_*).
  std::map<std::string, std::string> extra_env;
  // -x/--env variables, set last (they win over extra_env), in order.
  std::vector<std::pair<std::string, std::string>> user_env;
  std::string wdir;                      // --wdir (empty: kolorun's / ssh's own)
  std::vector<std::string> ssh_options;  // e.g. {"-p", "2222", "-i", "key"}
  std::vector<std::string> command;
  // torchrun's MASTER_ADDR / MASTER_PORT for the ranks (torch.distributed's
  // env:// store, hosted by rank 0); port 0: not set (setTorchrunMaster).
  std::string master_addr;
  int master_port = 0;

  int size() const { return static_cast<int>(ranks.size()); }
};

// torchrun's MASTER_ADDR / MASTER_PORT for a plan whose nodes are set: the
// ones in kolorun's environment `env` when both are there; else node 0's
// address (127.0.0.1 when every node is this machine, else its host name or
// this machine's) and, when node 0 is this machine, a port free on it now
// (I/O: a bind to port 0), else 29500 + a number from the job id (< 1000).
void setTorchrunMaster(LaunchPlan& plan, const std::map<std::string, std::string>& env);

// The variables kolorun sets for `rank` (in a fixed order): KOLO_*,
// HOROVOD_*, and torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK (the node's index), GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE
// and, when plan.master_port is set, MASTER_ADDR and MASTER_PORT.
std::vector<std::pair<std::string, std::string>> rankEnv(const LaunchPlan& plan, int rank);
// Variables that never go on a command line, where `ps` shows them to every
// user of the host: KOLO_JOB_TOKEN and any *_TOKEN, *SECRET*, *PASSWORD*.
bool isSecretVariable(std::string_view name);
// The argv kolorun executes for `rank`: the command itself on a local node
// (its environment is rankEnv on top of kolorun's own), or on a remote node
//   ssh -o BatchMode=yes [ssh_options] HOST sh -c '<read secrets>; [cd WDIR &&] exec env K=V... command...'
// (quoted for the remote shell) where K=V are rankEnv's variables except
// the secret ones: those come on ssh's stdin (rankStdin), and the remote
// shell reads and exports them before it runs the command.
std::vector<std::string> rankArgv(const LaunchPlan& plan, int rank);
// What kolorun writes to the stdin of `rank`'s ssh: one "NAME=value" line
// per secret variable, then EOF. Empty for a local rank.
std::string rankStdin(const LaunchPlan& plan, int rank);

// rankArgv's remote form for any variables `env` (the secret ones left out:
// secretStdin gives them as the "NAME=value" lines the remote shell reads).
std::vector<std::string> sshArgv(const LaunchPlan& plan, const std::string& host,
                                 const std::vector<std::pair<std::string, std::string>>& env);
std::string secretStdin(const std::vector<std::pair<std::string, std::string>>& env);

// Quotes `s` for a POSIX shell (unchanged when it holds only safe characters).
std::string shellQuote(std::string_view s);
// localhost, 127.0.0.1, ::1 or this machine's hostname (short or full).
bool isLocalHost(std::string_view host);
// "node0".."node9"; zero-padded when k > 10 ("node00".."node10") so that
// the coordinator's order by agent id matches the rank blocks.
std::string embeddedAgentId(int index, int k);

}  // namespace kolo::cli
