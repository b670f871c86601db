// Elastic jobs end to end (real coordinator, agents and rank processes; see
// docs/elastic.md): a node lost with --min-np still met, a node added, a
// crashed trainer restarted, and a job that falls below --min-np. The rank
// program (kolo_elastic_check) checks every allreduce exactly against the
// world size of its generation and the final state against the step count.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;

const char* kLease = "1500";

ClusterOptions elasticCluster(int agents) {
  ClusterOptions o;
  o.agents = agents;
  o.coordinator_args = {"--lease-ms", kLease, "--heartbeat-interval-ms", "250"};
  return o;
}

std::map<std::string, std::string> elasticEnv(int min_np, int max_np, int timeout_s) {
  return {{"KOLO_MIN_NP", std::to_string(min_np)},
          {"KOLO_MAX_NP", std::to_string(max_np)},
          {"KOLO_ELASTIC_TIMEOUT", std::to_string(timeout_s)},
          {"KOLO_OP_TIMEOUT", "60"}};
}

Proc spawnRank(Cluster& c, const std::string& job, int world, int local_rank, int local_size, int agent,
               const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra,
               const std::string& tag) {
  auto env = c.rankEnv(job, "secret-" + job, world, local_rank, local_size, agent);
  for (auto& [k, v] : extra) env[k] = v;
  return spawnProcess(argv, env, c.dir() + "/" + job + "-" + tag + ".log");
}

long long wallMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The first "(wall_ms N)" after `key` in the output, or -1.
long long wallMsOf(const std::string& out, const std::string& key) {
  std::smatch m;
  std::regex re(key + "[^\n]*\\(wall_ms ([0-9]+)\\)");
  if (!std::regex_search(out, m, re)) return -1;
  return std::stoll(m[1]);
}

// Waits until the output of `p` contains `needle` (bounded).
bool waitForOutput(Proc& p, const std::string& needle, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (p.output().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);  // polling a log file
  }
  return false;
}

std::string logsOf(Cluster& c, int agents, const std::vector<Proc*>& ranks) {
  std::string s = allLogs(c, agents) + "\n--- coordinator\n" + c.coordinator().output();
  for (size_t i = 0; i < ranks.size(); ++i) s += "\n--- rank proc " + std::to_string(i) + "\n" + ranks[i]->output();
  return s;
}

std::vector<std::string> checkArgv(int steps, int step_ms) {
  return {binDir() + "/kolo_elastic_check", std::to_string(steps), std::to_string(step_ms)};
}

TEST(ElasticTest, NodeLostWithMinNpMetTrainingContinuesAndFinishes) {
  Cluster c(elasticCluster(3));
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string job = "el-lost";
  auto env = elasticEnv(2, 3, 20);
  auto argv = checkArgv(150, 20);
  std::vector<Proc> ranks;
  for (int a = 0; a < 3; ++a) ranks.push_back(spawnRank(c, job, 3, 0, 1, a, argv, env, "a" + std::to_string(a)));
  std::vector<Proc*> all = {&ranks[0], &ranks[1], &ranks[2]};
  ASSERT_TRUE(waitForOutput(ranks[0], "started rank", 20s)) << logsOf(c, 3, all);
  std::this_thread::sleep_for(1s);  // mid-training (150 steps take >= 3 s)

  // The node of agent 0 (rank 0: the state's source moves to another rank) dies.
  long long killed_at = wallMsNow();
  killProcess(c.agent(0), SIGKILL);
  killProcess(ranks[0], SIGKILL);

  for (int r = 1; r < 3; ++r) {
    ASSERT_TRUE(waitProcess(ranks[r], 60s)) << logsOf(c, 3, all);
    std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << logsOf(c, 3, all);
    EXPECT_NE(out.find("size 2 step 150"), std::string::npos) << out;
    long long changed = wallMsOf(out, "membership changed");
    long long recovered = wallMsOf(out, "recovered in");
    ASSERT_GT(changed, 0) << out;
    ASSERT_GT(recovered, 0) << out;
    std::printf("[elastic] node lost: first MEMBERSHIP_CHANGED %lld ms after the kill, training again %lld ms "
                "after it (lease %s ms)\n",
                changed - killed_at, recovered - killed_at, kLease);
    EXPECT_LT(recovered - killed_at, 15000) << out;
  }
  std::string coord = c.coordinator().output();
  EXPECT_NE(coord.find("agent node0 (host node0) lost"), std::string::npos) << coord;
  EXPECT_NE(coord.find("generation 2 sealed, 2 agents, 2 ranks"), std::string::npos) << coord;
}

TEST(ElasticTest, NodeLostDownToOneAgentGoesOnWithoutCrossAgentTraffic) {
  Cluster c(elasticCluster(2));
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string job = "el-one";
  auto env = elasticEnv(2, 4, 20);
  auto argv = checkArgv(150, 20);
  std::vector<Proc> ranks;
  for (int a = 0; a < 2; ++a) {
    for (int l = 0; l < 2; ++l) {
      ranks.push_back(spawnRank(c, job, 4, l, 2, a, argv, env, "a" + std::to_string(a) + "-l" + std::to_string(l)));
    }
  }
  std::vector<Proc*> all = {&ranks[0], &ranks[1], &ranks[2], &ranks[3]};
  ASSERT_TRUE(waitForOutput(ranks[0], "started rank", 20s)) << logsOf(c, 2, all);
  std::this_thread::sleep_for(1s);
  killProcess(c.agent(1), SIGKILL);
  killProcess(ranks[2], SIGKILL);
  killProcess(ranks[3], SIGKILL);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(waitProcess(ranks[r], 60s)) << logsOf(c, 2, all);
    EXPECT_EQ(ranks[r].exit_code, 0) << logsOf(c, 2, all);
    EXPECT_NE(ranks[r].output().find("size 2 step 150"), std::string::npos) << ranks[r].output();
  }
  // The agent finished the job cleanly: nothing of generation 1 was left
  // behind. It reports the end to the coordinator after the ranks' exits
  // reach it, so the coordinator may log it a little after they exit.
  EXPECT_TRUE(waitForOutput(c.coordinator(), "job el-one FINISHED (generation 2)", 10s)) << c.coordinator().output();
  std::string coord = c.coordinator().output();
  EXPECT_NE(coord.find("generation 2 sealed, 1 agents, 2 ranks"), std::string::npos) << coord;
}

TEST(ElasticTest, AddedNodeJoinsAtTheNextCommit) {
  Cluster c(elasticCluster(3));
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string job = "el-add";
  auto env = elasticEnv(2, 3, 20);
  auto argv = checkArgv(200, 20);
  std::vector<Proc> ranks;
  for (int a = 0; a < 2; ++a) ranks.push_back(spawnRank(c, job, 2, 0, 1, a, argv, env, "a" + std::to_string(a)));
  ASSERT_TRUE(waitForOutput(ranks[0], "started rank", 20s));
  std::this_thread::sleep_for(1s);
  long long added_at = wallMsNow();
  ranks.push_back(spawnRank(c, job, 3, 0, 1, 2, argv, env, "a2"));
  std::vector<Proc*> all = {&ranks[0], &ranks[1], &ranks[2]};
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(waitProcess(ranks[r], 60s)) << logsOf(c, 3, all);
    EXPECT_EQ(ranks[r].exit_code, 0) << logsOf(c, 3, all);
    EXPECT_NE(ranks[r].output().find("size 3 step 200"), std::string::npos) << ranks[r].output();
  }
  // The veterans saw the change and synced; the newcomer started at rank 2.
  EXPECT_NE(ranks[0].output().find("membership changed"), std::string::npos) << ranks[0].output();
  EXPECT_NE(ranks[2].output().find("started rank 2 size 3"), std::string::npos) << ranks[2].output();
  long long recovered = wallMsOf(ranks[0].output(), "recovered in");
  ASSERT_GT(recovered, 0) << ranks[0].output();
  std::printf("[elastic] node added: training with 3 ranks %lld ms after the new rank was started\n",
              recovered - added_at);
  std::string coord = c.coordinator().output();
  // Admitted at the veterans' next commit (every 10 steps), not mid-step:
  // what they lose is at most the step after that commit.
  EXPECT_NE(coord.find("agent node2 (host node2) joined with 1 ranks (at a commit)"), std::string::npos) << coord;
  for (int r = 0; r < 2; ++r) {
    std::smatch m;
    std::string out = ranks[r].output();
    ASSERT_TRUE(std::regex_search(out, m, std::regex("membership changed at (?:step|commit) ([0-9]+)"))) << out;
    // At the commit's step, or the step right after it when the new
    // generation reaches the rank just after its commit completed.
    EXPECT_LE(std::stoi(m[1]) % 10, 1) << out;
  }
}

TEST(ElasticTest, CrashedTrainerRestartsAndRejoinsWithoutRestartingTheOthers) {
  Cluster c(elasticCluster(2));
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string job = "el-restart";
  auto env = elasticEnv(3, 3, 20);
  auto argv = checkArgv(150, 20);
  std::vector<Proc> ranks;
  ranks.push_back(spawnRank(c, job, 3, 0, 2, 0, argv, env, "a0-l0"));
  ranks.push_back(spawnRank(c, job, 3, 1, 2, 0, argv, env, "a0-l1"));
  ranks.push_back(spawnRank(c, job, 3, 0, 1, 1, argv, env, "a1-l0"));
  ASSERT_TRUE(waitForOutput(ranks[1], "started rank", 20s));
  std::this_thread::sleep_for(1s);
  long long killed_at = wallMsNow();
  killProcess(ranks[1], SIGKILL);
  ASSERT_TRUE(waitProcess(ranks[1], 10s));
  Proc again = spawnRank(c, job, 3, 1, 2, 0, argv, env, "a0-l1-again");
  std::vector<Proc*> all = {&ranks[0], &again, &ranks[2]};
  for (Proc* p : all) {
    ASSERT_TRUE(waitProcess(*p, 60s)) << logsOf(c, 2, all);
    EXPECT_EQ(p->exit_code, 0) << logsOf(c, 2, all);
    EXPECT_NE(p->output().find("size 3 step 150"), std::string::npos) << p->output();
  }
  EXPECT_NE(again.output().find("started rank 1 size 3"), std::string::npos) << again.output();
  long long recovered = wallMsOf(ranks[2].output(), "recovered in");
  ASSERT_GT(recovered, 0) << ranks[2].output();
  std::printf("[elastic] trainer restarted: training again %lld ms after the kill (restart at once)\n",
              recovered - killed_at);
  std::string coord = c.coordinator().output();
  EXPECT_NE(coord.find("without shutting down"), std::string::npos) << coord;
}

TEST(ElasticTest, BelowMinNpWaitsForTheElasticTimeoutThenFails) {
  Cluster c(elasticCluster(2));
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string job = "el-below";
  auto env = elasticEnv(2, 2, 3);
  auto argv = checkArgv(100000, 20);
  std::vector<Proc> ranks;
  for (int a = 0; a < 2; ++a) ranks.push_back(spawnRank(c, job, 2, 0, 1, a, argv, env, "a" + std::to_string(a)));
  ASSERT_TRUE(waitForOutput(ranks[0], "started rank", 20s));
  std::this_thread::sleep_for(1s);
  auto killed = std::chrono::steady_clock::now();
  killProcess(c.agent(1), SIGKILL);
  killProcess(ranks[1], SIGKILL);
  std::vector<Proc*> all = {&ranks[0]};
  ASSERT_TRUE(waitProcess(ranks[0], 30s)) << logsOf(c, 2, all);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::string out = ranks[0].output();
  EXPECT_EQ(ranks[0].exit_code, 3) << out;
  EXPECT_NE(out.find("KOLO_ERR_PEER_FAILURE"), std::string::npos) << out;
  EXPECT_NE(out.find("job el-below: 1 rank left, below --min-np 2, for 3 s"), std::string::npos) << out;
  std::printf("[elastic] below --min-np: the rank failed %.2f s after the kill (lease %s ms + timeout 3 s)\n",
              waited, kLease);
  EXPECT_GE(waited, 3.0);
  EXPECT_LT(waited, 12.0);
}

// kolorun's elastic mode: hosts from a discovery script that cats a file the
// test edits (each host is one embedded agent on this machine).
struct KolorunElastic {
  std::string dir;
  KolorunElastic() {
    char tmpl[] = "/tmp/kolo-elastic-XXXXXX";
    dir = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
  }
  ~KolorunElastic() {
    if (!dir.empty() && std::getenv("KOLO_TEST_KEEP") == nullptr) std::filesystem::remove_all(dir);
  }
  void writeHosts(const std::string& text) const {
    std::string tmp = dir + "/hosts.tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, dir + "/hosts");
  }
  std::string script() const {
    std::string path = dir + "/discover.sh";
    std::ofstream(path) << "#!/bin/sh\ncat " << dir << "/hosts\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path;
  }
};

TEST(KolorunElasticTest, HostsComeAndGoAndACrashedRankIsRestarted) {
  KolorunElastic k;
  ASSERT_FALSE(k.dir.empty());
  k.writeHosts("hostA:2\nhostB:1\nhostC:1\n");
  std::string crash = k.dir + "/crash-once";
  std::ofstream(crash) << "x";
  Proc run = spawnProcess({binDir() + "/kolorun", "-np", "4", "--min-np", "2", "--max-np", "5",
                           "--host-discovery-script", k.script(), binDir() + "/kolo_elastic_check", "300", "20"},
                          {{"ELASTIC_CRASH_ONCE", crash}, {"ELASTIC_CRASH_RANK", "1"}}, k.dir + "/kolorun.log");
  ASSERT_TRUE(waitForOutput(run, "started rank", 30s)) << run.output();
  std::this_thread::sleep_for(1500ms);
  k.writeHosts("hostA:2\nhostB:1\nhostD:1\n");  // hostC leaves, hostD arrives
  ASSERT_TRUE(waitProcess(run, 90s)) << run.output();
  std::string out = run.output();
  EXPECT_EQ(run.exit_code, 0) << out;
  EXPECT_NE(out.find("crashing at step 30"), std::string::npos) << out;
  EXPECT_NE(out.find("restarting it (restart 1 of 3)"), std::string::npos) << out;
  EXPECT_NE(out.find("host hostC is gone from the discovered hosts"), std::string::npos) << out;
  EXPECT_NE(out.find("host hostD discovered: starting 1 rank(s) there"), std::string::npos) << out;
  // Every rank that ended the job did so at the same step with the same world.
  std::regex ok_re("elastic ok rank ([0-9]+) size 4 step 300");
  std::set<std::string> finished;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), ok_re); it != std::sregex_iterator(); ++it) {
    finished.insert((*it)[1]);
  }
  EXPECT_EQ(finished, (std::set<std::string>{"0", "1", "2", "3"})) << out;
  EXPECT_NE(out.find("4 rank(s) succeeded, 0 failed"), std::string::npos) << out;
}

TEST(KolorunElasticTest, BelowMinNpTheJobFailsAfterTheElasticTimeout) {
  KolorunElastic k;
  ASSERT_FALSE(k.dir.empty());
  k.writeHosts("hostA:1\nhostB:1\n");
  // The default --max-restarts (3): below --min-np the failed rank is not
  // restarted into the FAILED job.
  Proc run = spawnProcess(
      {binDir() + "/kolorun", "-np", "2", "--min-np", "2", "--elastic-timeout", "2",
       "--host-discovery-script", k.script(), binDir() + "/kolo_elastic_check", "100000", "20"},
      {}, k.dir + "/kolorun.log");
  ASSERT_TRUE(waitForOutput(run, "started rank", 30s)) << run.output();
  std::this_thread::sleep_for(1s);
  auto removed = std::chrono::steady_clock::now();
  k.writeHosts("hostA:1\n");
  ASSERT_TRUE(waitProcess(run, 40s)) << run.output();
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - removed).count();
  std::string out = run.output();
  EXPECT_EQ(run.exit_code, 3) << out;
  EXPECT_NE(out.find("1 rank left, below --min-np 2, for 2 s"), std::string::npos) << out;
  EXPECT_NE(out.find("the job has 1 rank(s) on its hosts, below --min-np 2, so it failed (or "
                     "cannot go on): not "
                     "restarting it; stopping the job"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("restarting it (restart"), std::string::npos) << out;
  EXPECT_GE(took, 2.0) << out;
  EXPECT_LT(took, 15.0) << out;
  std::printf("[elastic] kolorun below --min-np: exit %.2f s after the host was removed (timeout 2 s)\n", took);
}

}  // namespace
}  // namespace kolo::testing

namespace kolo::testing {
namespace {

bool mountNamespacesWork() { return std::system("unshare -m true >/dev/null 2>&1") == 0; }

// Horovod's elastic mode on fixed hosts (-H): two "hosts", each with its own
// kolo-agent (a real coordinator and agents, as on two machines), reached
// through kolorun's ssh stand-in, which gives every host its own view of the
// one --agent-socket path (a mount namespace binds ROOT/hostX at ROOT/host).
// A crashed rank on hostB is restarted over ssh and rejoins the job.
TEST(KolorunElasticTest, FixedHostsOverSshTrainAndRestartACrashedRank) {
  if (!mountNamespacesWork())
    GTEST_SKIP() << "needs mount namespaces (root) for the ssh stand-in's hosts";
  Cluster c(elasticCluster(2));
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string root = c.dir() + "/hosts";
  for (const char* d : {"hostA", "hostB", "host"})
    std::filesystem::create_directories(root + "/" + d);
  std::filesystem::create_symlink(c.socket(0), root + "/hostA/agent.sock");
  std::filesystem::create_symlink(c.socket(1), root + "/hostB/agent.sock");
  const std::string crash = c.dir() + "/crash-once";
  std::ofstream(crash) << "x";
  const std::string ssh_log = c.dir() + "/ssh-argv.log";
  const char* path = std::getenv("PATH");
  Proc run =
      spawnProcess({binDir() + "/kolorun", "-np", "2", "--min-np", "1", "-H", "hostA:1,hostB:1",
                    "--agent-socket", root + "/host/agent.sock", "-x", "ELASTIC_CRASH_ONCE", "-x",
                    "ELASTIC_CRASH_RANK", binDir() + "/kolo_elastic_check", "200", "20"},
                   {{"PATH", std::string(KOLO_SSH_STANDIN_DIR) + ":" +
                                 (path != nullptr ? path : "/usr/bin:/bin")},
                    {"FAKE_SSH_ROOT", root},
                    {"FAKE_SSH_LOG", ssh_log},
                    {"KOLO_COORDINATOR", c.coordinatorAddress()},
                    {"ELASTIC_CRASH_ONCE", crash},
                    {"ELASTIC_CRASH_RANK", "1"}},
                   c.dir() + "/kolorun.log");
  ASSERT_TRUE(waitProcess(run, 120s)) << run.output() << logsOf(c, 2, {});
  const std::string out = run.output();
  EXPECT_EQ(run.exit_code, 0) << out << logsOf(c, 2, {});
  EXPECT_NE(out.find("2 rank(s) on 2 host(s), --min-np 1; the hosts' kolo-agents at " + root +
                     "/host/agent.sock (remote ones over ssh)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("crashing at step 30 (rank 1)"), std::string::npos) << out;
  std::smatch crashed;
  ASSERT_TRUE(std::regex_search(
      out, crashed,
      std::regex("rank [01] \\(host (host[AB]), local rank 0\\) [^\n]*; restarting it "
                 "\\(restart 1 of 3\\)")))
      << out;
  std::regex ok_re("elastic ok rank ([0-9]+) size 2 step 200");
  std::set<std::string> finished;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), ok_re); it != std::sregex_iterator();
       ++it) {
    finished.insert((*it)[1]);
  }
  EXPECT_EQ(finished, (std::set<std::string>{"0", "1"})) << out << logsOf(c, 2, {});
  // Each host's ranks ran through ssh, the crashed one's host twice (the restart).
  std::ifstream f(ssh_log);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string argv_log = ss.str();
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t p = argv_log.find(needle); p != std::string::npos; p = argv_log.find(needle, p + 1))
      ++n;
    return n;
  };
  const std::string again = crashed[1].str();
  const std::string once = again == "hostA" ? "hostB" : "hostA";
  EXPECT_EQ(count("BatchMode=yes\n" + again + "\nsh\n-c\n"), 2u) << argv_log;
  EXPECT_EQ(count("BatchMode=yes\n" + once + "\nsh\n-c\n"), 1u) << argv_log;
  // Each "host"'s rank reached that host's agent.
  EXPECT_NE(c.agentLog(0).find("job-"), std::string::npos) << c.agentLog(0);
  EXPECT_NE(c.agentLog(1).find("job-"), std::string::npos) << c.agentLog(1);
}

}  // namespace
}  // namespace kolo::testing
