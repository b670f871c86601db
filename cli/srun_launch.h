// kolorun inside a Slurm allocation (docs/slurm.md): the hosts and slots
// come from the allocation, and the ranks start as one `srun` step whose
// tasks run `kolorun --slurm-task -- command`, which sets the rank's
// variables from srun's (SLURM_PROCID, ...) and executes the command.
// Pure functions, except writeSrunHostfile.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli/launch_plan.h"
#include "common/status.h"

namespace kolo::cli {

enum class Launcher { kSsh, kSrun };

// --launcher ssh|srun|auto. auto: srun inside an allocation of several
// nodes (SLURM_JOB_ID in `env`) when no -H/--hostfile is given, --agents is
// 1 and `srun_found`, else ssh (which, without hosts, means this machine).
// srun outside an allocation, or with -H/--hostfile or --agents > 1, is an
// error that says why.
StatusOr<Launcher> chooseLauncher(const std::string& flag, bool hosts_given, int agents,
                                  bool srun_found, const std::map<std::string, std::string>& env);

// The allocation's hosts and tasks per node as -H would give them.
StatusOr<std::vector<HostSlots>> allocationHosts(const std::map<std::string, std::string>& env);

// The variables every task of the step shares: rankEnv of rank 0 without
// the per-rank numbers (the task computes them, slurmTaskEnv).
std::vector<std::pair<std::string, std::string>> srunStepEnv(const LaunchPlan& plan);
// srun --ntasks=N --nodes=K --distribution=arbitrary --kill-on-bad-exit=1
//      --label [--chdir=WDIR] KOLORUN --slurm-task -- command...
// The placement is in SLURM_HOSTFILE (one host per rank, srunHostfile).
std::vector<std::string> srunArgv(const LaunchPlan& plan, const std::string& kolorun);
// SLURM_HOSTFILE's text: the host of rank 0, 1, ... one per line.
std::string srunHostfile(const LaunchPlan& plan);

// In a task of kolorun's step: the per-rank variables (KOLO_RANK, ...,
// HOROVOD_*, torchrun's) from SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID and
// SLURM_STEP_TASKS_PER_NODE. An error when srun placed the task elsewhere
// than kolorun's plan (the node or local rank disagree).
StatusOr<std::vector<std::pair<std::string, std::string>>> slurmTaskEnv(
    const std::map<std::string, std::string>& env);

// "1: text" (srun --label, the task number right-aligned) -> task 1, "text".
// false when the line has no label.
bool splitSrunLabel(std::string_view line, int* task, std::string_view* text);
// srun's "srun: error: n1: task 1: Exited with exit code 3" (or "tasks 2-3:
// ..."): the first task named and its code. false for any other line.
bool parseSrunTaskExit(std::string_view line, int* task, int* code);

}  // namespace kolo::cli

namespace kolo::cli {
// An executable `name` in a directory of $PATH.
bool findOnPath(const std::string& name);
}  // namespace kolo::cli

namespace kolo::cli {
// kolorun --slurm-task -- command...: sets slurmTaskEnv's variables and
// executes the command; returns (1, or 127 when it cannot be run) only on error.
int execSlurmTask(const std::map<std::string, std::string>& env, char** command);
}  // namespace kolo::cli
