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

}  // namespace
}  // namespace kolo::cli
