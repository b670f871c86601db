// kolorun's command line.
#include "cli/kolorun_options.h"

#include <gtest/gtest.h>

namespace kolo::cli {
namespace {

StatusOr<KolorunOptions> parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  return parseKolorunArgs(args, env);
}

TEST(KolorunOptions, HorovodrunStyleNp) {
  auto o = parse({"-np", "4", "python", "train.py", "--lr", "1"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->np, 4);
  EXPECT_EQ(o->agents, 1);
  EXPECT_EQ(o->command, (std::vector<std::string>{"python", "train.py", "--lr", "1"}));
  EXPECT_EQ(o->start_timeout_s, 30);
  EXPECT_FALSE(o->verbose);
}

TEST(KolorunOptions, OptionsAfterTheCommandBelongToIt) {
  auto o = parse({"-np=2", "--agents", "2", "prog", "--verbose", "-np", "9"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->np, 2);
  EXPECT_EQ(o->agents, 2);
  EXPECT_FALSE(o->verbose);
  EXPECT_EQ(o->command, (std::vector<std::string>{"prog", "--verbose", "-np", "9"}));
}

TEST(KolorunOptions, DoubleDashEndsTheOptions) {
  auto o = parse({"--np", "3", "--verbose", "--", "--weird-program", "x"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_TRUE(o->verbose);
  EXPECT_EQ(o->command, (std::vector<std::string>{"--weird-program", "x"}));
}

TEST(KolorunOptions, TuningFlagsBecomeEnvironment) {
  auto o = parse({"-np", "2", "--fusion-threshold-mb", "64", "--cycle-time-ms", "2.5", "--cache-capacity", "0",
                  "--timeline-filename", "/tmp/t.json", "--autotune", "--log-level", "debug", "cmd"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  auto env = tuningEnv(*o);
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m["KOLO_FUSION_THRESHOLD_MB"], "64");
  EXPECT_EQ(m["KOLO_CYCLE_TIME_MS"], "2.5");
  EXPECT_EQ(m["KOLO_CACHE_CAPACITY"], "0");
  EXPECT_EQ(m["KOLO_TIMELINE_FILENAME"], "/tmp/t.json");
  EXPECT_EQ(m["KOLO_AUTOTUNE"], "1");
  EXPECT_EQ(m["KOLO_LOG_LEVEL"], "debug");
  auto plain = parse({"-np", "2", "cmd"});
  ASSERT_TRUE(plain.isOk());
  EXPECT_TRUE(tuningEnv(*plain).empty());
}

TEST(KolorunOptions, EmbeddedAgentsGetTheTimelineDirectoryOfTheFileAskedFor) {
  auto env = [](const KolorunOptions& o, std::map<std::string, std::string> e) {
    auto v = embeddedAgentEnv(o, e, "/home/alice/run");
    std::map<std::string, std::string> m;
    for (auto& [k, val] : v) {
      EXPECT_EQ(m.count(k), 0u) << k << " set twice";
      m[k] = val;
    }
    return m;
  };
  auto flag = parse({"-np", "2", "--timeline-filename", "/data/tl/t-%a.json",
                     "--fusion-threshold-mb", "8", "cmd"});
  ASSERT_TRUE(flag.isOk());
  auto m = env(*flag, {});
  EXPECT_EQ(m["KOLO_TIMELINE_FILENAME"], "/data/tl/t-%a.json");
  EXPECT_EQ(m["KOLO_TIMELINE_DIR"], "/data/tl");
  EXPECT_EQ(m["KOLO_FUSION_THRESHOLD_MB"], "8");
  auto plain = parse({"-np", "2", "cmd"});
  ASSERT_TRUE(plain.isOk());
  // Horovod's variable, a relative name: from the directory kolorun runs in.
  m = env(*plain, {{"HOROVOD_TIMELINE", "./out//tl.json"}});
  EXPECT_EQ(m["KOLO_TIMELINE_FILENAME"], "/home/alice/run/out/tl.json");
  EXPECT_EQ(m["KOLO_TIMELINE_DIR"], "/home/alice/run/out");
  // KOLO_TIMELINE_FILENAME beats HOROVOD_TIMELINE, as in the agent.
  m = env(*plain, {{"HOROVOD_TIMELINE", "/a/h.json"}, {"KOLO_TIMELINE_FILENAME", "/b/k.json"}});
  EXPECT_EQ(m["KOLO_TIMELINE_DIR"], "/b");
  // Nothing asked for: a trainer's start_timeline("x.json") lands in the
  // directory kolorun runs in.
  m = env(*plain, {});
  EXPECT_EQ(m.count("KOLO_TIMELINE_FILENAME"), 0u);
  EXPECT_EQ(m["KOLO_TIMELINE_DIR"], "/home/alice/run");
  // The user's own KOLO_TIMELINE_DIR is theirs: nothing is derived.
  m = env(*flag, {{"KOLO_TIMELINE_DIR", "/scratch"}});
  EXPECT_EQ(m.count("KOLO_TIMELINE_DIR"), 0u);
  EXPECT_EQ(m["KOLO_TIMELINE_FILENAME"], "/data/tl/t-%a.json");
}

TEST(KolorunOptions, HostsAndOtherOptions) {
  auto o = parse({"-H", "h1:2,h2:2", "-np", "4", "--start-timeout", "5", "--output-filename", "/tmp/out",
                  "--agent-socket", "/x.sock", "cmd"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->hosts, "h1:2,h2:2");
  EXPECT_EQ(o->start_timeout_s, 5);
  EXPECT_EQ(o->output_filename, "/tmp/out");
  EXPECT_EQ(o->agent_socket, "/x.sock");
}

TEST(KolorunOptions, AgentSocketDefault) {
  auto from_env = parse({"-np", "1", "cmd"}, {{"KOLO_AGENT_SOCKET", "/env.sock"}});
  ASSERT_TRUE(from_env.isOk());
  EXPECT_EQ(from_env->agent_socket, "/env.sock");
  auto dflt = parse({"-np", "1", "cmd"});
  ASSERT_TRUE(dflt.isOk());
  EXPECT_EQ(dflt->agent_socket, "/run/kolo/agent.sock");
}

TEST(KolorunOptions, Help) {
  auto o = parse({"--help"});
  ASSERT_TRUE(o.isOk());
  EXPECT_TRUE(o->help);
  EXPECT_NE(o->help_text.find("--fusion-threshold-mb"), std::string::npos);
  EXPECT_NE(o->help_text.find("kolorun -np N"), std::string::npos);
}

TEST(KolorunOptions, Errors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"cmd"}, "-np N is required"},
      {{"-np", "0", "cmd"}, "--np"},
      {{"-np", "2"}, "no command given"},
      {{"-np", "2", "--agents", "3", "cmd"}, "--agents 3 is more than -np 2"},
      {{"-np", "2", "--agents", "2", "-H", "a:2", "cmd"}, "cannot be combined"},
      {{"-np", "2", "-H", "a:2", "--hostfile", "/etc/hostname", "cmd"}, "not both"},
      {{"-np", "2", "--bogus", "cmd"}, "--bogus"},
      {{"-np", "2", "--fusion-threshold-mb", "lots", "cmd"}, "--fusion-threshold-mb"},
      {{"-np", "2", "--fusion-threshold-mb", "0.5", "cmd"}, "--fusion-threshold-mb"},
      {{"-np", "2", "--cycle-time-ms", "-1", "cmd"}, "--cycle-time-ms"},
      {{"-np", "2", "--hostfile", "/no/such/file", "cmd"}, "/no/such/file"},
  };
  for (const Case& c : cases) {
    auto o = parse(c.args);
    ASSERT_FALSE(o.isOk()) << "accepted: " << ::testing::PrintToString(c.args);
    EXPECT_NE(o.status().message().find(c.message), std::string::npos)
        << ::testing::PrintToString(c.args) << " -> " << o.status().message();
  }
}

TEST(KolorunOptions, HorovodrunAliases) {
  auto o = parse({"--num-proc", "4", "--min-num-proc", "2", "--max-num-proc", "6", "cmd"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->np, 4);
  EXPECT_EQ(o->min_np, 2);
  EXPECT_EQ(o->max_np, 6);
  EXPECT_TRUE(o->elastic());

  o = parse({"-np", "2", "--disable-cache", "--hierarchical-allreduce", "--no-hierarchical-allgather",
             "--autotune", "--no-autotune", "cmd"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->cache_capacity, "0");
  EXPECT_FALSE(o->autotune);  // the last of --autotune / --no-autotune wins
  EXPECT_EQ(o->command, (std::vector<std::string>{"cmd"}));
}

TEST(KolorunOptions, HorovodrunKnobsBecomeHorovodVariables) {
  auto o = parse({"-np", "2", "--autotune", "--autotune-log-file", "/tmp/a.csv", "--autotune-warmup-samples", "2",
                  "--autotune-steps-per-sample", "5", "--autotune-bayes-opt-max-samples", "9",
                  "--autotune-gaussian-process-noise", "0.5", "--stall-check-warning-time-seconds", "30",
                  "--stall-check-shutdown-time-seconds", "90", "--no-stall-check", "--timeline-mark-cycles",
                  "cmd", "--no-timeline-mark-cycles"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  auto env = tuningEnv(*o);
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m["KOLO_AUTOTUNE"], "1");
  EXPECT_EQ(m["HOROVOD_AUTOTUNE_LOG"], "/tmp/a.csv");
  EXPECT_EQ(m["HOROVOD_AUTOTUNE_WARMUP_SAMPLES"], "2");
  EXPECT_EQ(m["HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"], "5");
  EXPECT_EQ(m["HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"], "9");
  EXPECT_EQ(m["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"], "0.5");
  EXPECT_EQ(m["HOROVOD_STALL_CHECK_TIME_SECONDS"], "30");
  EXPECT_EQ(m["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"], "90");
  EXPECT_EQ(m["HOROVOD_STALL_CHECK_DISABLE"], "1");
  EXPECT_EQ(m["HOROVOD_TIMELINE_MARK_CYCLES"], "1");  // the second one belongs to the command
  EXPECT_EQ(o->command, (std::vector<std::string>{"cmd", "--no-timeline-mark-cycles"}));

  o = parse({"-np", "2", "--no-timeline-mark-cycles", "cmd"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  env = tuningEnv(*o);
  m = std::map<std::string, std::string>(env.begin(), env.end());
  EXPECT_EQ(m["HOROVOD_TIMELINE_MARK_CYCLES"], "0");
}

TEST(KolorunOptions, SingleDashLongOptionsAreNotShortFlagClusters) {
  // horovodrun spells -np and -hostfile with one dash; "-hostfile" once
  // parsed as -h (help) and kolorun exited 0 without running anything.
  auto o = parse({"-np", "1", "-hostfile", "/etc/hostname", "true"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_FALSE(o->help);
  EXPECT_EQ(o->hostfile, "/etc/hostname");
  EXPECT_EQ(o->command, (std::vector<std::string>{"true"}));
  o = parse({"-num-proc=3", "cmd"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->np, 3);
}

TEST(KolorunOptions, VersionAndCheckBuildNeedNoNp) {
  auto v = parse({"--version"});
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_TRUE(v->version);
  EXPECT_EQ(v->version_text.rfind("kolorun (kolo) ", 0), 0u) << v->version_text;
  auto b = parse({"--check-build"});
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_TRUE(b->check_build);
  EXPECT_NE(b->version_text.find("[X] PyTorch"), std::string::npos) << b->version_text;
}

TEST(KolorunOptions, EnvForwardingWorkingDirectoryAndSshOptions) {
  auto o = parse({"-np", "2", "-x", "A=1", "-x", "HOME", "--env", "B=x=y", "-x", "A=2", "--wdir", "/tmp", "-p",
                  "2222", "-i", "/dev/null", "-H", "h1:1,h2:1", "cmd", "-x", "C=3"},
                 {{"HOME", "/home/alice"}});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->command, (std::vector<std::string>{"cmd", "-x", "C=3"}));
  EXPECT_EQ(o->wdir, "/tmp");
  auto env = userEnv(*o, {{"HOME", "/home/alice"}});
  EXPECT_EQ(env, (std::vector<std::pair<std::string, std::string>>{
                     {"A", "2"}, {"HOME", "/home/alice"}, {"B", "x=y"}}));
  EXPECT_EQ(sshOptions(*o), (std::vector<std::string>{"-p", "2222", "-i", "/dev/null"}));
  auto mpirun = parse({"-np", "2", "-x", "A=1", "-wdir", "/tmp", "cmd"});  // mpirun's spelling
  ASSERT_TRUE(mpirun.isOk()) << mpirun.status().toString();
  EXPECT_EQ(mpirun->wdir, "/tmp");
  auto plain = parse({"-np", "2", "cmd"});
  ASSERT_TRUE(plain.isOk());
  EXPECT_TRUE(userEnv(*plain, {}).empty());
  EXPECT_TRUE(sshOptions(*plain).empty());
}

TEST(KolorunOptions, RefusedHorovodrunFlagsSayWhatToUse) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"-np", "2", "--config-file", "c.yaml", "cmd"}, "--config-file: kolorun reads no horovodrun YAML"},
      {{"-np", "2", "-p", "0", "cmd"}, "--ssh-port"},
      {{"-np", "2", "-i", "/no/such/key", "cmd"}, "/no/such/key"},
      {{"-np", "2", "-x", "1BAD=x", "cmd"}, "-x 1BAD=x: \"1BAD\" is not a variable name"},
      {{"-np", "2", "-x", "KOLO_RANK=3", "cmd"}, "-x KOLO_RANK=3: kolorun sets KOLO_RANK itself"},
      {{"-np", "2", "-x", "KOLO_TEST_UNSET_VAR", "cmd"},
       "-x KOLO_TEST_UNSET_VAR: KOLO_TEST_UNSET_VAR is not set in kolorun's environment; give -x "
       "KOLO_TEST_UNSET_VAR=VALUE"},
      {{"-np", "2", "--wdir", "/no/such/dir", "cmd"}, "--wdir /no/such/dir: no such directory"},
      {{"-np", "2", "--network-interface", "eth0", "cmd"}, "--rpc-listen"},
      {{"-np", "2", "--slots-per-host", "2", "cmd"}, "host:N"},
      {{"-np", "2", "--blacklist-cooldown-range", "1", "2", "cmd"}, "--max-restarts"},
      {{"-np", "2", "--reset-limit", "3", "cmd"}, "--max-restarts"},
      {{"-np", "2", "--thread-affinity", "1", "cmd"}, "numactl"},
      {{"-np", "2", "--gloo-timeout-seconds", "30", "cmd"}, "KOLO_OP_TIMEOUT"},
      {{"-np", "2", "--gloo", "cmd"}, "no Gloo"},
      // An unknown flag is an error, never help (exit 0 without running).
      {{"-np", "1", "-hostfilex", "f", "true"}, "unknown option -hostfilex"},
      {{"-np", "1", "-hx", "true"}, "unknown option -hx"},
      {{"-np", "1", "--no-such-flag", "true"}, "--no-such-flag"},
  };
  for (const Case& c : cases) {
    auto o = parse(c.args);
    ASSERT_FALSE(o.isOk()) << "accepted: " << ::testing::PrintToString(c.args);
    EXPECT_NE(o.status().message().find(c.message), std::string::npos)
        << ::testing::PrintToString(c.args) << " -> " << o.status().message();
  }
}

}  // namespace
}  // namespace kolo::cli
