// The `kolo` CLI binary: error paths without a daemon, and (when the
// daemons are built) every command against a real kolo-coordinator and
// kolo-agent started by the test.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/fd.h"
#include "test_process.h"

namespace kolo::clitest {
namespace {

std::vector<std::string> kolo(std::vector<std::string> args) {
  args.insert(args.begin(), binDir() + "/kolo");
  return args;
}

// A loopback port that refuses connections: bound, never listening, and
// held for the test so nobody else takes it.
struct ClosedPort {
  UniqueFd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  int port = 0;
  ClosedPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    EXPECT_EQ(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

TEST(KoloCli, UnreachableAgentFailsWithTheAddress) {
  ClosedPort closed;
  auto t0 = std::chrono::steady_clock::now();
  auto r = runCommand(kolo({"status", "--agent", closed.address()}), {}, 30s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "the RPC deadline is 5 s";
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("kolo: cannot reach the kolo agent at " + closed.address() + ": "), std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(KoloCli, UnreachableCoordinatorFailsWithTheAddress) {
  ClosedPort closed;
  // The default address comes from $KOLO_COORDINATOR.
  auto r = runCommand(kolo({"jobs", "--json"}), {{"KOLO_COORDINATOR", closed.address()}}, 30s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("kolo: cannot reach the kolo coordinator at " + closed.address() + ": "), std::string::npos)
      << r.err;
}

TEST(KoloCli, DefaultAgentAddressComesFromTheEnvironment) {
  ClosedPort closed;
  auto r = runCommand(kolo({"drain"}), {{"KOLO_AGENT_RPC", closed.address()}}, 30s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot reach the kolo agent at " + closed.address()), std::string::npos) << r.err;
}

// Nothing listening is said so, without a TLS hint (TLS is not the cause).
TEST(KoloCli, NothingListeningIsSaidSoWithoutATlsHint) {
  ClosedPort closed;
  auto r = runCommand(kolo({"status", "--agent", closed.address()}), {}, 30s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("(nothing is listening at " + closed.address() +
                       ": Connection refused; is kolo-agent running there? check --agent)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("TLS"), std::string::npos) << r.err;
  auto c = runCommand(kolo({"jobs", "--coordinator", closed.address()}), {}, 30s);
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.err.find("kolo: cannot reach the kolo coordinator at " + closed.address()),
            std::string::npos)
      << c.err;
  EXPECT_NE(c.err.find("; is kolo-coordinator running there? check --coordinator)"),
            std::string::npos)
      << c.err;
  EXPECT_EQ(c.err.find("TLS"), std::string::npos) << c.err;
}

TEST(KoloCli, VersionOnEveryDaemonAndTheCli) {
  for (const char* prog : {"kolo", "kolo-agent", "kolo-coordinator"}) {
    std::string path = binDir() + "/" + prog;
    if (::access(path.c_str(), X_OK) != 0) continue;  // daemons not built
    auto r = runCommand({path, "--version"}, {}, 30s);
    EXPECT_EQ(r.code, 0) << prog << ": " << r.err;
    EXPECT_TRUE(r.out.rfind(std::string(prog) + " ", 0) == 0) << r.out;
    EXPECT_EQ(r.out.back(), '\n') << r.out;
  }
}

TEST(KoloCli, DaemonUsageErrorsExit2WithAReadableLine) {
  for (const char* prog : {"kolo-agent", "kolo-coordinator"}) {
    std::string path = binDir() + "/" + prog;
    if (::access(path.c_str(), X_OK) != 0) continue;
    auto r = runCommand({path, "--no-such-flag"}, {}, 30s);
    EXPECT_EQ(r.code, 2) << prog << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(prog) + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  }
}

TEST(KoloCli, AgentReadsKoloAgentSocketAndKoloSocketAsADeprecatedAlias) {
  const std::string agent = binDir() + "/kolo-agent";
  if (::access(agent.c_str(), X_OK) != 0) GTEST_SKIP() << "kolo-agent is not built";
  auto r = runCommand({agent, "--dump-config"}, {{"KOLO_AGENT_SOCKET", "/x/new.sock"}}, 30s,
                      {"KOLO_SOCKET"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("socket = \"/x/new.sock\"  # env KOLO_AGENT_SOCKET"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.err.find("deprecated"), std::string::npos) << r.err;
  r = runCommand({agent, "--dump-config"}, {{"KOLO_SOCKET", "/x/old.sock"}}, 30s,
                 {"KOLO_AGENT_SOCKET"});
  EXPECT_NE(r.out.find("socket = \"/x/old.sock\"  # env KOLO_SOCKET"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("kolo-agent: KOLO_SOCKET is deprecated; set KOLO_AGENT_SOCKET instead\n"),
            std::string::npos)
      << r.err;
  r = runCommand({agent, "--dump-config"},
                 {{"KOLO_SOCKET", "/x/old.sock"}, {"KOLO_AGENT_SOCKET", "/x/new.sock"}}, 30s);
  EXPECT_NE(r.out.find("socket = \"/x/new.sock\""), std::string::npos) << r.out;
  EXPECT_NE(
      r.err.find("KOLO_SOCKET is deprecated and ignored: KOLO_AGENT_SOCKET=/x/new.sock is set"),
      std::string::npos)
      << r.err;
}

TEST(KoloCli, UsageErrors) {
  auto none = runCommand(kolo({}), {}, 30s);
  EXPECT_EQ(none.code, 2) << none.err;
  EXPECT_NE(none.err.find("kolo: a command is required: one of status, jobs, agents, job, "
                          "timeline, drain, undrain (see kolo --help)\n"),
            std::string::npos)
      << none.err;
  // Issue 45: an unknown word is named, with the commands there are.
  auto word = runCommand(kolo({"bogus"}), {}, 30s);
  EXPECT_EQ(word.code, 2) << word.err;
  EXPECT_NE(word.err.find("kolo: unknown command 'bogus'; the commands are status, jobs, agents, "
                          "job, timeline, drain, undrain (see kolo --help)\n"),
            std::string::npos)
      << word.err;
  auto wait = runCommand(kolo({"drain", "--wait", "-1"}), {}, 30s);
  EXPECT_EQ(wait.code, 2) << wait.err;
  EXPECT_NE(wait.err.find("--wait: must be a number of 0 or more, got '-1'"), std::string::npos)
      << wait.err;
  auto job = runCommand(kolo({"job"}), {}, 30s);
  EXPECT_EQ(job.code, 2) << job.err;
  EXPECT_NE(job.err.find("kolo: ID is required (see kolo --help)"), std::string::npos) << job.err;
  auto bogus = runCommand(kolo({"status", "--bogus"}), {}, 30s);
  EXPECT_EQ(bogus.code, 2) << bogus.err;
  EXPECT_NE(bogus.err.find("kolo: The following argument was not expected: --bogus"),
            std::string::npos)
      << bogus.err;
  auto help = runCommand(kolo({"--help"}), {}, 30s);
  EXPECT_EQ(help.code, 0);
  for (const char* cmd : {"status", "jobs", "agents", "job", "timeline", "drain", "undrain"}) {
    EXPECT_NE(help.out.find(cmd), std::string::npos) << help.out;
  }
}

#if KOLO_TEST_REAL_DAEMONS

// The address in a ready file: its first word ("host:port [metrics=...]").
std::string readAddress(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  in >> word;
  return word;
}

// A real coordinator and agent for the test's lifetime.
class KoloCliDaemons : public ::testing::Test {
 protected:
  // Their stderr goes to a pipe read only while waiting: keep it short.
  const std::map<std::string, std::string> kQuiet = {{"KOLO_LOG_LEVEL", "warn"}};

  void SetUp() override {
    std::string coord_ready = tmp_.path() + "/coordinator.ready";
    coordinator_ = std::make_unique<TestProcess>(
        std::vector<std::string>{binDir() + "/kolo-coordinator", "--listen", "127.0.0.1:0", "--ready-file",
                                 coord_ready},
        kQuiet);
    ASSERT_TRUE(waitForFile(coord_ready, 30s)) << coordinator_->err();
    coordinator_address_ = readAddress(coord_ready);
    std::string agent_ready = tmp_.path() + "/agent.ready";
    socket_ = tmp_.path() + "/agent.sock";
    std::vector<std::string> args{binDir() + "/kolo-agent",
                                  "--socket",
                                  socket_,
                                  "--coordinator",
                                  coordinator_address_,
                                  "--rpc-listen",
                                  "127.0.0.1:0",
                                  "--ready-file",
                                  agent_ready,
                                  "--timeline-dir",
                                  tmp_.path(),
                                  "--agent-id",
                                  "cli-test-agent",
                                  "--metrics-listen",
                                  "127.0.0.1:0"};
    args.insert(args.end(), extra_agent_args_.begin(), extra_agent_args_.end());
    agent_ = std::make_unique<TestProcess>(args, kQuiet);
    ASSERT_TRUE(waitForFile(agent_ready, 30s)) << agent_->err();
    agent_address_ = readAddress(agent_ready);
  }
  void TearDown() override {
    for (auto* p : {agent_.get(), coordinator_.get()}) {
      if (p == nullptr) continue;
      p->signal(SIGTERM);
      EXPECT_TRUE(p->wait(10s).has_value()) << "a daemon did not stop on SIGTERM";
    }
    agent_.reset();
    coordinator_.reset();
  }

  TempDir tmp_;
  std::vector<std::string> extra_agent_args_;  // set before SetUp
  std::unique_ptr<TestProcess> coordinator_, agent_;
  std::string coordinator_address_, agent_address_, socket_;
};

// systemd and Kubernetes stop the agent with SIGTERM: it must go within 1 s,
// also while it still waits for an absent coordinator at start.
TEST(KoloAgentLifecycle, SigtermWhileWaitingForAnAbsentCoordinatorStopsItWithin1s) {
  ClosedPort closed;
  TempDir tmp;
  TestProcess agent(
      {binDir() + "/kolo-agent", "--socket", tmp.path() + "/agent.sock", "--coordinator",
       closed.address(), "--rpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"},
      {{"KOLO_LOG_LEVEL", "info"}});
  // Logged just before it registers.
  ASSERT_TRUE(agent.waitForStderr("metrics on http://", 30s)) << agent.err();
  auto t0 = std::chrono::steady_clock::now();
  agent.signal(SIGTERM);
  auto code = agent.wait(5s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << agent.err();
  EXPECT_EQ(code, 0) << agent.err();
  EXPECT_NE(agent.err().find("stopped by SIGTERM while waiting for the coordinator at " +
                             closed.address()),
            std::string::npos)
      << agent.err();
}

// Issue 45: an unknown socket-group fails the start before anything is
// created (no socket file left for kolorun to misread), with what to do.
TEST(KoloAgentLifecycle, UnknownSocketGroupFailsAtOnceAndLeavesNoSocket) {
  ClosedPort closed;
  TempDir tmp;
  const std::string sock = tmp.path() + "/agent.sock";
  auto t0 = std::chrono::steady_clock::now();
  auto r =
      runCommand({binDir() + "/kolo-agent", "--socket", sock, "--socket-group", "nosuchgroup45",
                  "--coordinator", closed.address(), "--rpc-listen", "127.0.0.1:0"},
                 {{"KOLO_LOG_LEVEL", "warn"}}, 30s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("unknown group for the agent socket: 'nosuchgroup45' (socket-group takes "
                       "a group name from /etc/group or a numeric gid; create it with `sudo "
                       "groupadd nosuchgroup45`)"),
            std::string::npos)
      << r.err;
  struct stat st {};
  EXPECT_NE(::lstat(sock.c_str(), &st), 0) << sock << " was left behind";
}

// A numeric gid is a group too (containers often have no /etc/group entry).
TEST(KoloAgentLifecycle, NumericSocketGroupIsTaken) {
  ClosedPort closed;
  TempDir tmp;
  const std::string sock = tmp.path() + "/agent.sock";
  TestProcess agent(
      {binDir() + "/kolo-agent", "--socket", sock, "--socket-group", "65533", "--coordinator",
       closed.address(), "--rpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"},
      {{"KOLO_LOG_LEVEL", "info"}});
  ASSERT_TRUE(agent.waitForStderr("metrics on http://", 30s)) << agent.err();
  struct stat st {};
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 65533u);
  agent.signal(SIGTERM);
  EXPECT_EQ(agent.wait(5s), 0) << agent.err();
}

// A socket whose group lets nobody in (root, 0755: an agent without
// socket-group) is explained as such, never with "usermod -aG root".
TEST(KoloAgentLifecycle, ASocketNoGroupMayUseIsNotAnsweredWithJoinRoot) {
  if (::geteuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "needs root and setpriv (runs kolorun as uid 65534)";
  }
  TempDir tmp;
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  const std::string sock = tmp.path() + "/agent.sock";
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd.get(), 4), 0);
  ASSERT_EQ(::chmod(sock.c_str(), 0755), 0);
  auto r = runCommand({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                       binDir() + "/kolorun", "-np", "1", "--agent-socket", sock, "true"},
                      {}, 30s);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(": no users' group may use it; the agent was started without "
                       "socket-group (or a failed start left the file). Ask the node's "
                       "administrator to set socket-group in /etc/kolo/agent.conf"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("usermod"), std::string::npos) << r.err;
}

TEST(KoloAgentLifecycle, AbsentCoordinatorIsSaidSoWithoutATlsHint) {
  ClosedPort closed;
  TempDir tmp;
  auto r = runCommand({binDir() + "/kolo-agent", "--socket", tmp.path() + "/agent.sock",
                       "--coordinator", closed.address(), "--rpc-listen", "127.0.0.1:0",
                       "--metrics-listen", "127.0.0.1:0", "--register-timeout-s", "1"},
                      {{"KOLO_LOG_LEVEL", "warn"}}, 30s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("kolo-agent: cannot start: cannot register with the coordinator at " +
                       closed.address()),
            std::string::npos)
      << r.err;
  EXPECT_NE(
      r.err.find("(nothing is listening at " + closed.address() +
                 ": Connection refused; is kolo-coordinator running there? check --coordinator)"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("TLS"), std::string::npos) << r.err;
}

TEST_F(KoloCliDaemons, CoordinatorDownHeartbeatFailuresAreThrottledAndSigtermStillStopsWithin1s) {
  coordinator_->signal(SIGKILL);
  ASSERT_TRUE(coordinator_->wait(10s).has_value());
  ASSERT_TRUE(
      agent_->waitForStderr("heartbeat to " + coordinator_address_ + " failed (1 in a row)", 30s))
      << agent_->err();
  // The heartbeat runs every second; the next line may come 30 s later.
  EXPECT_FALSE(agent_->waitForStderr("(2 in a row)", 3500ms)) << agent_->err();
  auto t0 = std::chrono::steady_clock::now();
  agent_->signal(SIGTERM);
  EXPECT_EQ(agent_->wait(5s), 0) << agent_->err();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << agent_->err();
}

TEST_F(KoloCliDaemons, Status) {
  auto r = runCommand(kolo({"status", "--agent", agent_address_}), {}, 30s);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("agent        cli-test-agent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("socket       " + socket_), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no clients connected"), std::string::npos) << r.out;

  auto j = runCommand(kolo({"status", "--json"}), {{"KOLO_AGENT_RPC", agent_address_}}, 30s);
  ASSERT_EQ(j.code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["agent_id"], "cli-test-agent");
  EXPECT_EQ(doc["socket_path"], socket_);
  EXPECT_EQ(doc["coordinator"], coordinator_address_);
  EXPECT_TRUE(doc["clients"].is_array());
}

TEST_F(KoloCliDaemons, AgentsAndJobs) {
  auto a = runCommand(kolo({"agents", "--coordinator", coordinator_address_}), {}, 30s);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.out.find("cli-test-agent"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find(" ago "), std::string::npos) << "the heartbeat age: " << a.out;

  auto aj = runCommand(kolo({"agents", "--json"}), {{"KOLO_COORDINATOR", coordinator_address_}}, 30s);
  ASSERT_EQ(aj.code, 0) << aj.err;
  auto doc = nlohmann::json::parse(aj.out);
  ASSERT_EQ(doc["agents"].size(), 1u);
  EXPECT_EQ(doc["agents"][0]["agent_id"], "cli-test-agent");

  auto jobs = runCommand(kolo({"jobs", "--coordinator", coordinator_address_}), {}, 30s);
  ASSERT_EQ(jobs.code, 0) << jobs.err;
  EXPECT_EQ(jobs.out, "no jobs\n");
  auto jj = runCommand(kolo({"jobs", "--json", "--coordinator", coordinator_address_}), {}, 30s);
  ASSERT_EQ(jj.code, 0) << jj.err;
  EXPECT_EQ(nlohmann::json::parse(jj.out)["jobs"].size(), 0u);
}

TEST_F(KoloCliDaemons, UnknownJobIsAnError) {
  auto r = runCommand(kolo({"job", "job-000000000000", "--agent", agent_address_}), {}, 30s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("the kolo agent at " + agent_address_ + " answered NOT_FOUND"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("job-000000000000"), std::string::npos) << r.err;
}

TEST_F(KoloCliDaemons, TimelineReachesTheAgent) {
  std::string path = tmp_.path() + "/timeline.json";
  auto r = runCommand(kolo({"timeline", "start", path, "--mark-cycles", "--agent", agent_address_}), {}, 30s);
  if (r.code == 0) {
    EXPECT_NE(r.out.find("timeline started: " + path), std::string::npos) << r.out;
    auto s = runCommand(kolo({"timeline", "stop", "--agent", agent_address_}), {}, 30s);
    EXPECT_EQ(s.code, 0) << s.err;
    EXPECT_NE(s.out.find("timeline stopped"), std::string::npos) << s.out;
  } else {
    // An agent built without the timeline says so; the CLI passes it on.
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("the kolo agent at " + agent_address_ + " does not support this request"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(KoloCliDaemons, CleanStopDeregistersTheAgentAtOnce) {
  auto before =
      runCommand(kolo({"agents", "--json", "--coordinator", coordinator_address_}), {}, 30s);
  ASSERT_EQ(nlohmann::json::parse(before.out)["agents"].size(), 1u) << before.out;
  auto t0 = std::chrono::steady_clock::now();
  agent_->signal(SIGTERM);
  ASSERT_EQ(agent_->wait(5s), 0) << agent_->err();
  // Well within the coordinator's 5 s lease: the agent said it leaves.
  auto after =
      runCommand(kolo({"agents", "--json", "--coordinator", coordinator_address_}), {}, 30s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_EQ(nlohmann::json::parse(after.out)["agents"].size(), 0u) << after.out;
}

// The agent's status as JSON (`kolo status --json`), or null when the call fails.
nlohmann::json agentStatus(const std::string& address) {
  auto r = runCommand({binDir() + "/kolo", "status", "--json", "--agent", address}, {}, 30s);
  if (r.code != 0) return nullptr;
  return nlohmann::json::parse(r.out, nullptr, false);
}

// Polls the agent's status until `pred` holds (at most `bound`).
template <class Pred>
bool waitForStatus(const std::string& address, Pred pred, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = agentStatus(address);
    if (!s.is_null() && !s.is_discarded() && pred(s)) return true;
    std::this_thread::sleep_for(100ms);  // bounded poll of a remote state
  }
  return false;
}

std::map<std::string, std::string> rankEnv(const std::string& socket, const std::string& job,
                                           int size) {
  return {{"KOLO_AGENT_SOCKET", socket},
          {"KOLO_JOB_ID", job},
          {"KOLO_JOB_TOKEN", "token-0123456789abcdef"},
          {"KOLO_SIZE", std::to_string(size)},
          {"KOLO_LOCAL_SIZE", "1"},
          {"KOLO_LOCAL_RANK", "0"},
          {"KOLO_START_TIMEOUT", "60"},
          {"KOLO_LOG_LEVEL", "warn"}};
}

// systemd and Kubernetes stop daemons with SIGTERM in any state: here with
// a trainer connected whose job waits for a rank that never comes. The
// agent stops within 1 s with exit code 0, and the trainer is told (it does
// not hang); then the coordinator, which lists the job, stops within 1 s.
TEST_F(KoloCliDaemons, SigtermWithATrainerInAFormingJobStopsEachDaemonWithin1s) {
  const std::string demo = binDir() + "/kolo-demo";
  if (::access(demo.c_str(), X_OK) != 0) GTEST_SKIP() << "kolo-demo is not built";
  TestProcess rank({demo, "1"}, rankEnv(socket_, "job-sigterm", 2), {"KOLO_AGENT_RPC"});
  ASSERT_TRUE(waitForStatus(
      agent_address_, [](const nlohmann::json& s) { return s["clients"].size() == 1; }, 30s))
      << rank.err() << agent_->err();
  auto t0 = std::chrono::steady_clock::now();
  agent_->signal(SIGTERM);
  EXPECT_EQ(agent_->wait(5s), 0) << agent_->err();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << agent_->err();
  auto code = rank.wait(30s);
  ASSERT_TRUE(code.has_value()) << "the trainer hangs after its agent stopped: " << rank.err();
  EXPECT_NE(*code, 0) << rank.err();
  EXPECT_FALSE(rank.err().empty());

  t0 = std::chrono::steady_clock::now();
  coordinator_->signal(SIGTERM);
  EXPECT_EQ(coordinator_->wait(5s), 0) << coordinator_->err();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << coordinator_->err();
}

// kill -9 of kolorun using the system agent: its ranks (here one behind a
// shell wrapper, so the trainer is kolorun's grandchild) die with it, and
// the agent notices and ends their job instead of listing it for good.
TEST_F(KoloCliDaemons, Kill9OfKolorunEndsItsJobOnTheSystemAgent) {
  const std::string demo = binDir() + "/kolo-demo";
  if (::access(demo.c_str(), X_OK) != 0) GTEST_SKIP() << "kolo-demo is not built";
  // Rank 0 joins (and waits for rank 1, which only sleeps): the job forms
  // on the agent and never completes.
  TestProcess run(
      {binDir() + "/kolorun", "-np", "2", "--agent-socket", socket_, "sh", "-c",
       "if [ \"$KOLO_LOCAL_RANK\" = 0 ]; then " + demo + " 1 & wait; else sleep 1000; fi"},
      kQuiet, {"KOLO_AGENT_SOCKET", "KOLO_JOB_ID", "KOLO_JOB_TOKEN", "KOLO_SIZE"});
  ASSERT_TRUE(waitForStatus(
      agent_address_,
      [](const nlohmann::json& s) { return s["clients"].size() == 1 && s["jobs"].size() == 1; },
      30s))
      << run.err() << agent_->err();
  ::kill(run.pid(), SIGKILL);
  ASSERT_EQ(run.wait(10s), 128 + SIGKILL);
  EXPECT_TRUE(waitForStatus(
      agent_address_,
      [](const nlohmann::json& s) { return s["clients"].empty() && s["jobs"].empty(); }, 10s))
      << "the agent still lists the job of a killed kolorun: " << agentStatus(agent_address_).dump()
      << agent_->err();
}

// GET /metrics from the agent's metrics address (the ready file's "metrics=").
std::string agentMetrics(const std::string& ready_file) {
  std::ifstream in(ready_file);
  std::string word, addr;
  while (in >> word) {
    if (word.rfind("metrics=", 0) == 0) addr = word.substr(8);
  }
  if (addr.empty()) return "";
  auto colon = addr.rfind(':');
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &a.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  std::string req = "GET /metrics HTTP/1.0\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (::write(fd.get(), req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// A grpc.health.v1 Check of `service` at `address` (plain text), through
// the generic stub with the two messages encoded by hand (HealthCheckRequest
// {string service = 1}, HealthCheckResponse {ServingStatus status = 1}):
// 1 SERVING, 2 NOT_SERVING, -1 when the call fails.
int healthStatus(const std::string& address, const std::string& service) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0a);
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!out.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.size() == 2 && bytes[0] == 0x08) return bytes[1];
  return bytes.empty() ? 0 : -1;  // 0: UNKNOWN (the default is not sent)
}

TEST_F(KoloCliDaemons, DrainIsVisibleInStatusAndMetricsAndUndrainUndoesIt) {
  auto st = runCommand(kolo({"status", "--agent", agent_address_}), {}, 30s);
  ASSERT_EQ(st.code, 0) << st.err;
  EXPECT_NE(st.out.find("state        serving\n"), std::string::npos) << st.out;
  EXPECT_NE(agentMetrics(tmp_.path() + "/agent.ready").find("\nkolo_agent_draining 0"),
            std::string::npos);

  auto r = runCommand(kolo({"drain", "--agent", agent_address_}), {}, 30s);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("is draining"), std::string::npos) << r.out;
  st = runCommand(kolo({"status", "--agent", agent_address_}), {}, 30s);
  EXPECT_NE(st.out.find("state        draining: admits no new trainers (kolo undrain to resume)\n"),
            std::string::npos)
      << st.out;
  auto js = runCommand(kolo({"status", "--json", "--agent", agent_address_}), {}, 30s);
  EXPECT_EQ(nlohmann::json::parse(js.out)["draining"], true) << js.out;
  EXPECT_NE(agentMetrics(tmp_.path() + "/agent.ready").find("\nkolo_agent_draining 1"),
            std::string::npos);
  // Health: the agent's service reads NOT_SERVING while drained (for
  // readiness probes that name it); the overall service stays SERVING, so a
  // liveness probe does not restart a drained agent.
  EXPECT_EQ(healthStatus(agent_address_, "kolo.agentrpc.Agent"), 2);
  EXPECT_EQ(healthStatus(agent_address_, ""), 1);

  auto u = runCommand(kolo({"undrain", "--agent", agent_address_}), {}, 30s);
  ASSERT_EQ(u.code, 0) << u.err;
  EXPECT_EQ(u.out, "the kolo agent at " + agent_address_ + " takes new jobs again\n");
  st = runCommand(kolo({"status", "--agent", agent_address_}), {}, 30s);
  EXPECT_NE(st.out.find("state        serving\n"), std::string::npos) << st.out;
  EXPECT_NE(agentMetrics(tmp_.path() + "/agent.ready").find("\nkolo_agent_draining 0"),
            std::string::npos);
  EXPECT_EQ(healthStatus(agent_address_, "kolo.agentrpc.Agent"), 1);
  EXPECT_EQ(healthStatus(agent_address_, ""), 1);
}

// CUDA MPS in `kolo status`, --json and /metrics: the agent's pipe
// directory (--mps-pipe-dir) holds a real unix socket named `control`, as
// nvidia-cuda-mps-control -d makes. Without a GPU (this CI) the agent says
// "no GPU" and reports the node's MPS state; with one, a line per GPU.
// Issue 45: the shipped agent.conf's admin token (rpc-auth-token-create)
// makes the socket's group the agent's admins: an outsider (uid 65534, in
// no group) cannot drain or see the trainers' pids; the token's readers can.
class KoloCliSharedNode : public KoloCliDaemons {
 protected:
  void SetUp() override {
    if (::geteuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) {
      GTEST_SKIP() << "needs root and setpriv (runs kolo as uid 65534)";
    }
    token_ = tmp_.path() + "/admin/admin.token";
    extra_agent_args_ = {"--rpc-auth-token-file", token_, "--rpc-auth-token-create",
                         "--socket-group", "65533"};
    KoloCliDaemons::SetUp();
  }
  std::string token_;
};

TEST_F(KoloCliSharedNode, OutsidersCannotDrainOrSeePidsTheGroupsTokenCan) {
  struct stat st {};
  ASSERT_EQ(::stat(token_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_gid, 65533u);
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod((tmp_.path() + "/admin").c_str(), 0755), 0);
  auto outsider = [&](std::vector<std::string> args) {
    std::vector<std::string> cmd = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                    "--clear-groups", binDir() + "/kolo"};
    cmd.insert(cmd.end(), args.begin(), args.end());
    return runCommand(cmd, {}, 30s, {"KOLO_AGENT_TOKEN_FILE", "KOLO_AGENT_TOKEN"});
  };
  auto t0 = std::chrono::steady_clock::now();
  auto r = outsider({"drain", "--agent", agent_address_});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("refused the call: Drain needs a bearer token"), std::string::npos) << r.err;
  r = outsider({"undrain", "--agent", agent_address_});
  EXPECT_NE(r.err.find("Undrain needs a bearer token"), std::string::npos) << r.err;
  r = outsider({"timeline", "start", "--agent", agent_address_, tmp_.path() + "/t.json"});
  EXPECT_NE(r.err.find("Timeline needs a bearer token"), std::string::npos) << r.err;
  r = outsider({"drain", "--agent", agent_address_, "--agent-token-file", token_});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(token_), std::string::npos) << r.err;
  r = outsider({"status", "--agent", agent_address_, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"pids_hidden\": true"), std::string::npos) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  // The token's reader (root here; the socket's group on a node) is an admin.
  auto admin =
      runCommand(kolo({"drain", "--agent", agent_address_, "--agent-token-file", token_}), {}, 30s);
  EXPECT_EQ(admin.code, 0) << admin.err;
  admin = runCommand(
      kolo({"status", "--agent", agent_address_, "--json", "--agent-token-file", token_}), {}, 30s);
  EXPECT_NE(admin.out.find("\"pids_hidden\": false"), std::string::npos) << admin.out;
}

class KoloCliDaemonsWithMps : public KoloCliDaemons {
 protected:
  void SetUp() override {
    pipe_dir_ = tmp_.path() + "/mps";
    ASSERT_EQ(::mkdir(pipe_dir_.c_str(), 0700), 0);
    control_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(control_.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = pipe_dir_ + "/control";
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    ASSERT_EQ(::bind(control_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(control_.get(), 128), 0);
    extra_agent_args_ = {"--mps-pipe-dir", pipe_dir_};
    KoloCliDaemons::SetUp();
  }
  // `kolo status` until its output holds `want` (the agent re-probes every
  // few seconds), or the last output.
  std::string statusUntil(const std::string& want) {
    std::string out;
    for (auto end = std::chrono::steady_clock::now() + 15s;
         std::chrono::steady_clock::now() < end;) {
      auto r = runCommand(kolo({"status", "--agent", agent_address_}), {}, 30s);
      EXPECT_EQ(r.code, 0) << r.err;
      out = r.out;
      if (out.find(want) != std::string::npos) break;
      std::this_thread::sleep_for(200ms);
    }
    return out;
  }
  std::string pipe_dir_;
  UniqueFd control_;
};

TEST_F(KoloCliDaemonsWithMps, StatusAndMetricsShowMpsUpThenDown) {
  const std::string up = "MPS up (pipe " + pipe_dir_ + ")";
  std::string out = statusUntil(up);
  ASSERT_NE(out.find(up), std::string::npos) << out;
  auto js = runCommand(kolo({"status", "--json", "--agent", agent_address_}), {}, 30s);
  ASSERT_EQ(js.code, 0) << js.err;
  auto doc = nlohmann::json::parse(js.out);
  EXPECT_EQ(doc["mps"]["state"], "up") << js.out;
  EXPECT_EQ(doc["mps"]["pipe_dir"], pipe_dir_) << js.out;
  std::string metrics = agentMetrics(tmp_.path() + "/agent.ready");
  EXPECT_NE(metrics.find("# TYPE kolo_mps_up gauge"), std::string::npos) << metrics;
  if (doc["gpus"].empty()) {
    // No GPU here: said so, with the node's state, and one node-level series.
    EXPECT_NE(out.find("no GPU"), std::string::npos) << out;
    EXPECT_NE(out.find("; node " + up + "\n"), std::string::npos) << out;
    EXPECT_FALSE(doc["no_gpu"].get<std::string>().empty()) << js.out;
    EXPECT_NE(metrics.find("\nkolo_mps_up{gpu=\"none\"} 1\n"), std::string::npos) << metrics;
  } else {
    EXPECT_NE(out.find("GPU 0: " + up), std::string::npos) << out;
    EXPECT_EQ(doc["gpus"][0]["mps"]["state"], "up") << js.out;
    EXPECT_NE(metrics.find("\nkolo_mps_up{gpu=\"0\"} 1\n"), std::string::npos) << metrics;
  }

  // The daemon goes away and leaves its socket file behind: down, refused.
  control_.reset();
  out = statusUntil("MPS down: connect refused");
  EXPECT_NE(out.find("MPS down: connect refused on " + pipe_dir_ + "/control"), std::string::npos)
      << out;
  metrics = agentMetrics(tmp_.path() + "/agent.ready");
  EXPECT_EQ(metrics.find("kolo_mps_up{gpu=\"none\"} 1"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("kolo_mps_up{gpu=\"0\"} 1"), std::string::npos) << metrics;

  // And the socket file is gone too.
  ASSERT_EQ(::unlink((pipe_dir_ + "/control").c_str()), 0);
  out = statusUntil("MPS down: no control socket in " + pipe_dir_);
  EXPECT_NE(out.find("MPS down: no control socket in " + pipe_dir_), std::string::npos) << out;
}

#endif

}  // namespace
}  // namespace kolo::clitest
