#include "cli/srun_launch.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <set>

#include "common/launcher_env.h"

namespace kolo::cli {

namespace {

// rankEnv's names that differ from rank to rank.
const std::set<std::string>& perRankNames() {
  static const std::set<std::string> names = [] {
    std::set<std::string> s;
    for (const char* n : {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"}) {
      s.insert(std::string("KOLO_") + n);
      s.insert(std::string("HOROVOD_") + n);
    }
    for (const char* n : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                          "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"}) {
      s.insert(n);
    }
    return s;
  }();
  return names;
}

std::string getOr(const std::map<std::string, std::string>& env, const char* name,
                  const std::string& dflt) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? dflt : it->second;
}

}  // namespace

StatusOr<Launcher> chooseLauncher(const std::string& flag, bool hosts_given, int agents,
                                  bool srun_found, const std::map<std::string, std::string>& env) {
  const bool in_allocation = !getOr(env, "SLURM_JOB_ID", getOr(env, "SLURM_JOBID", "")).empty();
  if (flag == "ssh") return Launcher::kSsh;
  if (flag == "auto" || flag.empty()) {
    if (!in_allocation || hosts_given || agents != 1 || !srun_found) return Launcher::kSsh;
    // A one-node allocation runs as on any one machine (its system agent, or
    // kolorun's private daemons when there is none).
    ASSIGN_OR_RETURN(auto alloc, slurmAllocation(env));
    return alloc && alloc->size() > 1 ? Launcher::kSrun : Launcher::kSsh;
  }
  if (flag != "srun")
    return invalidArgument("--launcher must be ssh, srun or auto, got '" + flag + "'");
  if (!in_allocation) {
    return invalidArgument(
        "--launcher srun: not inside a Slurm allocation (SLURM_JOB_ID is not set); run kolorun in "
        "an sbatch script or under salloc");
  }
  if (hosts_given) {
    return invalidArgument(
        "--launcher srun takes the hosts from the allocation: give no -H/--hostfile");
  }
  if (agents != 1)
    return invalidArgument("--launcher srun uses each node's kolo-agent: --agents must be 1");
  if (!srun_found) return invalidArgument("--launcher srun: no srun on PATH");
  return Launcher::kSrun;
}

StatusOr<std::vector<HostSlots>> allocationHosts(const std::map<std::string, std::string>& env) {
  ASSIGN_OR_RETURN(auto alloc, slurmAllocation(env));
  if (!alloc) return invalidArgument("not inside a Slurm allocation (SLURM_JOB_ID is not set)");
  std::vector<HostSlots> hosts;
  for (const AllocationNode& n : *alloc) hosts.push_back({n.host, n.tasks});
  return hosts;
}

std::vector<std::pair<std::string, std::string>> srunStepEnv(const LaunchPlan& plan) {
  std::vector<std::pair<std::string, std::string>> env;
  for (auto& kv : rankEnv(plan, 0)) {
    if (perRankNames().count(kv.first) == 0) env.push_back(std::move(kv));
  }
  return env;
}

std::vector<std::string> srunArgv(const LaunchPlan& plan, const std::string& kolorun) {
  std::vector<std::string> argv = {"srun", "--ntasks=" + std::to_string(plan.size()),
                                   "--nodes=" + std::to_string(plan.nodes.size()),
                                   "--distribution=arbitrary", "--kill-on-bad-exit=1", "--label",
                                   // The step may start while an earlier step's
                                   // resources are still being released (else
                                   // srun waits, "Requested nodes are busy",
                                   // with back-off of a minute or more).
                                   "--overlap"};
  if (!plan.wdir.empty()) argv.push_back("--chdir=" + plan.wdir);
  argv.insert(argv.end(), {kolorun, "--slurm-task", "--"});
  argv.insert(argv.end(), plan.command.begin(), plan.command.end());
  return argv;
}

std::string srunHostfile(const LaunchPlan& plan) {
  std::string text;
  for (const RankPlacement& p : plan.ranks)
    text += plan.nodes.at(static_cast<size_t>(p.node)).host + "\n";
  return text;
}

StatusOr<std::vector<std::pair<std::string, std::string>>> slurmTaskEnv(
    const std::map<std::string, std::string>& env) {
  ASSIGN_OR_RETURN(std::optional<LauncherIdentity> id, launcherIdentity(env));
  if (!id || id->launcher != "slurm") {
    return invalidArgument(
        "--slurm-task runs only in a task of kolorun's srun step (SLURM_PROCID is not set)");
  }
  auto per_node_text =
      getOr(env, "SLURM_STEP_TASKS_PER_NODE", getOr(env, "SLURM_TASKS_PER_NODE", ""));
  ASSIGN_OR_RETURN(std::vector<int> per_node, expandSlurmTasksPerNode(per_node_text));
  LaunchPlan plan;
  plan.job.job_id = getOr(env, "KOLO_JOB_ID", id->job_id);
  plan.job.token = getOr(env, "KOLO_JOB_TOKEN", "");
  plan.start_timeout_s = std::atoi(getOr(env, "KOLO_START_TIMEOUT", "30").c_str());
  const std::string socket = getOr(env, "KOLO_AGENT_SOCKET", "/run/kolo/agent.sock");
  for (size_t n = 0; n < per_node.size(); ++n) plan.nodes.push_back({"", false, "", socket, ""});
  plan.ranks = placeRanks(per_node);
  if (id->rank >= plan.size() || plan.size() != id->size) {
    return invalidArgument("SLURM_STEP_TASKS_PER_NODE '" + per_node_text +
                           "' does not add up to SLURM_NTASKS " + std::to_string(id->size));
  }
  const RankPlacement& p = plan.ranks[static_cast<size_t>(id->rank)];
  if (p.node != id->node || p.local_rank != id->local_rank) {
    return invalidArgument("srun placed task " + std::to_string(id->rank) + " as local task " +
                           std::to_string(id->local_rank) + " of node " + std::to_string(id->node) +
                           ", but kolorun's plan has it as local rank " +
                           std::to_string(p.local_rank) + " of node " + std::to_string(p.node) +
                           " (is SLURM_DISTRIBUTION overridden?)");
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& kv : rankEnv(plan, id->rank)) {
    if (perRankNames().count(kv.first) != 0) out.push_back(std::move(kv));
  }
  return out;
}

bool parseSrunTaskExit(std::string_view line, int* task, int* code) {
  constexpr std::string_view kExit = ": Exited with exit code ";
  if (line.substr(0, 13) != "srun: error: ") return false;
  size_t e = line.find(kExit);
  size_t t = line.find(": task");
  if (e == std::string_view::npos || t == std::string_view::npos || t > e) return false;
  size_t num = line.find_first_of("0123456789", t);
  if (num == std::string_view::npos || num > e) return false;
  int v = 0, c = 0;
  auto r1 = std::from_chars(line.data() + num, line.data() + e, v);
  auto r2 = std::from_chars(line.data() + e + kExit.size(), line.data() + line.size(), c);
  if (r1.ec != std::errc() || r2.ec != std::errc() || r2.ptr != line.data() + line.size())
    return false;
  *task = v;
  *code = c;
  return true;
}

bool splitSrunLabel(std::string_view line, int* task, std::string_view* text) {
  size_t b = line.find_first_not_of(' ');
  if (b == std::string_view::npos) return false;
  size_t colon = line.find(':', b);
  if (colon == std::string_view::npos || colon == b) return false;
  int v = 0;
  auto [end, ec] = std::from_chars(line.data() + b, line.data() + colon, v);
  if (ec != std::errc() || end != line.data() + colon) return false;
  *task = v;
  std::string_view rest = line.substr(colon + 1);
  if (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  *text = rest;
  return true;
}

}  // namespace kolo::cli

#include <unistd.h>

#include <cstdlib>

namespace kolo::cli {

bool findOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view p = path != nullptr ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t colon = p.find(':', pos);
    std::string dir(p.substr(pos, colon == std::string_view::npos ? p.npos : colon - pos));
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) break;
    pos = colon + 1;
  }
  return false;
}

}  // namespace kolo::cli

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kolo::cli {

int execSlurmTask(const std::map<std::string, std::string>& env, char** command) {
  auto vars = slurmTaskEnv(env);
  if (!vars.isOk()) {
    std::fprintf(stderr, "kolorun --slurm-task: %s\n", vars.status().message().c_str());
    return 1;
  }
  for (auto& [k, v] : *vars) ::setenv(k.c_str(), v.c_str(), 1);
  ::execvp(command[0], command);
  std::fprintf(stderr, "kolorun --slurm-task: cannot run '%s': %s\n", command[0],
               std::strerror(errno));
  return 127;
}

}  // namespace kolo::cli
