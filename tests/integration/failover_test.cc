// Several coordinator addresses (docs/coordinator.md "Several coordinator
// addresses") through the real daemons: agents started with
// `--coordinator A,B` keep a running job through the death of coordinator A
// and the start of B on the same state dir (today's journal lets a second
// coordinator take it over), a job formed after the switch forms, `kolo`
// and kolorun given `A,B` with A dead work; every address down and a bad
// entry in the list give clear errors naming the addresses.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A loopback port held bound but not listening, so that nothing else
// takes it while the test needs it dead (a connection is refused); release()
// just before a coordinator is started there.
class ReservedPort {
 public:
  ReservedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~ReservedPort() { release(); }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  bool ok() const { return port_ > 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Bounded wait until `p`'s output holds `needle`.
bool waitForText(Proc& p, const std::string& needle, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (p.output().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);  // polling a log file
  }
  return false;
}

// A process the test owns: stopped and reaped whatever happens.
struct Owned {
  Proc p;
  ~Owned() {
    if (p.pid > 0 && !p.exited) {
      killProcess(p, SIGKILL);
      waitProcess(p, 5s);
    }
  }
};

// Starts kolo-coordinator at `listen` on `state_dir` (the harness's lease).
bool startCoordinator(Owned& c, const std::string& dir, const std::string& name,
                      const std::string& listen, const std::string& state_dir,
                      std::string* address) {
  c.p = spawnProcess({binDir() + "/kolo-coordinator", "--listen", listen, "--ready-file",
                      dir + "/" + name + ".ready", "--lease-ms", "3000", "--heartbeat-interval-ms",
                      "500", "--state-dir", state_dir},
                     {}, dir + "/" + name + ".log");
  return waitForFile(dir + "/" + name + ".ready", c.p, 20s, address);
}

// A stand-in for a standby kolo-coordinator (the real one lives in
// coordinator/ with the etcd election): a gRPC server that answers every
// call with the standby's answer, UNAVAILABLE `standby: ... the leader is at
// LEADER`, as docs/coordinator.md specifies.
class StandbyStandIn final : public grpc::CallbackGenericService {
 public:
  explicit StandbyStandIn(const std::string& leader)
      : answer_("standby: this kolo-coordinator is not the leader; the leader is at " + leader) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterCallbackGenericService(this);
    server_ = b.BuildAndStart();
  }
  ~StandbyStandIn() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Answer : public grpc::ServerGenericBidiReactor {
     public:
      explicit Answer(const std::string& msg) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, msg));
      }
      void OnDone() override { delete this; }
    };
    return new Answer(answer_);
  }

 private:
  std::string answer_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Agents given `STANDBY,DEAD,LEADER` go from the standby straight to the
// leader it names (not to the dead address next in the list); `kolo` too.
TEST(CoordinatorFailover, AStandbysLeaderHintIsFollowed) {
  ReservedPort port_a, port_dead;
  ASSERT_TRUE(port_a.ok() && port_dead.ok());
  const std::string a = port_a.address();
  const std::string dead = port_dead.address();
  StandbyStandIn standby(a);
  const std::string s = standby.address();
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_listen = a;
  o.agent_coordinator_prefix = s + "," + dead + ",";
  port_a.release();
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  for (int i = 0; i < 2; ++i) {
    const std::string log = c.agentLog(i);
    EXPECT_NE(log.find("coordinator at " + s + " unavailable (standby: "), std::string::npos)
        << log;
    EXPECT_NE(log.find("trying " + a + " (the leader it named)"), std::string::npos) << log;
    EXPECT_EQ(log.find("trying " + dead), std::string::npos) << log;
    EXPECT_NE(log.find("registered with coordinator " + a), std::string::npos) << log;
  }
  auto job = c.launchMultiJob("job-fo4", {1, 1}, {binDir() + "/kolo_check", "loop", "20"});
  ASSERT_TRUE(c.waitJob(job, 30s)) << allLogs(c, 2);
  for (auto& r : job) EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
  Proc jobs = spawnProcess({binDir() + "/kolo", "jobs", "--coordinator", s + "," + dead + "," + a},
                           {}, c.dir() + "/kolo-jobs.log");
  ASSERT_TRUE(waitProcess(jobs, 15s));
  EXPECT_EQ(jobs.exit_code, 0) << jobs.output();
  EXPECT_NE(jobs.output().find("job-fo4"), std::string::npos) << jobs.output();
}

TEST(CoordinatorFailover, RunningJobSurvivesTheLeaderChange) {
  ReservedPort port_b;
  ASSERT_TRUE(port_b.ok());
  const std::string b = port_b.address();
  char tmpl[] = "/tmp/kolo-failover-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string state = std::string(tmpl) + "/state";
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_args = {"--state-dir", state};
  o.agent_coordinator_suffix = "," + b;
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string a = c.coordinatorAddress();
  const std::string both = a + "," + b;

  // Job 1: 2 agents x 2 ranks, exact allreduces until told to stop.
  const std::string stop = c.dir() + "/stop";
  auto job1 = c.launchMultiJob("job-fo1", {2, 2}, {binDir() + "/kolo_check", "until", stop});
  ASSERT_TRUE(waitForText(job1[0], "training", 30s)) << job1[0].output() << allLogs(c, 2);

  // kill -9 A mid-training; B takes over the state dir on another port.
  killProcess(c.coordinator(), SIGKILL);
  ASSERT_TRUE(waitProcess(c.coordinator(), 5s));
  Owned coord_b;
  std::string b_ready;
  const auto killed = Clock::now();
  port_b.release();
  ASSERT_TRUE(startCoordinator(coord_b, c.dir(), "coord-b", b, state, &b_ready))
      << coord_b.p.output();
  const auto b_up = Clock::now();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(waitForText(c.agent(i), "now using the coordinator at " + b, 10s))
        << "agent " << i << " did not reach B\n"
        << allLogs(c, 2) << coord_b.p.output();
  }
  const double reached = std::chrono::duration<double>(Clock::now() - b_up).count();
  std::printf(
      "[failover] B ready %.2f s after kill -9 of A; both agents use B %.2f s after B was "
      "ready\n",
      std::chrono::duration<double>(b_up - killed).count(), reached);
  EXPECT_NE(c.agentLog(0).find("coordinator at " + a + " unavailable"), std::string::npos)
      << c.agentLog(0);

  // A job formed right after the switch forms (JoinJob, KV and watch on B).
  auto job2 = c.launchMultiJob("job-fo2", {1, 1}, {binDir() + "/kolo_check", "loop", "20"});
  ASSERT_TRUE(c.waitJob(job2, 30s)) << allLogs(c, 2);
  for (auto& r : job2) EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);

  // kolo with A (dead) first in the list: answered by B; job 1 still RUNNING.
  Proc jobs = spawnProcess({binDir() + "/kolo", "jobs", "--coordinator", both, "--json"}, {},
                           c.dir() + "/kolo-jobs.log");
  ASSERT_TRUE(waitProcess(jobs, 15s));
  EXPECT_EQ(jobs.exit_code, 0) << jobs.output();
  EXPECT_NE(jobs.output().find("job-fo1"), std::string::npos) << jobs.output();
  EXPECT_NE(jobs.output().find("RUNNING"), std::string::npos) << jobs.output();

  // kolorun on agent 0 with KOLO_COORDINATOR=A,B: the ranks get the list.
  Proc run = spawnProcess({binDir() + "/kolorun", "-np", "2", "--agent-socket", c.socket(0),
                           binDir() + "/kolo_check", "loop", "10"},
                          {{"KOLO_COORDINATOR", both}}, c.dir() + "/kolorun.log");
  ASSERT_TRUE(waitProcess(run, 30s)) << run.output();
  EXPECT_EQ(run.exit_code, 0) << run.output() << allLogs(c, 2);

  // Job 1 finishes with exact results on every rank.
  { std::ofstream(stop) << "stop\n"; }
  ASSERT_TRUE(c.waitJob(job1, 30s)) << allLogs(c, 2);
  for (auto& r : job1) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << allLogs(c, 2);
    EXPECT_NE(r.output().find("allreduces until stopped"), std::string::npos) << r.output();
  }
  // ...and its agents' LeaveJob reached B: FINISHED there.
  bool finished = false;
  std::string listing;
  for (const auto until = Clock::now() + 10s; !finished && Clock::now() < until;) {
    Proc l = spawnProcess({binDir() + "/kolo", "jobs", "--coordinator", both, "--json"}, {},
                          c.dir() + "/kolo-jobs-end.log");
    if (!waitProcess(l, 10s)) break;
    listing = l.output();
    const size_t at = listing.find("\"job-fo1\"");
    finished = at != std::string::npos && listing.find("FINISHED", at) < listing.find('}', at);
    if (!finished) std::this_thread::sleep_for(100ms);  // polling the listing
  }
  EXPECT_TRUE(finished) << listing << allLogs(c, 2);
  std::filesystem::remove_all(tmpl);
}

// No coordinator comes back: the job fails once the watch is not opened
// again within --coordinator-watch-retry-s (30 s by default; 3 s here),
// naming every address and why each failed.
TEST(CoordinatorFailover, NoCoordinatorBackFailsTheJobNamingEveryAddress) {
  ReservedPort port_b;  // never started
  ASSERT_TRUE(port_b.ok());
  const std::string b = port_b.address();
  ClusterOptions o;
  o.agents = 2;
  o.agent_coordinator_suffix = "," + b;
  o.agent_env = {{"KOLO_COORDINATOR_WATCH_RETRY_S", "3"}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string a = c.coordinatorAddress();
  auto job =
      c.launchMultiJob("job-fo3", {1, 1}, {binDir() + "/kolo_check", "until", c.dir() + "/never"});
  ASSERT_TRUE(waitForText(job[0], "training", 30s)) << job[0].output() << allLogs(c, 2);
  killProcess(c.coordinator(), SIGKILL);
  ASSERT_TRUE(waitProcess(c.coordinator(), 5s));
  const auto killed = Clock::now();
  ASSERT_TRUE(c.waitJob(job, 20s)) << allLogs(c, 2);
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  std::printf("[failover] no coordinator: the job failed %.2f s after the kill (watch retry 3 s)\n",
              took);
  EXPECT_GE(took, 2.5);
  for (auto& r : job) EXPECT_NE(r.exit_code, 0) << r.output();
  const std::string want =
      "lost the watch on job job-fo3 at coordinators " + a + ", " + b + " (" + a + ": ";
  // The agent whose watch gives up first fails the job with that reason;
  // the other may see its peer go first (the job is gone before its own
  // watch gives up).
  int named = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string log = c.agentLog(i);
    const size_t at = log.find(want);
    if (at != std::string::npos && log.find("; " + b + ": ", at) != std::string::npos) ++named;
  }
  EXPECT_GE(named, 1) << allLogs(c, 2);
  bool rank_told = false;
  for (auto& r : job) {
    rank_told |=
        r.output().find("lost the watch on job job-fo3 at coordinators") != std::string::npos;
  }
  EXPECT_TRUE(rank_told) << job[0].output() << job[1].output();
}

// A leader that stops answering without closing its connections (a
// frozen process, a host gone without a reset): heartbeats that get no
// answer within their interval move the agents on to the next address. (B
// here has its own empty state: the agents register there again.)
TEST(CoordinatorFailover, AFrozenCoordinatorIsLeftForTheNext) {
  ReservedPort port_b;
  ASSERT_TRUE(port_b.ok());
  const std::string b = port_b.address();
  ClusterOptions o;
  o.agents = 2;
  o.agent_coordinator_suffix = "," + b;
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  char tmpl[] = "/tmp/kolo-failover-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  Owned coord_b;
  std::string b_ready;
  port_b.release();
  ASSERT_TRUE(
      startCoordinator(coord_b, c.dir(), "coord-b", b, std::string(tmpl) + "/state", &b_ready))
      << coord_b.p.output();
  killProcess(c.coordinator(), SIGSTOP);
  const auto frozen = Clock::now();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(waitForText(c.agent(i), "registered with coordinator " + b, 10s)) << c.agentLog(i);
  }
  std::printf(
      "[failover] A frozen: both agents registered with B %.2f s later (heartbeat interval 0.5 "
      "s)\n",
      std::chrono::duration<double>(Clock::now() - frozen).count());
  EXPECT_NE(c.agentLog(0).find("coordinator at " + c.coordinatorAddress() +
                               " unavailable (Deadline Exceeded)"),
            std::string::npos)
      << c.agentLog(0);
  killProcess(c.coordinator(), SIGKILL);
  waitProcess(c.coordinator(), 5s);
  std::filesystem::remove_all(tmpl);
}

TEST(CoordinatorFailover, EveryAddressDownNamesThemAll) {
  ReservedPort port_a, port_b;  // both dead
  ASSERT_TRUE(port_a.ok() && port_b.ok());
  const std::string a = port_a.address();
  const std::string b = port_b.address();
  char tmpl[] = "/tmp/kolo-failover-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  // The agent gives up registering after --register-timeout-s as before.
  const auto t0 = Clock::now();
  Proc agent =
      spawnProcess({binDir() + "/kolo-agent", "--socket", dir + "/agent.sock", "--coordinator",
                    a + "," + b, "--rpc-listen", "127.0.0.1:0", "--register-timeout-s", "2"},
                   {}, dir + "/agent.log");
  ASSERT_TRUE(waitProcess(agent, 15s)) << agent.output();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(agent.exit_code, 1) << agent.output();
  EXPECT_LT(took, 6.0) << agent.output();
  const std::string out = agent.output();
  EXPECT_NE(out.find("cannot register with the coordinator at any of " + a + ", " + b),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(a + ": "), std::string::npos) << out;
  EXPECT_NE(out.find(b + ": "), std::string::npos) << out;
  EXPECT_NE(out.find("nothing is listening at " + b), std::string::npos) << out;

  // kolo: within its 5 s deadline, naming both.
  const auto t1 = Clock::now();
  Proc jobs = spawnProcess({binDir() + "/kolo", "jobs", "--coordinator", a + "," + b}, {},
                           dir + "/kolo.log");
  ASSERT_TRUE(waitProcess(jobs, 15s));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 6.0);
  EXPECT_EQ(jobs.exit_code, 1) << jobs.output();
  EXPECT_NE(jobs.output().find("cannot reach a kolo coordinator at any of " + a + ", " + b),
            std::string::npos)
      << jobs.output();
  std::filesystem::remove_all(dir);
}

TEST(CoordinatorFailover, ABadEntryIsNamed) {
  char tmpl[] = "/tmp/kolo-failover-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Proc agent = spawnProcess({binDir() + "/kolo-agent", "--socket", dir + "/agent.sock",
                             "--coordinator", "127.0.0.1:7470,node-b"},
                            {}, dir + "/agent.log");
  ASSERT_TRUE(waitProcess(agent, 15s)) << agent.output();
  EXPECT_EQ(agent.exit_code, 2) << agent.output();
  EXPECT_NE(agent.output().find(
                "--coordinator \"127.0.0.1:7470,node-b\": entry 2 (\"node-b\") is not host:port"),
            std::string::npos)
      << agent.output();

  Proc jobs = spawnProcess({binDir() + "/kolo", "agents", "--coordinator", "a:1,b:99999"}, {},
                           dir + "/kolo.log");
  ASSERT_TRUE(waitProcess(jobs, 15s));
  EXPECT_EQ(jobs.exit_code, 2) << jobs.output();
  EXPECT_NE(jobs.output().find("entry 2 (\"b:99999\") has port 99999"), std::string::npos)
      << jobs.output();

  // kolorun hands KOLO_COORDINATOR to the ranks of a job on a running agent.
  Cluster c(1);
  ASSERT_TRUE(c.ok()) << c.error();
  Proc run =
      spawnProcess({binDir() + "/kolorun", "-np", "1", "--agent-socket", c.socket(0), "true"},
                   {{"KOLO_COORDINATOR", "a:1, :2"}}, dir + "/kolorun.log");
  ASSERT_TRUE(waitProcess(run, 30s));
  EXPECT_NE(run.exit_code, 0) << run.output();
  EXPECT_NE(run.output().find("KOLO_COORDINATOR \"a:1, :2\": entry 2 (\":2\") has no host"),
            std::string::npos)
      << run.output();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kolo::testing
