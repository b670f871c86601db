// kolorun's job: picks the agents (a system agent, embedded daemons, or
// remote hosts), builds the launch plan, runs the ranks under the
// supervisor, stops everything on the first failure or signal, prints the
// summary and returns kolorun's exit code.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/daemons.h"
#include "cli/kolorun_options.h"
#include "cli/launch_plan.h"
#include "cli/supervisor.h"

namespace kolo::cli {

class JobRunner {
 public:
  explicit JobRunner(KolorunOptions opts) : opts_(std::move(opts)) {}
  // Returns kolorun's exit code.
  int run();

 private:
  struct RankState {
    int child = -1;
    bool done = false;
    ExitInfo exit;
    UniqueFd output_file;  // --output-filename: DIR/rank.N/stdout
    UniqueFd error_file;   // DIR/rank.N/stderr
  };

  // Fills plan_.nodes/ranks (and starts embedded daemons when needed).
  Status prepareNodes();
  Status startEmbedded(int num_agents);
  // --launcher srun (cli/srun_runner.cc): the nodes from the allocation,
  // then one srun step runs every rank.
  Status prepareSrunNodes();
  Status spawnSrunStep();
  Status spawnRanks();
  void superviseRanks();
  void onRankExit(int rank, const ExitInfo& info);
  // SIGTERM (or `sig`) to every running rank's group, SIGKILL after the grace.
  void stopRanks(int sig);
  void printSummary();
  void say(const std::string& line) const;  // "kolorun: line\n" on stderr

  KolorunOptions opts_;
  std::unique_ptr<Supervisor> sup_;
  std::unique_ptr<EmbeddedDaemons> daemons_;
  LaunchPlan plan_;
  std::vector<RankState> ranks_;
  Clock::time_point started_;
  Clock::time_point finished_;
  std::optional<Clock::time_point> kill_deadline_;
  bool killed_ = false;
  // The first cause of failure, which decides the exit code.
  std::optional<int> failed_rank_;
  int received_signal_ = 0;
  bool daemon_failed_ = false;
  int srun_failed_code_ = 0;       // srun: the first failed task's exit code
  bool srun_ = false;              // the ranks are one srun step (ranks_[0] holds srun)
  std::string srun_hostfile_dir_;  // SLURM_HOSTFILE's directory, removed at the end
  int exit_code_ = 0;
};

}  // namespace kolo::cli
