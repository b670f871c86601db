// launcher_env: Slurm's host lists and task counts (the expected lists are
// what Slurm 22.05's `scontrol show hostnames` prints for the same input),
// the allocation kolorun reads, and the identity of a rank started by srun
// or mpirun (pure logic over an environment map).
#include "common/launcher_env.h"

#include <gtest/gtest.h>

namespace kolo {
namespace {

using Env = std::map<std::string, std::string>;
using Names = std::vector<std::string>;

Names hosts(const char* list) {
  auto h = expandSlurmHostlist(list);
  EXPECT_TRUE(h.isOk()) << list << ": " << h.status().message();
  return h.isOk() ? h.value() : Names{};
}

TEST(SlurmHostlist, ExpandsAsScontrolShowHostnames) {
  EXPECT_EQ(hosts("n[1-3,7],gpu-[01-02]"), (Names{"n1", "n2", "n3", "n7", "gpu-01", "gpu-02"}));
  EXPECT_EQ(hosts("r[1-2]n[09-10]"), (Names{"r1n09", "r1n10", "r2n09", "r2n10"}));
  EXPECT_EQ(hosts("a,b[1-2] c"), (Names{"a", "b1", "b2", "c"}));
  EXPECT_EQ(hosts("n[08-11]"), (Names{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(hosts("node7"), (Names{"node7"}));
  EXPECT_EQ(hosts("kolo-n[0-3]"), (Names{"kolo-n0", "kolo-n1", "kolo-n2", "kolo-n3"}));
}

TEST(SlurmHostlist, RefusesBadListsNamingThem) {
  struct Case {
    const char* list;
    const char* says;
  };
  for (const Case& c :
       {Case{"n[3-1]", "host list 'n[3-1]': range 3-1 runs backwards"},
        Case{"n[1-2", "host list 'n[1-2': '[' without ']'"}, Case{"n1-2]", "']' without '['"},
        Case{"n[a-b]", "'a' is not a number"}, Case{"n[[1]]", "nested '['"},
        Case{"", "names no host"}, Case{"n[0-9999999]", "more than 1000000 hosts"}}) {
    auto h = expandSlurmHostlist(c.list);
    ASSERT_FALSE(h.isOk()) << c.list;
    EXPECT_NE(h.status().message().find(c.says), std::string::npos) << h.status().message();
  }
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  auto t = expandSlurmTasksPerNode("2(x3),1");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t.value(), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expandSlurmTasksPerNode("4").value(), (std::vector<int>{4}));
  for (const char* bad : {"", "2(x0)", "0", "2(3)", "2(x3", "x", "2,,1"}) {
    EXPECT_FALSE(expandSlurmTasksPerNode(bad).isOk()) << bad;
  }
  EXPECT_NE(
      expandSlurmTasksPerNode("2(3)").status().message().find("expected N or N(xM), got '2(3)'"),
      std::string::npos);
}

TEST(SlurmAllocation, NodesWithTheirTasks) {
  auto none = slurmAllocation(Env{{"PATH", "/bin"}});
  ASSERT_TRUE(none.isOk());
  EXPECT_FALSE(none.value().has_value());
  auto a = slurmAllocation(Env{{"SLURM_JOB_ID", "42"},
                               {"SLURM_JOB_NODELIST", "n[1-3]"},
                               {"SLURM_TASKS_PER_NODE", "2(x2),1"}});
  ASSERT_TRUE(a.isOk()) << a.status().message();
  ASSERT_EQ(a.value()->size(), 3u);
  EXPECT_EQ((*a.value())[0].host, "n1");
  EXPECT_EQ((*a.value())[1].tasks, 2);
  EXPECT_EQ((*a.value())[2].host, "n3");
  EXPECT_EQ((*a.value())[2].tasks, 1);
  auto bad = slurmAllocation(Env{
      {"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(),
            "SLURM_TASKS_PER_NODE '2(x2)' gives 2 nodes but SLURM_JOB_NODELIST 'n[1-3]' names 3");
  auto no_list = slurmAllocation(Env{{"SLURM_JOB_ID", "42"}});
  ASSERT_FALSE(no_list.isOk());
  EXPECT_EQ(no_list.status().message(), "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not");
}

Env srunTask(int procid, int localid, int nodeid) {
  return Env{{"SLURM_JOB_ID", "77"},
             {"SLURM_STEP_ID", "3"},
             {"SLURM_PROCID", std::to_string(procid)},
             {"SLURM_LOCALID", std::to_string(localid)},
             {"SLURM_NODEID", std::to_string(nodeid)},
             {"SLURM_NTASKS", "5"},
             {"SLURM_STEP_NUM_TASKS", "5"},
             {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}};
}

TEST(LauncherIdentity, SrunTask) {
  auto id = launcherIdentity(srunTask(3, 1, 1));
  ASSERT_TRUE(id.isOk()) << id.status().message();
  ASSERT_TRUE(id.value().has_value());
  EXPECT_EQ(id.value()->launcher, "slurm");
  EXPECT_EQ(id.value()->rank, 3);
  EXPECT_EQ(id.value()->size, 5);
  EXPECT_EQ(id.value()->local_rank, 1);
  EXPECT_EQ(id.value()->local_size, 2);
  EXPECT_EQ(id.value()->node, 1);
  EXPECT_EQ(id.value()->job_id, "slurm-77.3");
  EXPECT_EQ(id.value()->slurm_job, "77");
  auto last = launcherIdentity(srunTask(4, 0, 2));
  ASSERT_TRUE(last.isOk());
  EXPECT_EQ(last.value()->local_size, 1);
}

TEST(LauncherIdentity, ABatchScriptIsNoRank) {
  Env batch = srunTask(0, 0, 0);
  batch.erase("SLURM_STEP_ID");
  auto id = launcherIdentity(batch);
  ASSERT_TRUE(id.isOk());
  EXPECT_FALSE(id.value().has_value());
  EXPECT_FALSE(launcherIdentity(Env{{"HOME", "/root"}}).value().has_value());
}

TEST(LauncherIdentity, BadSlurmVariablesNameTheVariable) {
  Env e = srunTask(3, 1, 1);
  e.erase("SLURM_LOCALID");
  EXPECT_EQ(launcherIdentity(e).status().message(),
            "SLURM_LOCALID is not set, but SLURM_PROCID is");
  e = srunTask(3, 1, 7);
  EXPECT_EQ(launcherIdentity(e).status().message(),
            "SLURM_NODEID 7 is past SLURM_STEP_TASKS_PER_NODE '2(x2),1' (3 nodes)");
  e = srunTask(5, 0, 2);
  EXPECT_EQ(launcherIdentity(e).status().message(),
            "Slurm's SLURM_* variables: rank 5 is not below the size 5");
  e = srunTask(3, 1, 1);
  e["SLURM_PROCID"] = "x";
  EXPECT_EQ(launcherIdentity(e).status().message(), "SLURM_PROCID: 'x' is not a number");
}

TEST(LauncherIdentity, OpenMpiRankWinsOverTheAllocation) {
  Env e = srunTask(0, 0, 0);
  e.insert({{"OMPI_COMM_WORLD_RANK", "2"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
            {"OMPI_COMM_WORLD_NODE_RANK", "1"},
            {"PMIX_NAMESPACE", "prterun-host-123@1"},
            {"OMPI_MCA_ess_base_jobid", "99"}});
  auto id = launcherIdentity(e);
  ASSERT_TRUE(id.isOk()) << id.status().message();
  EXPECT_EQ(id.value()->launcher, "openmpi");
  EXPECT_EQ(id.value()->rank, 2);
  EXPECT_EQ(id.value()->size, 4);
  EXPECT_EQ(id.value()->local_size, 2);
  EXPECT_EQ(id.value()->node, 1);
  EXPECT_EQ(id.value()->job_id, "ompi-prterun-host-123@1");
  e.erase("PMIX_NAMESPACE");
  EXPECT_EQ(launcherIdentity(e).value()->job_id, "ompi-99");
  e.erase("OMPI_MCA_ess_base_jobid");
  EXPECT_NE(launcherIdentity(e).status().message().find(
                "neither PMIX_NAMESPACE nor OMPI_MCA_ess_base_jobid"),
            std::string::npos);
}

}  // namespace
}  // namespace kolo
