// kolorun's elastic mode (--min-np / --max-np / --host-discovery-script;
// docs/elastic.md). Either the hosts are real hosts, each running its own
// kolo-agent at --agent-socket (-H / --hostfile, or a discovery script with
// --agent-socket or KOLO_AGENT_SOCKET given): ranks on other hosts start
// over ssh as kolorun's -H ranks do; or, on this one machine, each
// discovered host is an embedded kolo-agent (its "node"), started and
// stopped as the host list changes:
//
// - the hosts come from --host-discovery-script ("host:slots" lines, run
//   every second), -H / --hostfile (fixed), or are --agents K fixed nodes;
// - -np ranks fill the hosts in order at the start; a host that appears
//   later gets an agent and `slots` ranks while the job stays within
//   --max-np (they join at the next generation); a host that disappears has
//   its ranks and agent stopped (the job goes on at the next generation);
// - a rank that fails is restarted on its host (up to --max-restarts times
//   per slot) without touching the others; a host whose agent died is
//   blacklisted and its ranks are not restarted; below --min-np nothing is
//   restarted (the job failed);
// - the job succeeds when every rank still placed exits 0.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/daemons.h"
#include "cli/kolorun_options.h"
#include "cli/launch_plan.h"
#include "cli/supervisor.h"

namespace kolo::cli {

// Parses a discovery script's output: one "host:slots" (or "host") per
// line; blank lines and "# comments" are skipped. `origin` names the script.
StatusOr<std::vector<HostSlots>> parseDiscoveryOutput(std::string_view text, std::string_view origin);

class ElasticRunner {
 public:
  explicit ElasticRunner(KolorunOptions opts) : opts_(std::move(opts)) {}
  int run();  // kolorun's exit code

 private:
  struct Host {
    std::string name;
    int slots = 0;        // as discovered
    int ranks = 0;        // ranks placed on it (0: spare, no agent)
    bool removed = false; // gone from the discovery output (its ranks were stopped)
    bool lost = false;    // its agent died: blacklisted
    EmbeddedAgent agent;
  };
  struct Rank {
    std::string host;
    int local_rank = 0;
    int local_size = 0;
    int world = 0;       // KOLO_SIZE it was started with
    int child = -1;
    int restarts = 0;
    bool running = false;
    bool stopping = false;  // stopped by kolorun (host removed, job ending)
    std::optional<ExitInfo> last_exit;
    std::optional<Clock::time_point> restart_at;
    int id = 0;          // output prefix [id]
  };

  StatusOr<std::vector<HostSlots>> fixedHosts() const;  // -H / --hostfile
  StatusOr<std::vector<HostSlots>> discover();
  Status startEmbedded(const std::vector<HostSlots>& found, const std::vector<int>& per);
  void setupPlan();
  int superviseAndFinish();
  Status startHost(Host& h, int ranks, int world);
  void spawnRank(Rank& r);
  void onRankExit(size_t index, const ExitInfo& info);
  void applyDiscovery(const std::vector<HostSlots>& hosts);
  void onAgentLost(const std::string& id);
  int placedRanks() const;
  bool anyRunningOrPending() const;
  void stopAll(int sig);
  void say(const std::string& line) const;

  KolorunOptions opts_;
  std::unique_ptr<Supervisor> sup_;
  std::unique_ptr<EmbeddedDaemons> daemons_;
  LaunchPlan plan_;  // job identity, coordinator and extra env (no placements)
  std::vector<Host> hosts_;
  std::vector<Rank> ranks_;
  int next_rank_id_ = 0;
  bool remote_ = false;  // hosts run their own agents (ranks over ssh); else embedded agents
  bool stopping_ = false;
  std::optional<int> failed_;  // exit code of the failure that ended the job
  int received_signal_ = 0;
};

}  // namespace kolo::cli
