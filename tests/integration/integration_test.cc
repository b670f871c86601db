// End-to-end tests through the real kolo-coordinator and kolo-agent
// binaries with real rank processes linked against libkolo.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <regex>
#include <thread>

#include "common/frame.h"
#include "common/stream_copy.h"
#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check"; }

void expectAllOk(std::vector<Proc>& ranks, const std::string& needle) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << " output:\n" << out;
    EXPECT_NE(out.find(needle), std::string::npos) << "rank " << r << " output:\n" << out;
  }
}

class Allreduce : public ::testing::TestWithParam<int> {};

TEST_P(Allreduce, EveryDtypeOpAndSizeMatchesReference) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  int n = GetParam();
  std::vector<std::string> argv = {checkBin(), "allreduce"};
  if (n == 2) argv.push_back("--big");
  auto ranks = c.launchJob("ar" + std::to_string(n), n, argv);
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n" << c.agentLog(0);
  expectAllOk(ranks, "allreduce checks passed");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Allreduce, ::testing::Values(1, 2, 4));

// kolo_direct_bytes_total on agent 0's /metrics (-1: not found).
double agentCounter(Cluster& c, const std::string& name) {
  std::string body = httpGet(c.agentMetrics(0), "/metrics");
  const std::string key = "\n" + name + " ";
  auto at = body.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(body.c_str() + at + key.size(), nullptr);
}

double splitBytes(Cluster& c) { return agentCounter(c, "kolo_split_bytes_total"); }

double directBytes(Cluster& c) {
  std::string body = httpGet(c.agentMetrics(0), "/metrics");
  const std::string key = "\nkolo_direct_bytes_total ";
  auto at = body.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(body.c_str() + at + key.size(), nullptr);
}

// The direct user-memory path (the agent reads and writes the trainers'
// tensors in place): exact around its threshold for every dtype and op,
// and the agent's counter shows it was taken (KOLO_DIRECT=always); with
// one rank opting out (KOLO_DIRECT=0) the job mixes direct and arena
// ranks, still exact (from 1 MiB the arena rank splits its tensors and the
// direct rank does not: the agent sends those ops back, kSplitRetry, and
// both ranks resubmit them whole).
TEST(Integration, DirectUserMemoryIsExactAndTaken) {
  Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "256"}});  // kolo_check direct's threshold
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("direct3", 3, {checkBin(), "direct"}, {{"KOLO_DIRECT", "always"}});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n" << c.agentLog(0);
  expectAllOk(ranks, "direct checks passed");
  const double after_first = directBytes(c);
  EXPECT_GT(after_first, 0) << c.agentLog(0);
  auto mixed = c.launchJob("direct-mixed", 2, {checkBin(), "direct"},
                           {{"KOLO_CHECK_NO_DIRECT_RANK", "1"}, {"KOLO_DIRECT", "1"}});
  ASSERT_TRUE(c.waitJob(mixed, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n" << c.agentLog(0);
  expectAllOk(mixed, "direct checks passed");
  EXPECT_GT(directBytes(c), after_first);
}

// KOLO_DIRECT=auto (the default): a tensor from the agent's --direct-min-kb
// up takes the arena while the arena has room for it and the direct path
// only when it would wait for space. With the default arena the checks'
// tensors (every dtype and op around 256 KiB) all fit: nothing moves
// directly. 48 async tensors of 512 KiB do not fit the smallest arena (16
// MiB): the rest go direct, ranks and tensors mixing both paths, exact.
TEST(Integration, DirectAutoTakesTheArenaWhileItHasRoom) {
  // A bytes quota above the tight arena's 16 MiB, so that what does not fit
  // the arena may go direct (the default quota is the arena's size).
  Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "256"}, {"KOLO_MAX_BYTES_IN_FLIGHT_MB", "64"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto roomy = c.launchJob("auto-roomy", 2, {checkBin(), "direct"});
  ASSERT_TRUE(c.waitJob(roomy, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n"
                                                           << c.agentLog(0);
  expectAllOk(roomy, "direct checks passed");
  EXPECT_EQ(directBytes(c), 0) << c.agentLog(0);
  // 48 async tensors of 512 KiB (24 MiB) while rank 1 holds back: rank 0's
  // arena fills and the rest of its tensors go direct.
  auto tight = c.launchJob(
      "auto-tight", 2, {checkBin(), "direct"},
      {{"KOLO_ARENA_MB", "16"}, {"KOLO_CHECK_ASYNC_N", "48"}, {"KOLO_CHECK_ASYNC_LAG_MS", "500"}});
  ASSERT_TRUE(c.waitJob(tight, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n"
                                                           << c.agentLog(0);
  expectAllOk(tight, "direct checks passed");
  EXPECT_GT(directBytes(c), 0) << c.agentLog(0);
}

// libkolo holds its submissions under the agent's bytes quota
// (Welcome.max_bytes_in_flight) instead of having them refused: 48 direct
// tensors of 512 KiB (24 MiB) submitted async by rank 0 while rank 1 holds
// back, against the default quota of rank 0's 16 MiB arena. Every result
// exact and no refusal in the agent's log.
TEST(Integration, SubmissionsWaitForTheBytesQuota) {
  Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "256"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("quota-wait", 2, {checkBin(), "direct"},
                           {{"KOLO_ARENA_MB", "16"},
                            {"KOLO_DIRECT", "always"},
                            {"KOLO_CHECK_ASYNC_N", "48"},
                            {"KOLO_CHECK_ASYNC_LAG_MS", "500"}});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n"
                                                           << c.agentLog(0);
  expectAllOk(ranks, "direct checks passed");
  EXPECT_GT(directBytes(c), 0) << c.agentLog(0);
  EXPECT_EQ(c.agentLog(0).find("bytes in flight on this agent"), std::string::npos)
      << c.agentLog(0);
}

// The thresholds as shipped, at N=2 and N=4: the direct path
// (KOLO_DIRECT=always) straddled at
// the agent's default --direct-min-kb (kDefaultDirectMinKb below, the
// agent_config.cc default), and the arena path (direct off) straddled at
// libkolo's non-temporal copy threshold (kStreamCopyMinBytes): every dtype
// and op, unaligned, in and out of place, async, every element checked.
constexpr const char* kDefaultDirectMinKb = "1024";

class DefaultThresholds : public ::testing::TestWithParam<int> {};

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif

TEST_P(DefaultThresholds, DirectAndArenaPathsAreExactAroundThem) {
  const int n = GetParam();
  if (kSanitizerBuild) {
    // Under TSan N=2 took 282 s and N=4 passed its ctest timeout: the same
    // paths run under the sanitizers in DirectUserMemoryIsExactAndTaken (a
    // 256 KiB threshold); these are the plain build's.
    GTEST_SKIP() << "every dtype x op around 1 MiB is too slow under a sanitizer; "
                    "DirectUserMemoryIsExactAndTaken covers these paths there";
  }
  {
    Cluster c;  // the agent's defaults
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks =
        c.launchJob("directdef" + std::to_string(n), n, {checkBin(), "direct"},
                    {{"KOLO_CHECK_THRESHOLD_KB", kDefaultDirectMinKb}, {"KOLO_DIRECT", "always"}});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(180))) << "ranks did not finish; agent log:\n"
                                                             << c.agentLog(0);
    expectAllOk(ranks, "direct checks passed");
    EXPECT_GT(directBytes(c), 0) << c.agentLog(0);
  }
  {
    Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "0"}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks =
        c.launchJob("streamdef" + std::to_string(n), n, {checkBin(), "direct"},
                    {{"KOLO_CHECK_THRESHOLD_KB", std::to_string(kStreamCopyMinBytes >> 10)}});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(180))) << "ranks did not finish; agent log:\n"
                                                             << c.agentLog(0);
    expectAllOk(ranks, "direct checks passed");
    EXPECT_EQ(directBytes(c), 0) << c.agentLog(0);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DefaultThresholds, ::testing::Values(2, 4));

// Split reduction (ipc_layout.h kSubmitFlagSplit: the ranks reduce their
// shares, reading each other's arenas): kolo_check's direct checks around
// the agent's default --split-min-kb (every dtype and op, unaligned, in and
// out of place, scaled, 12 async in flight) are exact at N=2 and N=3
// (uneven shares), and the agent counts the split bytes; with
// --split-min-kb 0 the agent reduces every tensor and nothing is split.
TEST(Integration, SplitReductionIsExactAroundItsThresholdAndTaken) {
  {
    Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "0"}});
    ASSERT_TRUE(c.ok()) << c.error();
    for (int n : {2, 3}) {
      auto ranks = c.launchJob("split" + std::to_string(n), n, {checkBin(), "direct"},
                               {{"KOLO_CHECK_THRESHOLD_KB", "256"}});
      ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(180)))
          << "ranks did not finish; agent log:\n"
          << c.agentLog(0);
      expectAllOk(ranks, "direct checks passed");
    }
    EXPECT_GT(splitBytes(c), 0) << c.agentLog(0);
    EXPECT_EQ(directBytes(c), 0) << c.agentLog(0);
  }
  {
    Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "0"}, {"KOLO_SPLIT_MIN_KB", "0"}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks =
        c.launchJob("nosplit", 2, {checkBin(), "direct"}, {{"KOLO_CHECK_THRESHOLD_KB", "256"}});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(180))) << "ranks did not finish; agent log:\n"
                                                             << c.agentLog(0);
    expectAllOk(ranks, "direct checks passed");
    EXPECT_EQ(splitBytes(c), 0) << c.agentLog(0);
  }
}

// An agent with --direct-min-kb 0 keeps every tensor on the arena path:
// the same checks pass and nothing moved directly.
TEST(Integration, DirectPathOffKeepsTheArena) {
  Cluster c(1, {{"KOLO_DIRECT_MIN_KB", "0"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("nodirect", 2, {checkBin(), "direct"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(120))) << "ranks did not finish; agent log:\n" << c.agentLog(0);
  expectAllOk(ranks, "direct checks passed");
  EXPECT_EQ(directBytes(c), 0) << c.agentLog(0);
  EXPECT_NE(c.agentLog(0).find("direct user-memory path off: the agent runs with --direct-min-kb 0"),
            std::string::npos)
      << c.agentLog(0);
}

// A rank whose tensor the agent cannot read (unmapped) or write
// (read-only): every rank's op fails with the agent's text, the agent
// stays up and the job's next allreduce is exact (KOLO_DIRECT=always: on
// the arena path libkolo's own copy-in would touch the bad address).
TEST(Integration, DirectPathBadAddressesFailTheOpWithTheirText) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("directbad", 2, {checkBin(), "direct-bad"}, {{"KOLO_DIRECT", "always"}});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << "ranks did not finish; agent log:\n" << c.agentLog(0);
  expectAllOk(ranks, "OK direct errors checked");
  for (auto& r : ranks) {
    std::string out = r.output();
    EXPECT_NE(out.find("bad.input: KOLO_ERR_INVALID_ARGUMENT"), std::string::npos) << out;
    EXPECT_NE(out.find("Bad address (not mapped or not readable in that process)"), std::string::npos) << out;
    EXPECT_NE(out.find("(not mapped or not writable in that process)"), std::string::npos) << out;
  }
  EXPECT_EQ(c.agent(0).exit_code, -1) << "the agent exited:\n" << c.agentLog(0);
}

// The wake-ups skipped while the other side polls (common/ipc_layout.h:
// agent_polling, client_waiting, frames_sent): small allreduces whose gaps
// cross both sides' spin windows, with short spins so that both sleep
// often, are exact and none waits for a timeout. With spinning off the
// doorbell and the completion eventfd carry every op.
TEST(Integration, SkippedWakeUpsLoseNoCollective) {
  for (const char* spin : {"20", "0"}) {
    SCOPED_TRACE(std::string("spin-us ") + spin);
    Cluster c(1, {{"KOLO_SPIN_US", spin}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchJob(std::string("wake") + spin, 2, {checkBin(), "wakeups", "1500", "500"},
                             {{"KOLO_SPIN_US", spin}});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << "ranks did not finish; agent log:\n"
                                                            << c.agentLog(0);
    expectAllOk(ranks, "OK 1500 wakeups");
    for (auto& r : ranks) {  // the margin to the bound, in the test's log (ctest -V)
      std::string out = r.output();
      auto at = out.find("slowest");
      if (at != std::string::npos) {
        std::printf("spin-us %s: %s\n", spin, out.substr(at, out.find('\n', at) - at).c_str());
      }
    }
  }
}

TEST(Integration, MismatchedRanksGetErrorsNamingBothSidesAndJobRecovers) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("mm", 3, {checkBin(), "mismatch"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
  expectAllOk(ranks, "OK mismatch errors reported and job recovered");
}

TEST(Integration, DuplicateNameInFlightIsAClearError) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("dup", 2, {checkBin(), "duplicate"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
  expectAllOk(ranks, "OK duplicate rejected");
  EXPECT_NE(ranks[0].output().find("currently being processed: 'dup'"), std::string::npos) << ranks[0].output();
}

// Rank 2 of three killed itself with an op in flight (kolo_check "die",
// "split-die"): ranks 0 and 1 failed that op within the agent's detection
// (the victim dies ~0.3 s after the survivors submit; detection must add
// < 2 s), naming the dead rank, and exited cleanly.
void expectPeersFailedFast(std::vector<Proc>& ranks) {
  EXPECT_EQ(ranks[2].term_signal, SIGKILL) << ranks[2].output();
  for (int r = 0; r < 2; ++r) {
    std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << out;
    std::smatch m;
    std::regex re("pending op failed after ([0-9.]+) s");
    ASSERT_TRUE(std::regex_search(out, m, re)) << out;
    EXPECT_LT(std::stod(m[1]), 2.3) << out;
    EXPECT_NE(out.find("rank 2"), std::string::npos) << "the failure must name the dead rank:\n" << out;
  }
}

TEST(Integration, KilledTrainerFailsPeersFastAndOtherJobsContinue) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  // Job B runs alongside the job that loses a rank.
  auto other = c.launchJob("steady", 2, {checkBin(), "loop", "3000"});
  auto ranks = c.launchJob("victim", 3, {checkBin(), "die", "2"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
  expectPeersFailedFast(ranks);
  ASSERT_TRUE(c.waitJob(other, std::chrono::seconds(120))) << c.agentLog(0);
  expectAllOk(other, "OK 3000 loop allreduces");
  // The agent freed the failed job and still serves new ones.
  auto again = c.launchJob("after", 2, {checkBin(), "loop", "10"});
  ASSERT_TRUE(c.waitJob(again, std::chrono::seconds(60)));
  expectAllOk(again, "OK 10 loop allreduces");
  EXPECT_NE(c.agentLog(0).find("job victim removed"), std::string::npos) << c.agentLog(0);
}

// Split reduction: a rank that dies after every rank submitted a split
// allreduce, before it reduced its share, fails the others (waiting for
// that share) as fast as any dead rank does, naming it.
TEST(Integration, SplitPeerThatDiesBeforeItsShareFailsThePeersFast) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("split-victim", 3, {checkBin(), "split-die", "2"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << c.agentLog(0);
  expectPeersFailedFast(ranks);
  EXPECT_GT(splitBytes(c), 0) << c.agentLog(0);
  EXPECT_EQ(c.agent(0).exit_code, -1) << "the agent exited:\n" << c.agentLog(0);
}

// Split reduction: a rank that submitted but does not look at its ops for
// 3 s (computing) fails the others' op once their KOLO_OP_TIMEOUT (1 s)
// passed, naming it, not later; it then finishes the op exactly itself and
// the job goes on.
TEST(Integration, SplitShareMissingFailsWithinTheOpTimeoutNamingTheRank) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("split-stall", 2, {checkBin(), "split-stall", "1", "3000"},
                           {{"KOLO_OP_TIMEOUT", "1"}});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << c.agentLog(0);
  expectAllOk(ranks, "OK split stall checked");
  std::string out = ranks[0].output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("split op failed after ([0-9.]+) s"))) << out;
  EXPECT_GE(std::stod(m[1]), 1.0) << out;
  EXPECT_LT(std::stod(m[1]), 2.5) << out;
  EXPECT_NE(out.find("local rank(s) 1 did not reduce their share of it within 1"),
            std::string::npos)
      << out;
  EXPECT_GT(splitBytes(c), 0) << c.agentLog(0);
}

TEST(Integration, NoAgentReachableFailsWithinStartTimeoutNamingTheSocket) {
  char dir[] = "/tmp/kolo-noagent-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string sock = std::string(dir) + "/nobody.sock";
  Proc p = spawnProcess({checkBin(), "init-only"},
                        {{"KOLO_AGENT_SOCKET", sock}, {"KOLO_JOB_ID", "j"}, {"KOLO_JOB_TOKEN", "t"},
                         {"KOLO_SIZE", "1"}, {"KOLO_LOCAL_RANK", "0"}, {"KOLO_LOCAL_SIZE", "1"},
                         {"KOLO_START_TIMEOUT", "2"}},
                        std::string(dir) + "/out.log");
  ASSERT_TRUE(waitProcess(p, std::chrono::seconds(10)));
  std::string out = p.output();
  EXPECT_EQ(p.exit_code, 3) << out;
  EXPECT_LT(p.seconds(), 5.0);
  EXPECT_NE(out.find(sock), std::string::npos) << out;
  EXPECT_NE(out.find("kolo-agent"), std::string::npos) << out;
  ::unlink((std::string(dir) + "/out.log").c_str());
  ::rmdir(dir);
}

// A process of another user cannot reach the agent: the socket is mode 0660
// (owner and group only), so connect() fails with EACCES even when the
// directory is open to everyone, and the client says so, naming the socket.
TEST(Integration, ForeignUserIsRefusedAtTheSocket) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user (setpriv)";
  if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "setpriv (util-linux) is not installed";
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  ASSERT_EQ(::chmod(c.dir().c_str(), 0755), 0);  // only the socket's own mode stands in the way
  struct stat st{};
  ASSERT_EQ(::stat(c.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u) << std::oct << (st.st_mode & 0777);
  auto env = c.rankEnv("foreign", "tok", 1, 0, 1);
  env["KOLO_START_TIMEOUT"] = "2";
  std::string log = c.dir() + "/foreign.log";
  Proc p = spawnProcess({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", checkBin(),
                         "init-only"},
                        env, log);
  ASSERT_TRUE(waitProcess(p, std::chrono::seconds(15)));
  std::string out = p.output();
  EXPECT_NE(p.exit_code, 0) << out;
  EXPECT_NE(out.find("KOLO_ERR_PERMISSION_DENIED"), std::string::npos) << out;
  EXPECT_NE(out.find("permission denied: the socket belongs to group"), std::string::npos) << out;
  // Group root (an agent without socket-group): not "usermod -aG root" (issue 45).
  EXPECT_NE(out.find("Ask the node's administrator to set socket-group"), std::string::npos) << out;
  EXPECT_EQ(out.find("usermod"), std::string::npos) << out;
  EXPECT_NE(out.find(c.socket()), std::string::npos) << out;
  EXPECT_LT(p.seconds(), 5.0) << "a refused connect is not retried";
  // The same program as the agent's own user gets in.
  auto ok = c.launchJob("native", 1, {checkBin(), "init-only"});
  ASSERT_TRUE(c.waitJob(ok, std::chrono::seconds(30)));
  EXPECT_EQ(ok[0].exit_code, 0) << ok[0].output();
}

TEST(Integration, WrongTokenIsRefused) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto env0 = c.rankEnv("tok", "right", 2, 0, 2);
  auto env1 = c.rankEnv("tok", "wrong", 2, 1, 2);
  env0["KOLO_START_TIMEOUT"] = "3";
  env1["KOLO_START_TIMEOUT"] = "3";
  std::vector<Proc> ranks;
  ranks.push_back(spawnProcess({checkBin(), "init-only"}, env0, c.dir() + "/tok0.log"));
  ASSERT_TRUE(waitProcess(ranks[0], std::chrono::milliseconds(300)) == false || ranks[0].exited);
  ranks.push_back(spawnProcess({checkBin(), "init-only"}, env1, c.dir() + "/tok1.log"));
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(20)));
  EXPECT_EQ(ranks[1].exit_code, 3) << ranks[1].output();
  EXPECT_NE(ranks[1].output().find("wrong token"), std::string::npos) << ranks[1].output();
  EXPECT_NE(ranks[1].output().find("PERMISSION_DENIED"), std::string::npos) << ranks[1].output();
}

int connectRaw(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the agent closes the connection within the timeout.
bool closedByAgent(int fd, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[256];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
  }
  return false;
}

TEST(Integration, MalformedTruncatedAndOversizeFramesDropOnlyThatConnection) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  {
    int fd = connectRaw(c.socket());
    ASSERT_GE(fd, 0);
    std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    EXPECT_TRUE(closedByAgent(fd, 3000)) << "bad magic";
    ::close(fd);
  }
  {
    int fd = connectRaw(c.socket());
    std::string h = encodeFrameHeader(10u << 20);
    ASSERT_EQ(::write(fd, h.data(), h.size()), 8);
    EXPECT_TRUE(closedByAgent(fd, 3000)) << "oversize";
    ::close(fd);
  }
  {
    int fd = connectRaw(c.socket());
    std::string f = encodeFrameHeader(5) + std::string("\xff\xff\xff\xff\xff", 5);  // not a protobuf
    ASSERT_EQ(::write(fd, f.data(), f.size()), static_cast<ssize_t>(f.size()));
    EXPECT_TRUE(closedByAgent(fd, 3000)) << "undecodable";
    ::close(fd);
  }
  {
    int fd = connectRaw(c.socket());
    std::string f = encodeFrameHeader(100) + std::string(10, 'x');  // truncated, then hang up
    ASSERT_EQ(::write(fd, f.data(), f.size()), static_cast<ssize_t>(f.size()));
    ::close(fd);
  }
  EXPECT_TRUE(waitProcess(c.agent(0), std::chrono::milliseconds(0)) == false) << "agent died";
  auto ranks = c.launchJob("afterjunk", 2, {checkBin(), "loop", "20"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
  expectAllOk(ranks, "OK 20 loop allreduces");
  std::string log = c.agentLog(0);
  EXPECT_NE(log.find("bad magic"), std::string::npos) << log;
  EXPECT_NE(log.find("oversize frame"), std::string::npos) << log;
  EXPECT_NE(log.find("undecodable"), std::string::npos) << log;
}

TEST(Integration, PrometheusEndpointCountsCollectives) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  std::string addr = c.agentMetrics(0);
  ASSERT_FALSE(addr.empty()) << "no metrics address in the ready file";
  auto ranks = c.launchJob("metered", 2, {checkBin(), "loop", "25"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
  expectAllOk(ranks, "OK 25 loop allreduces");
  // The ranks have exited, but the agent learns of their hang-ups on its own loop: wait
  // (bounded) for it to drop the job before reading the counters.
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    text = httpGet(addr, "/metrics");
    if (text.find("kolo_jobs 0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling an asynchronous gauge
  }
  EXPECT_NE(text.find("200 OK"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE kolo_collectives_total counter"), std::string::npos) << text;
  // 25 loop ops of 4096 float32 = 409600 bytes, all ok.
  EXPECT_NE(text.find("kolo_collectives_total{dtype=\"float32\",op=\"allreduce\",status=\"ok\"} 25"),
            std::string::npos) << text;
  EXPECT_NE(text.find("kolo_collective_bytes_total{dtype=\"float32\",op=\"allreduce\"} 409600"),
            std::string::npos) << text;
  EXPECT_NE(text.find("kolo_collective_latency_seconds_count{op=\"allreduce\"} 25"), std::string::npos) << text;
  EXPECT_NE(text.find("kolo_jobs 0"), std::string::npos) << text;
}

TEST(Integration, CoordinatorMetricsCountAgentsAndJobs) {
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_args = {"--metrics-listen", "127.0.0.1:0"};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  std::smatch m;
  std::string log = c.coordinator().output();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on http://([0-9.]+:[0-9]+)/metrics"))) << log;
  std::string addr = m[1];
  // The gauges are refreshed every 5 s; wait (bounded) for both agents.
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(12);
  while (std::chrono::steady_clock::now() < deadline) {
    text = httpGet(addr, "/metrics");
    if (text.find("kolo_coordinator_agents 2") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // polling a periodic gauge
  }
  EXPECT_NE(text.find("kolo_coordinator_agents 2"), std::string::npos) << text;
  EXPECT_NE(text.find("kolo_coordinator_jobs{state=\"RUNNING\"} 0"), std::string::npos) << text;
}

}  // namespace
}  // namespace kolo::testing
