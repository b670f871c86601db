// Direct launch (docs/slurm.md): a rank started by srun or mpirun, with no
// KOLO_JOB_ID, takes its job from the launcher's variables and its token
// from KOLO_JOB_TOKEN, KOLO_JOB_TOKEN_FILE or the Slurm prolog's file.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>

#include "client_options.h"

namespace kolo {
namespace {

using Env = std::map<std::string, std::string>;

Env srunTask() {
  return {{"SLURM_JOB_ID", "123"},       {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "3"},         {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},         {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
}

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/kolo-direct-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TempDir() { (void)!::system(("rm -rf " + path).c_str()); }
};

TEST(DirectLaunchOptions, SrunTaskWithTheProlog) {
  TempDir dir;
  std::ofstream(dir.path + "/123.token") << "abcdef0123\n";
  Env e = srunTask();
  e["KOLO_JOB_TOKEN_DIR"] = dir.path;
  auto o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->job_id, "slurm-123.0");
  EXPECT_EQ(o->token, "abcdef0123");
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->local_size, 2);
  EXPECT_EQ(o->launcher, "slurm");
  EXPECT_EQ(o->launcher_rank, 3);
}

TEST(DirectLaunchOptions, TokenFromTheEnvironmentOrAFile) {
  Env e = srunTask();
  e["KOLO_JOB_TOKEN"] = "fromenv";
  auto o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->token, "fromenv");
  TempDir dir;
  std::ofstream(dir.path + "/tok") << "fromfile";
  e.erase("KOLO_JOB_TOKEN");
  e["KOLO_JOB_TOKEN_FILE"] = dir.path + "/tok";
  o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->token, "fromfile");
}

TEST(DirectLaunchOptions, NoTokenSaysWhereItIsLookedFor) {
  Env e = srunTask();
  e["KOLO_JOB_TOKEN_DIR"] = "/nonexistent-kolo";
  auto o = ClientOptions::fromEnv(e);
  ASSERT_FALSE(o.isOk());
  EXPECT_EQ(
      o.status().message(),
      "cannot read the job token file /nonexistent-kolo/123.token (named by the kolo Slurm prolog "
      "(deploy/slurm/prolog.sh)): is the kolo prolog configured on this node (Prolog= in "
      "slurm.conf, "
      "docs/slurm.md)? Or export KOLO_JOB_TOKEN before srun");
  Env m = {{"OMPI_COMM_WORLD_RANK", "0"},
           {"OMPI_COMM_WORLD_SIZE", "2"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
           {"PMIX_NAMESPACE", "prterun-x-1@1"}};
  o = ClientOptions::fromEnv(m);
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find(
                "a rank started by openmpi needs the job's token: export KOLO_JOB_TOKEN"),
            std::string::npos)
      << o.status().message();
  m["KOLO_JOB_TOKEN"] = "t";
  o = ClientOptions::fromEnv(m);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->job_id, "ompi-prterun-x-1@1");
  EXPECT_EQ(o->local_size, 2);
}

TEST(DirectLaunchOptions, KolorunsVariablesWin) {
  Env e = srunTask();
  e.insert({{"KOLO_JOB_ID", "job-1"},
            {"KOLO_JOB_TOKEN", "t"},
            {"KOLO_SIZE", "8"},
            {"KOLO_LOCAL_RANK", "0"},
            {"KOLO_LOCAL_SIZE", "8"}});
  auto o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->job_id, "job-1");
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->launcher, "");
  EXPECT_EQ(o->launcher_rank, -1);
}

TEST(DirectLaunchOptions, BadLauncherVariablesAndNoLauncher) {
  Env e = srunTask();
  e["KOLO_JOB_TOKEN"] = "t";
  e.erase("SLURM_STEP_TASKS_PER_NODE");
  e.erase("SLURM_TASKS_PER_NODE");
  auto o = ClientOptions::fromEnv(e);
  ASSERT_FALSE(o.isOk());
  EXPECT_EQ(o.status().message(), "SLURM_STEP_TASKS_PER_NODE is not set, but SLURM_PROCID is");
  o = ClientOptions::fromEnv(Env{{"HOME", "/"}});
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("KOLO_JOB_ID is not set"), std::string::npos);
  EXPECT_NE(o.status().message().find("start it with srun or Open MPI's mpirun (docs/slurm.md)"),
            std::string::npos);
}

}  // namespace
}  // namespace kolo
