// What HPC launchers tell the processes they start, read as pure functions
// of an environment: Slurm's compressed host lists and task counts (as
// `scontrol show hostnames` expands them), the allocation kolorun runs in,
// and the identity (rank, size, local rank, local size, job) of a process
// started directly by `srun` or by Open MPI's `mpirun` (docs/slurm.md).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kolo {

// "n[1-3,7],gpu-[01-02]" -> n1 n2 n3 n7 gpu-01 gpu-02, as `scontrol show
// hostnames` does: ranges keep the low bound's zero padding, several
// bracket groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1
// r1n2 r2n1 r2n2). At most 1,000,000 names.
StatusOr<std::vector<std::string>> expandSlurmHostlist(std::string_view list);
// SLURM_TASKS_PER_NODE's form, "2(x3),1" -> 2 2 2 1.
StatusOr<std::vector<int>> expandSlurmTasksPerNode(std::string_view spec);

struct AllocationNode {
  std::string host;
  int tasks = 1;
};
// The Slurm allocation this process runs in (SLURM_JOB_ID set): its nodes
// in order (SLURM_JOB_NODELIST, else SLURM_NODELIST) with the tasks each
// may run (SLURM_TASKS_PER_NODE; absent: one per node). nullopt when
// SLURM_JOB_ID is not set; an error when the lists are bad or disagree.
StatusOr<std::optional<std::vector<AllocationNode>>> slurmAllocation(
    const std::map<std::string, std::string>& env);

// A process started by a launcher other than kolorun.
struct LauncherIdentity {
  std::string launcher;  // "slurm" or "openmpi"
  int rank = 0;
  int size = 0;
  int local_rank = 0;
  int local_size = 0;
  int node = 0;           // the node's index among the step's nodes
  std::string job_id;     // shared by the step's ranks: "slurm-<job>.<step>", "ompi-<namespace>"
  std::string slurm_job;  // SLURM_JOB_ID (Slurm only): names the prolog's token file
};
// From SLURM_PROCID, SLURM_NTASKS (SLURM_STEP_NUM_TASKS), SLURM_LOCALID,
// SLURM_NODEID with SLURM_STEP_TASKS_PER_NODE (the local size) and
// SLURM_JOB_ID/SLURM_STEP_ID; or from OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK with PMIX_NAMESPACE (else
// OMPI_MCA_ess_base_jobid) as the job. Open MPI wins when both are set
// (mpirun inside an allocation runs under Slurm's variables). nullopt when
// neither launcher's rank is set; an error naming the variable when one is
// set but its companions are missing or bad.
StatusOr<std::optional<LauncherIdentity>> launcherIdentity(
    const std::map<std::string, std::string>& env);

}  // namespace kolo
