// kolorun inside a Slurm allocation: the launcher choice, the hosts from the
// allocation, the srun step's command line, hostfile and shared variables,
// the variables a task computes from srun's, and srun's --label lines.
#include "cli/srun_launch.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kolo::cli {
namespace {

using Env = std::map<std::string, std::string>;
using Vars = std::vector<std::pair<std::string, std::string>>;

const Env kAlloc = {
    {"SLURM_JOB_ID", "55"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}};

std::string find(const Vars& v, const std::string& k) {
  auto it = std::find_if(v.begin(), v.end(), [&](auto& kv) { return kv.first == k; });
  return it == v.end() ? "<unset>" : it->second;
}

TEST(SrunLaunch, ChoosesTheLauncher) {
  EXPECT_EQ(chooseLauncher("auto", false, 1, true, kAlloc).value(), Launcher::kSrun);
  EXPECT_EQ(chooseLauncher("auto", true, 1, true, kAlloc).value(), Launcher::kSsh);
  EXPECT_EQ(chooseLauncher("auto", false, 1, false, kAlloc).value(), Launcher::kSsh);
  EXPECT_EQ(chooseLauncher("auto", false, 1, true, Env{}).value(), Launcher::kSsh);
  EXPECT_EQ(chooseLauncher("ssh", false, 1, true, kAlloc).value(), Launcher::kSsh);
  Env one = {{"SLURM_JOB_ID", "56"}, {"SLURM_JOB_NODELIST", "n4"}, {"SLURM_TASKS_PER_NODE", "4"}};
  EXPECT_EQ(chooseLauncher("auto", false, 1, true, one).value(), Launcher::kSsh);  // one machine
  EXPECT_EQ(chooseLauncher("srun", false, 1, true, one).value(), Launcher::kSrun);
  Env bad = {{"SLURM_JOB_ID", "57"}, {"SLURM_JOB_NODELIST", "n[1-"}};
  EXPECT_FALSE(chooseLauncher("auto", false, 1, true, bad).isOk());
  EXPECT_EQ(chooseLauncher("srun", false, 1, true, Env{}).status().message(),
            "--launcher srun: not inside a Slurm allocation (SLURM_JOB_ID is not set); run kolorun "
            "in an sbatch "
            "script or under salloc");
  EXPECT_EQ(chooseLauncher("srun", true, 1, true, kAlloc).status().message(),
            "--launcher srun takes the hosts from the allocation: give no -H/--hostfile");
  EXPECT_EQ(chooseLauncher("srun", false, 2, true, kAlloc).status().message(),
            "--launcher srun uses each node's kolo-agent: --agents must be 1");
  EXPECT_EQ(chooseLauncher("srun", false, 1, false, kAlloc).status().message(),
            "--launcher srun: no srun on PATH");
}

LaunchPlan planOf(const std::vector<int>& per_node) {
  LaunchPlan plan;
  plan.job = {"job-abc", "secret"};
  auto hosts = allocationHosts(kAlloc).value();
  for (size_t i = 0; i < per_node.size(); ++i)
    plan.nodes.push_back({hosts[i].host, false, "", "/run/kolo/agent.sock", ""});
  plan.ranks = placeRanks(per_node);
  plan.coordinator = "10.0.0.1:7470";
  plan.command = {"python", "train.py", "--lr", "0.1"};
  return plan;
}

TEST(SrunLaunch, OneStepWithTheRanksPlacedByTheHostfile) {
  auto hosts = allocationHosts(kAlloc);
  ASSERT_TRUE(hosts.isOk()) << hosts.status().message();
  ASSERT_EQ(hosts->size(), 3u);
  EXPECT_EQ((*hosts)[2].host, "n3");
  EXPECT_EQ((*hosts)[2].slots, 1);
  LaunchPlan plan = planOf(fillSlots(5, {2, 2, 1}).value());
  plan.wdir = "/scratch/run";
  EXPECT_EQ(srunArgv(plan, "/usr/bin/kolorun"),
            (std::vector<std::string>{"srun", "--ntasks=5", "--nodes=3", "--distribution=arbitrary",
                                      "--kill-on-bad-exit=1", "--label", "--overlap",
                                      "--chdir=/scratch/run", "/usr/bin/kolorun", "--slurm-task",
                                      "--", "python", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(srunHostfile(plan), "n1\nn1\nn2\nn2\nn3\n");
  Vars env = srunStepEnv(plan);
  EXPECT_EQ(find(env, "KOLO_JOB_ID"), "job-abc");
  EXPECT_EQ(find(env, "KOLO_JOB_TOKEN"),
            "secret");  // in srun's environment, never on its command line
  EXPECT_EQ(find(env, "KOLO_COORDINATOR"), "10.0.0.1:7470");
  EXPECT_EQ(find(env, "KOLO_RANK"), "<unset>");
  EXPECT_EQ(find(env, "LOCAL_RANK"), "<unset>");
}

TEST(SrunLaunch, ATaskComputesItsRankVariables) {
  Env task = {{"SLURM_JOB_ID", "55"},
              {"SLURM_STEP_ID", "0"},
              {"SLURM_PROCID", "3"},
              {"SLURM_LOCALID", "1"},
              {"SLURM_NODEID", "1"},
              {"SLURM_NTASKS", "5"},
              {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
              {"KOLO_JOB_ID", "job-abc"},
              {"KOLO_JOB_TOKEN", "secret"}};
  auto vars = slurmTaskEnv(task);
  ASSERT_TRUE(vars.isOk()) << vars.status().message();
  EXPECT_EQ(find(*vars, "KOLO_RANK"), "3");
  EXPECT_EQ(find(*vars, "KOLO_SIZE"), "5");
  EXPECT_EQ(find(*vars, "KOLO_LOCAL_RANK"), "1");
  EXPECT_EQ(find(*vars, "KOLO_LOCAL_SIZE"), "2");
  EXPECT_EQ(find(*vars, "KOLO_CROSS_RANK"), "1");
  EXPECT_EQ(find(*vars, "KOLO_CROSS_SIZE"), "2");
  EXPECT_EQ(find(*vars, "HOROVOD_RANK"), "3");
  EXPECT_EQ(find(*vars, "GROUP_RANK"), "1");
  EXPECT_EQ(find(*vars, "GROUP_WORLD_SIZE"), "3");
  EXPECT_EQ(find(*vars, "KOLO_JOB_TOKEN"), "<unset>");  // inherited, not rewritten
  task["SLURM_NODEID"] = "0";
  EXPECT_EQ(slurmTaskEnv(task).status().message(),
            "srun placed task 3 as local task 1 of node 0, but kolorun's plan has it as local rank "
            "1 of node 1 "
            "(is SLURM_DISTRIBUTION overridden?)");
  EXPECT_EQ(slurmTaskEnv(Env{}).status().message(),
            "--slurm-task runs only in a task of kolorun's srun step (SLURM_PROCID is not set)");
}

TEST(SrunLaunch, LabelledLines) {
  int task = -1;
  std::string_view text;
  ASSERT_TRUE(splitSrunLabel(" 3: hello: world", &task, &text));
  EXPECT_EQ(task, 3);
  EXPECT_EQ(text, "hello: world");
  ASSERT_TRUE(splitSrunLabel("12:", &task, &text));
  EXPECT_EQ(task, 12);
  EXPECT_EQ(text, "");
  EXPECT_FALSE(splitSrunLabel("srun: error: n2: task 1: Exited with exit code 3", &task, &text));
  EXPECT_FALSE(splitSrunLabel(": x", &task, &text));
  int code = 0;
  ASSERT_TRUE(parseSrunTaskExit("srun: error: n1: task 1: Exited with exit code 3", &task, &code));
  EXPECT_EQ(task, 1);
  EXPECT_EQ(code, 3);
  ASSERT_TRUE(
      parseSrunTaskExit("srun: error: n2: tasks 2-3: Exited with exit code 143", &task, &code));
  EXPECT_EQ(task, 2);
  EXPECT_EQ(code, 143);
  EXPECT_FALSE(parseSrunTaskExit("srun: error: n1: task 0: Terminated", &task, &code));
  EXPECT_FALSE(
      parseSrunTaskExit("3: srun: error: n1: task 1: Exited with exit code 3", &task, &code));
}

}  // namespace
}  // namespace kolo::cli
