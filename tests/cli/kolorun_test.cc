// kolorun end to end: the real kolorun binary with the real kolo-agent and
// kolo-coordinator (embedded mode) when they are built (KOLO_TEST_REAL_DAEMONS),
// else with the stand-in script; ranks are plain shell commands.
// Daemon failures are provoked with the stand-in agent.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

#include "common/unix_socket.h"
#include "test_process.h"

namespace kolo::clitest {
namespace {

class KolorunTest : public ::testing::Test {
 protected:
  // Runs in embedded mode: no agent at the socket; TMPDIR is our temp dir so
  // we can see kolorun's private directory come and go.
  std::map<std::string, std::string> env(std::map<std::string, std::string> extra = {}) const {
    // No socket named, and no system agent where kolorun looks for one.
    std::map<std::string, std::string> e = {
        {"TMPDIR", tmp_.path()}, {"KOLORUN_SYSTEM_AGENT_SOCKET", tmp_.path() + "/no-agent.sock"}};
    if (!KOLO_TEST_REAL_DAEMONS) {
      e["KOLO_AGENT_BIN"] = standinDaemon();
      e["KOLO_COORDINATOR_BIN"] = standinDaemon();
    }
    for (auto& [k, v] : extra) e[k] = v;
    return e;
  }
  // Variables that would change how kolorun finds its daemons.
  std::vector<std::string> unset() const {
    if (!KOLO_TEST_REAL_DAEMONS) return {"KOLO_AGENT_SOCKET"};
    return {"KOLO_AGENT_SOCKET", "KOLO_AGENT_BIN", "KOLO_COORDINATOR_BIN"};
  }
  std::vector<std::string> kolorun(std::vector<std::string> args) const {
    args.insert(args.begin(), binDir() + "/kolorun");
    return args;
  }
  std::string fifo(const std::string& name) const {
    std::string p = tmp_.path() + "/" + name;
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    return p;
  }
  // kolorun's private directories left in TMPDIR.
  std::vector<std::string> leftovers() const {
    std::vector<std::string> out;
    for (auto& n : tmp_.list()) {
      if (n.rfind("kolorun-", 0) == 0) out.push_back(n);
    }
    return out;
  }

  TempDir tmp_;
};

TEST_F(KolorunTest, PrefixesEveryLineAndSucceeds) {
  auto r = runCommand(kolorun({"-np", "3", "--", "sh", "-c",
                               "echo hi $KOLO_RANK; echo oops $KOLO_RANK >&2; printf 'no newline'"}),
                      env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string n = std::to_string(rank);
    EXPECT_NE(r.out.find("[" + n + "]<stdout>:hi " + n + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[" + n + "]<stdout>:no newline\n"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("[" + n + "]<stderr>:oops " + n + "\n"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(std::regex_search(r.err, std::regex("kolorun: 3 ranks finished in [0-9.]+ s, all succeeded")))
      << r.err;
  EXPECT_EQ(r.err.find("exited with"), std::string::npos) << "no per-rank summary without --verbose: " << r.err;
  EXPECT_TRUE(leftovers().empty()) << "the private directory was not removed";
}

TEST_F(KolorunTest, EachRankGetsItsEnvironment) {
  std::string script =
      "echo \"env $KOLO_RANK $KOLO_SIZE $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_CROSS_RANK $KOLO_CROSS_SIZE "
      "$HOROVOD_RANK $HOROVOD_SIZE $HOROVOD_LOCAL_RANK $KOLO_START_TIMEOUT $KOLO_FUSION_THRESHOLD_MB "
      "$KOLO_JOB_ID $KOLO_JOB_TOKEN $KOLO_AGENT_SOCKET $KOLO_AGENT_RPC $KOLO_COORDINATOR\"";
  if (KOLO_TEST_REAL_DAEMONS) script += "; test -S \"$KOLO_AGENT_SOCKET\" || echo no socket";
  auto r = runCommand(kolorun({"-np", "5", "--agents", "2", "--start-timeout", "40", "--fusion-threshold-mb", "16",
                               "sh", "-c", script}),
                      env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("no socket"), std::string::npos) << r.out;
  // rank: local_rank local_size cross_rank cross_size, for blocks {3, 2}.
  const int want[5][4] = {{0, 3, 0, 2}, {1, 3, 0, 2}, {2, 3, 0, 1}, {0, 2, 1, 2}, {1, 2, 1, 2}};
  std::set<std::string> job_ids, tokens, sockets[2];
  for (int rank = 0; rank < 5; ++rank) {
    std::smatch m;
    std::regex line("\\[" + std::to_string(rank) + "\\]<stdout>:env (.*)\n");
    ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out;
    std::istringstream in(m[1].str());
    std::vector<std::string> f{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
    ASSERT_EQ(f.size(), 16u) << m[1];
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + m[1].str());
    EXPECT_EQ(f[0], std::to_string(rank));
    EXPECT_EQ(f[1], "5");
    EXPECT_EQ(f[2], std::to_string(want[rank][0]));
    EXPECT_EQ(f[3], std::to_string(want[rank][1]));
    EXPECT_EQ(f[4], std::to_string(want[rank][2]));
    EXPECT_EQ(f[5], std::to_string(want[rank][3]));
    EXPECT_EQ(f[6], std::to_string(rank));
    EXPECT_EQ(f[7], "5");
    EXPECT_EQ(f[8], std::to_string(want[rank][0]));
    EXPECT_EQ(f[9], "40");
    EXPECT_EQ(f[10], "16");
    EXPECT_TRUE(std::regex_match(f[11], std::regex("job-[0-9a-f]{12}")));
    EXPECT_TRUE(std::regex_match(f[12], std::regex("[0-9a-f]{32}")));
    EXPECT_TRUE(std::regex_match(f[13], std::regex(".*/kolorun-[^/]+/agent-" + std::to_string(rank < 3 ? 0 : 1) +
                                                   "\\.sock")));
    EXPECT_TRUE(std::regex_match(f[14], std::regex("127\\.0\\.0\\.1:[0-9]+")));
    EXPECT_TRUE(std::regex_match(f[15], std::regex("127\\.0\\.0\\.1:[0-9]+")));
    job_ids.insert(f[11]);
    tokens.insert(f[12]);
    sockets[rank < 3 ? 0 : 1].insert(f[13] + " " + f[14]);
  }
  EXPECT_EQ(job_ids.size(), 1u);
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_EQ(sockets[0].size(), 1u);
  EXPECT_EQ(sockets[1].size(), 1u);
  EXPECT_NE(*sockets[0].begin(), *sockets[1].begin());
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(KolorunTest, FailingRankStopsTheOthersAndSetsTheExitCode) {
  // Ranks 0 and 2 hand their pids to rank 1 through FIFOs (blocking, no
  // timing), then sleep; rank 1 prints them and exits 3.
  std::string f0 = fifo("pid.0"), f2 = fifo("pid.2");
  std::string script = "if [ $KOLO_RANK = 1 ]; then read a < " + f0 + "; read b < " + f2 +
                       "; echo pids $a $b; exit 3; fi; echo $$ > " + tmp_.path() +
                       "/pid.$KOLO_RANK; exec sleep 1000";
  TestProcess p(kolorun({"-np", "3", "sh", "-c", script}), env(), unset());
  ASSERT_TRUE(p.waitForStdout("[1]<stdout>:pids ", 60s)) << p.out() << p.err();
  // kolorun writes each prefixed line with one write(): it is complete.
  std::smatch m;
  std::string out = p.out();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("\\[1\\]<stdout>:pids ([0-9]+) ([0-9]+)\n"))) << out;
  pid_t a = std::stoi(m[1]), b = std::stoi(m[2]);
  EXPECT_TRUE(waitProcessGone(a, 7s)) << "rank 0 still runs 7 s after rank 1 failed";
  EXPECT_TRUE(waitProcessGone(b, 7s)) << "rank 2 still runs 7 s after rank 1 failed";
  ASSERT_EQ(p.wait(30s), 3) << p.err();
  EXPECT_NE(p.err().find("kolorun: rank 1 exited with code 3\n"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("rank 0 was killed by signal SIGTERM"), std::string::npos) << p.err();
  EXPECT_TRUE(std::regex_search(p.err(), std::regex("3 ranks finished in [0-9.]+ s, rank 1 failed \\(exited with code 3\\)")))
      << p.err();
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(KolorunTest, RankIgnoringSigtermIsKilledAfterTheGrace) {
  std::string f = fifo("ready");
  std::string script = "if [ $KOLO_RANK = 0 ]; then trap '' TERM; echo x > " + f +
                       "; exec sleep 1000; fi; read x < " + f + "; exit 1";
  TestProcess p(kolorun({"-np", "2", "sh", "-c", script}), env(), unset());
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(p.wait(60s), 1) << p.err();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 30s);
  EXPECT_NE(p.err().find("kolorun: rank 1 exited with code 1"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("rank(s) 0 did not stop within 5.0 s; sending SIGKILL"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("rank 0 was killed by signal SIGKILL"), std::string::npos) << p.err();
}

TEST_F(KolorunTest, SigtermToKolorunEndsEverything) {
  TestProcess p(kolorun({"-np", "2", "sh", "-c", "echo up $$; exec sleep 1000"}), env(), unset());
  ASSERT_TRUE(p.waitForStdout("[0]<stdout>:up ", 60s)) << p.err();
  ASSERT_TRUE(p.waitForStdout("[1]<stdout>:up ", 60s)) << p.err();
  std::vector<pid_t> pids;
  std::string out = p.out();
  const std::regex up("<stdout>:up ([0-9]+)\n");
  for (std::sregex_iterator it(out.begin(), out.end(), up), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  p.signal(SIGTERM);
  ASSERT_EQ(p.wait(30s), 128 + SIGTERM) << p.err();
  for (pid_t pid : pids) EXPECT_TRUE(waitProcessGone(pid, 1s)) << "rank pid " << pid << " survived";
  EXPECT_NE(p.err().find("kolorun: got SIGTERM; stopping the ranks"), std::string::npos) << p.err();
  EXPECT_TRUE(std::regex_search(p.err(), std::regex("2 ranks finished in [0-9.]+ s, stopped by SIGTERM"))) << p.err();
  EXPECT_TRUE(leftovers().empty()) << "the private directory was not removed";
}

// The direct children of `pid` (from /proc/*/stat).
std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

TEST_F(KolorunTest, Kill9OfKolorunTakesRanksGrandchildrenDaemonsAndTempDirWithIt) {
  // Each rank is a shell wrapper whose real work is a grandchild of kolorun.
  TestProcess p(kolorun({"-np", "2", "sh", "-c", "sleep 1000 & echo up $$ $!; wait"}), env(),
                unset());
  ASSERT_TRUE(p.waitForStdout("[0]<stdout>:up ", 60s)) << p.err();
  ASSERT_TRUE(p.waitForStdout("[1]<stdout>:up ", 60s)) << p.err();
  std::vector<pid_t> pids = childrenOf(p.pid());  // ranks, daemons, the reaper
  ASSERT_GE(pids.size(), 3u);
  std::string out = p.out();
  const std::regex up("<stdout>:up ([0-9]+) ([0-9]+)\n");
  int grandchildren = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), up), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[2]));
    ++grandchildren;
  }
  ASSERT_EQ(grandchildren, 2) << out;
  ASSERT_EQ(leftovers().size(), 1u);
  ::kill(p.pid(), SIGKILL);
  ASSERT_EQ(p.wait(10s), 128 + SIGKILL);
  for (pid_t pid : pids)
    EXPECT_TRUE(waitProcessGone(pid, 5s)) << "pid " << pid << " survived kill -9 of kolorun";
  EXPECT_TRUE(leftovers().empty()) << "the private directory survived kill -9 of kolorun";
}

TEST_F(KolorunTest, NoSystemAgentFallsBackToPrivateDaemonsWithOneLine) {
  auto r = runCommand(kolorun({"-np", "1", "true"}), env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(
                "kolorun: no kolo-agent at " + tmp_.path() +
                "/no-agent.sock (no such file); starting a private kolo-coordinator and kolo-agent "
                "for this job\n"),
            std::string::npos)
      << r.err;
}

TEST_F(KolorunTest, NamedSocketThatCannotBeOpenedIsAnErrorThatSaysWhy) {
  const std::string missing = tmp_.path() + "/missing.sock";
  auto r = runCommand(kolorun({"-np", "1", "true"}), env({{"KOLO_AGENT_SOCKET", missing}}), 60s,
                      {"KOLO_AGENT_BIN", "KOLO_COORDINATOR_BIN"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("kolorun: cannot use the kolo-agent socket " + missing +
                       " (named by KOLO_AGENT_SOCKET): no such file"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("starting a private"), std::string::npos) << r.err;

  // A socket file nobody listens on (a stale one).
  const std::string stale = tmp_.path() + "/stale.sock";
  {
    auto fd = listenUnix(stale, 0600, "");
    ASSERT_TRUE(fd.isOk());
  }
  r = runCommand(kolorun({"-np", "1", "--agent-socket", stale, "true"}), env(), 60s, unset());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("kolorun: cannot use the kolo-agent socket " + stale +
                       " (named by --agent-socket): nothing is listening"),
            std::string::npos)
      << r.err;

  // Permission: a socket in a directory kolorun may not enter. As root,
  // kolorun runs as nobody (setpriv) and the directory is root's, mode 0700.
  const std::string dir = tmp_.path() + "/locked";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  auto fd = listenUnix(dir + "/agent.sock", 0600, "");
  ASSERT_TRUE(fd.isOk());
  std::vector<std::string> argv = kolorun({"-np", "1", "true"});
  if (::geteuid() == 0) {
    ASSERT_EQ(::chmod(tmp_.path().c_str(), 0711), 0);
    argv.insert(argv.begin(),
                {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"});
  } else {
    ASSERT_EQ(::chmod(dir.c_str(), 0), 0);
  }
  r = runCommand(argv, env({{"KOLORUN_SYSTEM_AGENT_SOCKET", dir + "/agent.sock"}}), 60s, unset());
  ::chmod(dir.c_str(), 0700);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(
      r.err.find("kolorun: the kolo-agent socket " + dir +
                 "/agent.sock exists but cannot be opened: permission denied: cannot enter " + dir),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("and log in again"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("starting a private"), std::string::npos) << r.err;
}

TEST_F(KolorunTest, SigintIsForwardedToTheRanks) {
  TestProcess p(kolorun({"-np", "2", "sh", "-c", "trap 'echo got INT; exit 7' INT; echo up; sleep 1000 & wait"}),
                env(), unset());
  ASSERT_TRUE(p.waitForStdout("[0]<stdout>:up", 60s)) << p.err();
  ASSERT_TRUE(p.waitForStdout("[1]<stdout>:up", 60s)) << p.err();
  p.signal(SIGINT);
  ASSERT_EQ(p.wait(30s), 128 + SIGINT) << p.err();
  EXPECT_NE(p.out().find("[0]<stdout>:got INT"), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("[1]<stdout>:got INT"), std::string::npos) << p.out();
  EXPECT_NE(p.err().find("rank 0 exited with code 7"), std::string::npos) << p.err();
}

TEST_F(KolorunTest, MissingCommandIsReported) {
  auto r = runCommand(kolorun({"-np", "2", "/no/such/program", "arg"}), env(), 60s, unset());
  EXPECT_EQ(r.code, 127) << r.err;
  EXPECT_NE(r.err.find("cannot run '/no/such/program': No such file or directory"), std::string::npos) << r.err;
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(KolorunTest, OutputFilenameWritesHorovodsLayout) {
  // Issue 45: DIR/rank.N/stdout and DIR/rank.N/stderr, N zero-padded to the
  // width of the last rank (11 ranks: rank.00 .. rank.10), as horovodrun.
  std::string dir = tmp_.path() + "/out";
  auto r = runCommand(kolorun({"-np", "11", "--output-filename", dir, "sh", "-c",
                               "echo a$KOLO_RANK; echo b$KOLO_RANK >&2"}),
                      env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.err;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  for (int rank : {0, 7, 10}) {
    std::string n = (rank < 10 ? "0" : "") + std::to_string(rank);
    EXPECT_EQ(read(dir + "/rank." + n + "/stdout"), "a" + std::to_string(rank) + "\n") << n;
    EXPECT_EQ(read(dir + "/rank." + n + "/stderr"), "b" + std::to_string(rank) + "\n") << n;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/rank.0")) << "the names are padded";
}

TEST_F(KolorunTest, VerbosePrintsThePlanAndASummaryPerRank) {
  auto r = runCommand(kolorun({"-np", "2", "--verbose", "true"}), env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("starting a private kolo-coordinator and kolo-agent"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("node 0 (node0) on localhost: ranks 0,1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 0 exited with code 0 after"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 1 exited with code 0 after"), std::string::npos) << r.err;
}

TEST_F(KolorunTest, UsesAReachableSystemAgent) {
  // Something listening at the socket is taken as the node's agent: no
  // daemon is started (the daemon paths point nowhere to prove it).
  std::string sock = tmp_.path() + "/agent.sock";
  auto listener = listenUnix(sock, 0600, "");
  ASSERT_TRUE(listener.isOk()) << listener.status().toString();
  auto e = env({{"KOLO_AGENT_SOCKET", sock},
                {"KOLO_AGENT_BIN", "/nonexistent"},
                {"KOLO_COORDINATOR_BIN", "/nonexistent"},
                {"KOLO_AGENT_RPC", "127.0.0.1:7999"}});
  auto r = runCommand(kolorun({"-np", "2", "--verbose", "sh", "-c", "echo $KOLO_AGENT_SOCKET $KOLO_AGENT_RPC"}), e,
                      60s);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("using the kolo-agent at " + sock), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[1]<stdout>:" + sock + " 127.0.0.1:7999\n"), std::string::npos) << r.out;
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(KolorunTest, AgentThatCrashesAtStartIsReportedWithItsLog) {
  auto e = env({{"KOLO_AGENT_BIN", standinDaemon()}, {"FAKE_AGENT_MODE", "crash"}});
  auto r = runCommand(kolorun({"-np", "2", "sh", "-c", "echo ran"}), e, 60s,
                      {"KOLO_COORDINATOR_BIN", "KOLO_AGENT_SOCKET"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out.find("ran"), std::string::npos) << "no rank may start: " << r.out;
  EXPECT_NE(r.err.find("kolorun: kolo-agent node0 exited with code 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("  fake-daemon: cannot bind the socket: boom"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("logs are kept in"), std::string::npos) << r.err;
  auto left = leftovers();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(std::ifstream(tmp_.path() + "/" + left[0] + "/agent-0.log").good());
}

TEST_F(KolorunTest, AgentThatNeverGetsReadyTimesOut) {
  auto e = env({{"KOLO_AGENT_BIN", standinDaemon()}, {"FAKE_AGENT_MODE", "hang"}});
  auto t0 = std::chrono::steady_clock::now();
  auto r = runCommand(kolorun({"-np", "1", "--start-timeout", "1", "true"}), e, 60s,
                      {"KOLO_COORDINATOR_BIN", "KOLO_AGENT_SOCKET"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("kolorun: kolo-agent node0 did not become ready within 1 s (--start-timeout)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("fake-daemon"), std::string::npos) << "the log tail is shown: " << r.err;
}

TEST_F(KolorunTest, AgentDyingDuringTheJobStopsIt) {
  // The stand-in's status "port" is its pid: rank 0 SIGKILLs its agent.
  auto e = env({{"KOLO_AGENT_BIN", standinDaemon()}});
  TestProcess p(kolorun({"-np", "2", "sh", "-c",
                         "if [ $KOLO_RANK = 0 ]; then kill -KILL ${KOLO_AGENT_RPC#127.0.0.1:}; fi; "
                         "exec sleep 1000"}),
                e, {"KOLO_COORDINATOR_BIN", "KOLO_AGENT_SOCKET"});
  ASSERT_EQ(p.wait(60s), 1) << p.err();
  EXPECT_NE(p.err().find("kolo-agent node0 was killed by signal SIGKILL unexpectedly"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("stopped because an embedded daemon failed"), std::string::npos) << p.err();
}

TEST_F(KolorunTest, MissingDaemonIsAClearError) {
  auto e = env({{"KOLO_AGENT_BIN", tmp_.path() + "/not-here"}});
  auto r = runCommand(kolorun({"-np", "1", "true"}), e, 60s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("KOLO_AGENT_BIN=" + tmp_.path() + "/not-here is not an executable file"), std::string::npos)
      << r.err;
}

TEST_F(KolorunTest, UsageErrorsExit2) {
  auto r = runCommand(kolorun({"--agents", "2", "true"}), env(), 30s);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("kolorun: -np N is required"), std::string::npos) << r.err;
  // Issue 45: what is wanted, not CLI11's "Value 0 not in range 0.000000 to 1797...".
  r = runCommand(kolorun({"-np", "0", "true"}), env(), 30s);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.err.find("kolorun: --np: must be a number greater than 0, got '0' (see kolorun --help)"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("not in range"), std::string::npos) << r.err;
}

#if KOLO_TEST_REAL_DAEMONS
TEST_F(KolorunTest, TwoAgentsOnOneMachineSplitItsCoresAndSoDoTheRanks) {
  // Each embedded agent's reduction pool gets its share of the cores, and
  // each rank's OMP_NUM_THREADS its share, unless the user set them.
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cpus = CPU_COUNT(&set);
  const std::string share = std::to_string(std::max(1, cpus / 2));
  const std::string script =
      "echo omp=$OMP_NUM_THREADS; ps -eo args= | grep -F -- \"--socket $KOLO_AGENT_SOCKET \" | "
      "grep -v grep | "
      "grep -o -- '--reduce-threads [0-9]*'";
  std::vector<std::string> none = unset();
  none.insert(none.end(), {"OMP_NUM_THREADS", "KOLO_REDUCE_THREADS"});
  auto r = runCommand(kolorun({"-np", "2", "--agents", "2", "sh", "-c", script}), env(), 60s, none);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "]<stdout>:";
    EXPECT_NE(r.out.find(p + "omp=" + std::to_string(std::max(1, cpus / 2)) + "\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(p + "--reduce-threads " + share + "\n"), std::string::npos) << r.out;
  }
  // The user's choice wins.
  r = runCommand(kolorun({"-np", "2", "--agents", "2", "sh", "-c", script + "; true"}),
                 env({{"OMP_NUM_THREADS", "3"}, {"KOLO_REDUCE_THREADS", "5"}}), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[0]<stdout>:omp=3\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--reduce-threads"), std::string::npos) << r.out;
}

TEST_F(KolorunTest, RanksSeeTheirEmbeddedAgentsThroughTheKoloCli) {
  // Each rank asks its own agent for its status, and rank 0 asks the
  // coordinator for the agents: the real daemons, end to end.
  std::string kolo = binDir() + "/kolo";
  std::string script = kolo + " status --json | grep '\"agent_id\"'; if [ $KOLO_RANK = 0 ]; then " + kolo +
                       " agents; fi";
  auto r = runCommand(kolorun({"-np", "4", "--agents", "2", "sh", "-c", script}), env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[0]<stdout>:  \"agent_id\": \"node0\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1]<stdout>:  \"agent_id\": \"node0\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[2]<stdout>:  \"agent_id\": \"node1\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[3]<stdout>:  \"agent_id\": \"node1\""), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\[0\\]<stdout>:node0 ")) &&
              std::regex_search(r.out, std::regex("\\[0\\]<stdout>:node1 ")))
      << r.out;
}

TEST_F(KolorunTest, TlsSettingsExportedForASharedCoordinatorDoNotReachThePrivateDaemons) {
  // Settings meant for a shared TLS coordinator and agents (files that do
  // not even exist here): the embedded daemons and `kolo` in the ranks must
  // ignore them, or the agents would stop at start and `kolo` would fail.
  auto e = env({{"KOLO_COORDINATOR_CA", "/no/such/ca.pem"},
                {"KOLO_COORDINATOR_TLS", "true"},
                {"KOLO_COORDINATOR_TOKEN_FILE", "/no/such/token"},
                {"KOLO_TLS_CERT", "/no/such/cert.pem"},
                {"KOLO_TLS_KEY", "/no/such/key.pem"},
                {"KOLO_AUTH_TOKEN_FILE", "/no/such/token"},
                {"KOLO_AGENT_CA", "/no/such/ca.pem"}});
  std::string kolo = binDir() + "/kolo";
  std::string script = kolo + " status --json | grep '\"agent_id\"'; if [ $KOLO_RANK = 0 ]; then " + kolo +
                       " agents; fi";
  auto r = runCommand(kolorun({"-np", "2", "--agents", "2", "sh", "-c", script}), e, 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[1]<stdout>:  \"agent_id\": \"node1\""), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\[0\\]<stdout>:node1 "))) << r.out;
}

TEST_F(KolorunTest, EmbeddedAgentsWriteHorovodTimelineInTheWorkingDirectory) {
  // HOROVOD_TIMELINE with a relative name, as under horovodrun: the file is
  // in the directory kolorun ran in (the embedded agents' timeline-dir).
  const std::string work = tmp_.path() + "/work";
  ASSERT_EQ(::mkdir(work.c_str(), 0700), 0);
  const std::string cmd = "cd '" + work + "' && exec '" + binDir() + "/kolorun' -np 1 true";
  auto r = runCommand({"sh", "-c", cmd}, env({{"HOROVOD_TIMELINE", "tl.json"}}), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream f(work + "/tl.json");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("traceEvents"), std::string::npos)
      << "no timeline in " << work << ": " << r.err;
}

TEST_F(KolorunTest, EmbeddedAgentsNeedTheirAdminTokenEvenFromLoopback) {
  // Their gRPC port is on loopback, which every user of the machine can
  // reach: Drain needs the token kolorun made (KOLO_AGENT_TOKEN_FILE in the
  // ranks, a 0600 file in kolorun's private directory).
  std::string kolo = binDir() + "/kolo";
  std::string script =
      "ls -l \"$KOLO_AGENT_TOKEN_FILE\" | cut -c1-10; KOLO_AGENT_TOKEN_FILE= " + kolo +
      " drain 2>&1; " + kolo + " drain";
  auto r = runCommand(kolorun({"-np", "1", "sh", "-c", script}), env(), 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[0]<stdout>:-rw-------\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refused the call: Drain needs a bearer token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is draining: it takes no new jobs"), std::string::npos) << r.out;
}
#endif

TEST_F(KolorunTest, RemoteRanksGetTheJobTokenOnStdinNeverOnTheSshCommandLine) {
  // standins/ssh (first on PATH) logs its arguments, as `ps` would show
  // them, and runs the remote command line here with its stdin.
  const std::string log = tmp_.path() + "/ssh-argv.log";
  const std::string standins = standinDaemon().substr(0, standinDaemon().rfind('/'));
  const char* path = std::getenv("PATH");
  auto r =
      runCommand(kolorun({"-np", "2", "-H", "kolo-fake-host-a:1,kolo-fake-host-b:1", "--", "sh",
                          "-c", "echo token=$KOLO_JOB_TOKEN rank=$KOLO_RANK job=$KOLO_JOB_ID"}),
                 env({{"PATH", standins + ":" + (path != nullptr ? path : "/usr/bin:/bin")},
                      {"FAKE_SSH_LOG", log}}),
                 60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::set<std::string> tokens;
  for (int rank = 0; rank < 2; ++rank) {
    std::smatch m;
    std::regex line("\\[" + std::to_string(rank) + "\\]<stdout>:token=([0-9a-f]{32}) rank=" +
                    std::to_string(rank) + " job=job-[0-9a-f]{12}\n");
    ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out << r.err;
    tokens.insert(m[1].str());
  }
  ASSERT_EQ(tokens.size(), 1u);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string argv_log = ss.str();
  EXPECT_NE(argv_log.find("BatchMode=yes\nkolo-fake-host-a\nsh\n-c\n"), std::string::npos)
      << argv_log;
  EXPECT_NE(argv_log.find("kolo-fake-host-b"), std::string::npos) << argv_log;
  EXPECT_EQ(argv_log.find(*tokens.begin()), std::string::npos)
      << "the token is on ssh's command line:\n"
      << argv_log;
  EXPECT_EQ(argv_log.find("KOLO_JOB_TOKEN="), std::string::npos) << argv_log;
}

TEST_F(KolorunTest, EnvWdirAndSshOptionsReachLocalAndRemoteRanks) {
  const std::string log = tmp_.path() + "/ssh-argv.log";
  const std::string wdir = tmp_.path() + "/work dir";
  ASSERT_EQ(::mkdir(wdir.c_str(), 0755), 0);
  const std::string standins = standinDaemon().substr(0, standinDaemon().rfind('/'));
  const char* path = std::getenv("PATH");
  const std::string script = "echo \"rank=$KOLO_RANK pwd=$(pwd) a=$KOLO_TEST_A b=$KOLO_TEST_B s=$MY_SECRET\"";
  const std::vector<std::string> opts = {"-x", "KOLO_TEST_A=1 2", "-x", "KOLO_TEST_B", "-x", "MY_SECRET=hush-7f3a",
                                         "--wdir", wdir};
  auto args = [&](std::vector<std::string> head) {
    head.insert(head.end(), opts.begin(), opts.end());
    head.insert(head.end(), {"--", "sh", "-c", script});
    return head;
  };
  // Remote ranks (through the stand-in ssh), then a local one (embedded agent).
  auto r = runCommand(kolorun(args({"-np", "2", "-H", "kolo-fake-host-a:1,kolo-fake-host-b:1", "-p", "2222",
                                    "-i", "/dev/null"})),
                      env({{"PATH", standins + ":" + (path != nullptr ? path : "/usr/bin:/bin")},
                           {"FAKE_SSH_LOG", log},
                           {"KOLO_TEST_B", "from-kolorun"}}),
                      60s, unset());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto local = runCommand(kolorun(args({"-np", "1"})), env({{"KOLO_TEST_B", "from-kolorun"}}), 60s, unset());
  ASSERT_EQ(local.code, 0) << local.out << local.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("[" + std::to_string(rank) + "]<stdout>:rank=" + std::to_string(rank) + " pwd=" + wdir +
                         " a=1 2 b=from-kolorun s=hush-7f3a\n"),
              std::string::npos)
        << r.out << r.err;
  }
  EXPECT_NE(local.out.find("[0]<stdout>:rank=0 pwd=" + wdir + " a=1 2 b=from-kolorun s=hush-7f3a\n"),
            std::string::npos)
      << local.out << local.err;
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string argv_log = ss.str();
  EXPECT_NE(argv_log.find("BatchMode=yes\n-p\n2222\n-i\n/dev/null\nkolo-fake-host-a\nsh\n-c\n"),
            std::string::npos)
      << argv_log;
  EXPECT_EQ(argv_log.find("hush-7f3a"), std::string::npos) << "a secret -x variable is on ssh's command line:\n"
                                                          << argv_log;
}

}  // namespace
}  // namespace kolo::clitest
