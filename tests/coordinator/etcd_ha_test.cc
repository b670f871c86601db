// High availability on etcd with the real binaries: etcd and several
// kolo-coordinator processes started the way a user starts them
// (--etcd-endpoints ...). One leads; the standbys answer UNAVAILABLE
// "standby: ..." and health NOT_SERVING; kill -9 of the leader hands over to
// a standby within the election TTL plus a bound, with the agents, jobs and
// keys; etcd restarting under a leader; etcd unreachable. Skipped when
// /usr/bin/etcd is missing. Failover times are printed (docs/coordinator.md).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "coordinator/ha/etcd_client.h"
#include "health.grpc.pb.h"
#include "kolo/proto/coordinator.grpc.pb.h"
#include "tests/coordinator/coordinator_process.h"
#include "tests/coordinator/etcd_process.h"
#include "tests/coordinator/raw_calls.h"

#ifndef KOLO_COORDINATOR_BIN
#error "KOLO_COORDINATOR_BIN must name the kolo-coordinator binary"
#endif

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;
using testing::CoordinatorProcess;
using testing::EtcdProcess;

constexpr int kTtlMs = 2000;  // etcd's minimum lease TTL (2 s with its default election timeout)

std::unique_ptr<grpc::ClientContext> ctxWithDeadline(milliseconds d) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

struct Client {
  explicit Client(const std::string& address) : address(address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub = coord::Coordinator::NewStub(channel);
  }
  grpc::Status listJobs(coord::ListJobsReply* reply, milliseconds d = milliseconds(1000)) {
    auto ctx = ctxWithDeadline(d);
    return stub->ListJobs(ctx.get(), coord::ListJobsRequest(), reply);
  }
  grpc::Status listAgents(coord::ListAgentsReply* reply) {
    auto ctx = ctxWithDeadline(milliseconds(2000));
    return stub->ListAgents(ctx.get(), coord::ListAgentsRequest(), reply);
  }
  grpc::Status registerAgent(const std::string& id, std::string* secret) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname("host-" + id);
    req.mutable_agent()->set_rpc_address("host-" + id + ":7471");
    coord::RegisterAgentReply reply;
    auto ctx = ctxWithDeadline(milliseconds(6000));
    grpc::Status st = stub->RegisterAgent(ctx.get(), req, &reply);
    if (st.ok() && secret != nullptr) *secret = reply.agent_secret();
    return st;
  }
  grpc::Status join(const std::string& job, const std::string& agent, const std::string& secret) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token("token-" + job);
    req.set_agent_id(agent);
    req.set_agent_secret(secret);
    req.set_local_size(1);
    req.set_world_size(1);
    coord::JoinJobReply reply;
    auto ctx = ctxWithDeadline(milliseconds(6000));
    return stub->JoinJob(ctx.get(), req, &reply);
  }
  grpc::Status kvPut(const std::string& job, const std::string& key, const std::string& value) {
    coord::KvPutRequest req;
    req.set_job_id(job);
    req.set_token("token-" + job);
    req.set_key(key);
    req.set_value(value);
    coord::KvPutReply reply;
    auto ctx = ctxWithDeadline(milliseconds(6000));
    return stub->KvPut(ctx.get(), req, &reply);
  }
  grpc::Status kvGet(const std::string& job, const std::string& key, coord::KvGetReply* reply) {
    coord::KvGetRequest req;
    req.set_job_id(job);
    req.set_token("token-" + job);
    req.set_key(key);
    auto ctx = ctxWithDeadline(milliseconds(2000));
    return stub->KvGet(ctx.get(), req, reply);
  }
  grpc::Status heartbeat(const std::string& agent, const std::string& secret, bool* known) {
    coord::HeartbeatRequest req;
    req.set_agent_id(agent);
    req.set_agent_secret(secret);
    coord::HeartbeatReply reply;
    auto ctx = ctxWithDeadline(milliseconds(2000));
    grpc::Status st = stub->Heartbeat(ctx.get(), req, &reply);
    *known = reply.known();
    return st;
  }
  grpc::health::v1::HealthCheckResponse::ServingStatus health(
      const std::string& service = "kolo.coord.Coordinator") {
    auto h = grpc::health::v1::Health::NewStub(channel);
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = ctxWithDeadline(milliseconds(2000));
    if (!h->Check(ctx.get(), req, &resp).ok())
      return grpc::health::v1::HealthCheckResponse::UNKNOWN;
    return resp.status();
  }

  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<coord::Coordinator::Stub> stub;
};

class EtcdHaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) {
      GTEST_SKIP() << "no etcd binary (/usr/bin/etcd, or set KOLO_ETCD_BIN): apt-get install "
                      "etcd-server";
    }
    std::string error;
    ASSERT_TRUE(etcd_.start(milliseconds(15000), &error)) << error;
  }

  std::vector<std::string> flags(int ttl_ms = kTtlMs) const {
    return {"--etcd-endpoints", etcd_.endpoint(), "--etcd-prefix", "/kolo/ha-test/",
            "--election-ttl-ms", std::to_string(ttl_ms),
            // Long agent leases: the test's agents do not heartbeat while it waits.
            "--lease-ms", "30000", "--heartbeat-interval-ms", "1000", "--etcd-connect-timeout-ms",
            "5000"};
  }

  // Starts one more coordinator; its index.
  size_t startCoordinator(int ttl_ms = kTtlMs) {
    auto p = std::make_unique<CoordinatorProcess>();
    std::string error;
    EXPECT_TRUE(p->start(KOLO_COORDINATOR_BIN, flags(ttl_ms), milliseconds(10000), &error))
        << error << "\n"
        << p->log();
    clients_.push_back(std::make_unique<Client>(p->address()));
    procs_.push_back(std::move(p));
    return procs_.size() - 1;
  }

  bool alive(size_t i) const { return procs_[i] != nullptr; }

  // Waits (bounded) until exactly one live coordinator answers; its index, or -1.
  int waitForLeader(milliseconds timeout, milliseconds* took = nullptr) {
    auto t0 = SteadyClock::now();
    while (SteadyClock::now() - t0 < timeout) {
      int leader = -1;
      int leaders = 0;
      for (size_t i = 0; i < procs_.size(); ++i) {
        if (!alive(i)) continue;
        coord::ListJobsReply reply;
        if (clients_[i]->listJobs(&reply, milliseconds(300)).ok()) {
          leader = static_cast<int>(i);
          ++leaders;
        }
      }
      EXPECT_LE(leaders, 1) << "two coordinators serve at once";
      if (leaders == 1) {
        if (took != nullptr) {
          *took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0);
        }
        return leader;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return -1;
  }

  // Every live coordinator but `leader` is a standby naming it.
  void expectStandbys(int leader) {
    for (size_t i = 0; i < procs_.size(); ++i) {
      if (!alive(i) || static_cast<int>(i) == leader) continue;
      coord::ListJobsReply reply;
      // A standby names the leader once it has read the election key (its
      // first campaign, or the one after a failover, may still be under way:
      // then it says "no leader is elected yet"). Bounded wait.
      grpc::Status st;
      auto deadline = SteadyClock::now() + milliseconds(3000);
      do {
        st = clients_[i]->listJobs(&reply);
        if (st.error_message().find("the leader is at") != std::string::npos) break;
        std::this_thread::sleep_for(milliseconds(20));
      } while (SteadyClock::now() < deadline);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << i;
      EXPECT_EQ(st.error_message().rfind("standby: ", 0), 0u) << st.error_message();
      EXPECT_NE(st.error_message().find("the leader is at " + procs_[leader]->address()),
                std::string::npos)
          << st.error_message();
      std::string secret;
      st = clients_[i]->registerAgent("refused", &secret);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_EQ(st.error_message().rfind("standby: ", 0), 0u) << st.error_message();
      bool known = true;
      st = clients_[i]->heartbeat("a", "s", &known);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_EQ(st.error_message().rfind("standby: ", 0), 0u) << st.error_message();
      coord::KvGetReply kv;
      st = clients_[i]->kvGet("j", "k", &kv);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_EQ(clients_[i]->health(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
      EXPECT_EQ(clients_[i]->health(""), grpc::health::v1::HealthCheckResponse::SERVING)
          << "alive: a liveness probe must not restart a standby";
    }
  }

  void killLeader(int i) {
    procs_[i]->signal(SIGKILL);
    procs_[i]->waitExit(milliseconds(5000));
    procs_[i].reset();
  }

  // State the tests put in through the leader and find again after a failover.
  void putState(Client& leader) {
    ASSERT_TRUE(leader.registerAgent("agent-1", &secret_).ok());
    ASSERT_TRUE(leader.join("job-1", "agent-1", secret_).ok());
    ASSERT_TRUE(leader.kvPut("job-1", "nccl-id", std::string("\x00\x01id", 4)).ok());
  }
  void expectState(Client& leader) {
    coord::ListAgentsReply agents;
    ASSERT_TRUE(leader.listAgents(&agents).ok());
    ASSERT_EQ(agents.agents_size(), 1);
    EXPECT_EQ(agents.agents(0).agent().agent_id(), "agent-1");
    coord::ListJobsReply jobs;
    ASSERT_TRUE(leader.listJobs(&jobs).ok());
    ASSERT_EQ(jobs.jobs_size(), 1);
    EXPECT_EQ(jobs.jobs(0).job_id(), "job-1");
    EXPECT_EQ(jobs.jobs(0).state(), coord::RUNNING);
    EXPECT_EQ(jobs.jobs(0).generation(), 1u);
    coord::KvGetReply kv;
    ASSERT_TRUE(leader.kvGet("job-1", "nccl-id", &kv).ok());
    EXPECT_TRUE(kv.found());
    EXPECT_EQ(kv.value(), std::string("\x00\x01id", 4));
    bool known = false;
    ASSERT_TRUE(leader.heartbeat("agent-1", secret_, &known).ok());
    EXPECT_TRUE(known) << "the agent keeps its registration (a fresh lease) across the failover";
  }

  std::string logs() const {
    std::string out;
    for (const auto& p : procs_) {
      if (p != nullptr) out += "--- " + p->address() + "\n" + p->log();
    }
    return out;
  }

  EtcdProcess etcd_;
  std::vector<std::unique_ptr<CoordinatorProcess>> procs_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::string secret_;
};

TEST_F(EtcdHaTest, TwoCoordinatorsOneLeadsTheOtherStandsBy) {
  startCoordinator();
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  EXPECT_EQ(clients_[leader]->health(), grpc::health::v1::HealthCheckResponse::SERVING);
  expectStandbys(leader);
}

// Issue 47: a standby answers every call "standby: ..." and finishes it
// before the client's cancel arrives; gRPC then also runs OnCancel. Before,
// WatchJob finished such a call twice and the standby aborted on valid
// requests. Valid and malformed streaming calls, cancelled at once or 1 ms
// later, at the standby: it stays up, a standby, and the leader serves.
TEST_F(EtcdHaTest, AStandbySurvivesValidAndMalformedStreamingCallsCancelledAtOnce) {
  startCoordinator();
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  const size_t standby = leader == 0 ? 1 : 0;
  auto channel =
      grpc::CreateChannel(procs_[standby]->address(), grpc::InsecureChannelCredentials());
  coord::WatchJobRequest watch;
  watch.set_job_id("job-1");
  watch.set_token("t");
  coord::HeartbeatRequest hb;
  hb.set_agent_id("a");
  hb.set_agent_secret("s");
  coord::KvGetRequest get;
  get.set_job_id("job-1");
  get.set_key("k");
  get.set_wait_ms(1000);
  const std::pair<const char*, std::string> calls[] = {
      {"/kolo.coord.Coordinator/WatchJob", watch.SerializeAsString()},
      {"/kolo.coord.Coordinator/HeartbeatStream", hb.SerializeAsString()},
      {"/kolo.coord.Coordinator/KvGet", get.SerializeAsString()},
      {"/kolo.coord.Coordinator/WatchJob", testing::unparseableBytes(0)}};
  int unfinished = 0;
  for (int i = 0; i < 300; ++i) {
    const auto& [method, bytes] = calls[i % 4];
    if (!testing::rawCallCancelled(channel, method, bytes, milliseconds(i % 2)).finished) {
      ++unfinished;
    }
  }
  EXPECT_EQ(unfinished, 0);
  ASSERT_FALSE(procs_[standby]->waitExit(milliseconds(0)).has_value())
      << "the standby died: " << procs_[standby]->log();
  expectStandbys(leader);
  putState(*clients_[leader]);
}

TEST_F(EtcdHaTest, KillingTheLeaderOfThreeHandsOverWithTheState) {
  for (int i = 0; i < 3; ++i) startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  expectStandbys(leader);
  putState(*clients_[leader]);

  auto t0 = SteadyClock::now();
  killLeader(leader);
  milliseconds took{};
  int next = waitForLeader(milliseconds(kTtlMs + 5000), &took);
  ASSERT_GE(next, 0) << logs();
  auto failover = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0);
  std::printf("failover after kill -9 of the leader: %lld ms (election TTL %d ms)\n",
              static_cast<long long>(failover.count()), kTtlMs);
  EXPECT_LT(failover.count(), kTtlMs + 2000) << "TTL + 2 s";
  expectStandbys(next);
  expectState(*clients_[next]);
}

TEST_F(EtcdHaTest, AStoppedLeaderResignsAndAStandbyTakesOverAtOnce) {
  startCoordinator();
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  putState(*clients_[leader]);
  auto t0 = SteadyClock::now();
  procs_[leader]->signal(SIGTERM);
  auto status = procs_[leader]->waitExit(milliseconds(5000));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  procs_[leader].reset();
  int next = waitForLeader(milliseconds(kTtlMs + 5000));
  ASSERT_GE(next, 0) << logs();
  auto took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0);
  std::printf("failover after SIGTERM of the leader: %lld ms\n",
              static_cast<long long>(took.count()));
  EXPECT_LT(took.count(), kTtlMs) << "the lease is revoked: no wait for the TTL";
  expectState(*clients_[next]);
}

// Failover time over several kills (KOLO_HA_FAILOVER_REPEATS, default 3;
// docs/coordinator.md has the figure for 10): median and max.
TEST_F(EtcdHaTest, FailoverTime) {
  int repeats = 3;
  if (const char* env = std::getenv("KOLO_HA_FAILOVER_REPEATS")) repeats = std::atoi(env);
  startCoordinator();
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  putState(*clients_[leader]);
  std::vector<long long> times;
  for (int r = 0; r < repeats; ++r) {
    // Let the leader renew its lease at least once, like a leader that ran a while.
    std::this_thread::sleep_for(milliseconds(300));
    auto t0 = SteadyClock::now();
    killLeader(leader);
    leader = waitForLeader(milliseconds(kTtlMs + 5000));
    ASSERT_GE(leader, 0) << logs();
    times.push_back(std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0).count());
    startCoordinator();  // the next standby
  }
  expectState(*clients_[leader]);
  std::sort(times.begin(), times.end());
  std::printf("failover over %d kills (election TTL %d ms): median %lld ms, max %lld ms\n", repeats,
              kTtlMs, times[times.size() / 2], times.back());
  EXPECT_LT(times.back(), kTtlMs + 2000);
}

TEST_F(EtcdHaTest, EtcdRestartingUnderALeaderKeepsItLeading) {
  size_t first = startCoordinator(5000);
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_EQ(leader, static_cast<int>(first)) << logs();
  putState(*clients_[leader]);

  etcd_.stop(SIGTERM);
  std::string error;
  ASSERT_TRUE(etcd_.start(milliseconds(10000), &error)) << error;
  // The leader renews its lease again and writes again (bounded wait).
  auto deadline = SteadyClock::now() + milliseconds(10000);
  grpc::Status st;
  std::string secret;
  do {
    st = clients_[leader]->registerAgent("agent-2", &secret);
  } while (!st.ok() && SteadyClock::now() < deadline);
  ASSERT_TRUE(st.ok()) << st.error_message() << "\n" << logs();
  EXPECT_FALSE(procs_[leader]->waitExit(milliseconds(0)).has_value()) << "still running";
  coord::ListAgentsReply agents;
  ASSERT_TRUE(clients_[leader]->listAgents(&agents).ok());
  EXPECT_EQ(agents.agents_size(), 2);
  // And a coordinator started now loads both agents if it leads.
  procs_[leader]->signal(SIGTERM);
  EXPECT_TRUE(procs_[leader]->waitExit(milliseconds(5000)).has_value());
  procs_[leader].reset();
  startCoordinator();
  int next = waitForLeader(milliseconds(5000));
  ASSERT_GE(next, 0) << logs();
  ASSERT_TRUE(clients_[next]->listAgents(&agents).ok());
  EXPECT_EQ(agents.agents_size(), 2);
}

// Someone deletes the election key under a live leader (an operator, or a
// split where etcd expired the lease): a standby wins at once, so the old
// leader must stop serving and exit; never two leaders serving.
TEST_F(EtcdHaTest, AFencedLeaderStopsServingAndExits) {
  startCoordinator();
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  putState(*clients_[leader]);
  ha::EtcdOptions o;
  o.endpoints = {etcd_.endpoint()};
  auto etcd = ha::EtcdClient::create(o);
  ASSERT_TRUE(etcd.isOk());
  ASSERT_TRUE((*etcd)->deleteRange("/kolo/ha-test/leader").isOk());
  auto status = procs_[leader]->waitExit(milliseconds(kTtlMs + 3000));
  ASSERT_TRUE(status.has_value()) << logs();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3);
  std::string log = procs_[leader]->log();
  EXPECT_NE(log.find("fenced: "), std::string::npos) << log;
  procs_[leader].reset();
  int next = waitForLeader(milliseconds(kTtlMs + 3000));
  ASSERT_GE(next, 0) << logs();
  expectState(*clients_[next]);
}

// A 3-member etcd: the coordinators get every endpoint; the member they
// talk to is killed under the leader, which goes on leading through another
// member (the cluster keeps its quorum).
TEST(EtcdHaClusterTest, ALeaderSurvivesTheLossOfItsEtcdMember) {
  if (EtcdProcess::binary().empty()) GTEST_SKIP() << "no etcd binary (/usr/bin/etcd)";
  EtcdProcess members[3];
  int client_ports[3], peer_ports[3];
  std::string initial_cluster, endpoints;
  for (int i = 0; i < 3; ++i) {
    client_ports[i] = testing::freePort();
    peer_ports[i] = testing::freePort();
    initial_cluster += (i ? "," : "") + std::string("m") + std::to_string(i) +
                       "=http://127.0.0.1:" + std::to_string(peer_ports[i]);
    endpoints += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(client_ports[i]);
  }
  for (int i = 0; i < 3; ++i) {
    members[i].setMember("m" + std::to_string(i), client_ports[i], peer_ports[i], initial_cluster);
    std::string error;
    ASSERT_TRUE(members[i].start(milliseconds(15000), &error, /*wait=*/i == 2)) << error;
  }
  CoordinatorProcess coord;
  std::string error;
  ASSERT_TRUE(coord.start(KOLO_COORDINATOR_BIN,
                          {"--etcd-endpoints", endpoints, "--election-ttl-ms", "3000", "--lease-ms",
                           "30000", "--etcd-connect-timeout-ms", "10000"},
                          milliseconds(15000), &error))
      << error;
  Client client(coord.address());
  auto deadline = SteadyClock::now() + milliseconds(10000);
  std::string secret;
  grpc::Status st;
  do {
    st = client.registerAgent("agent-1", &secret);
  } while (!st.ok() && SteadyClock::now() < deadline);
  ASSERT_TRUE(st.ok()) << st.error_message() << "\n" << coord.log();
  // The client starts with the first endpoint.
  members[0].stop(SIGKILL);
  deadline = SteadyClock::now() + milliseconds(10000);
  do {
    st = client.registerAgent("agent-2", &secret);
  } while (!st.ok() && SteadyClock::now() < deadline);
  ASSERT_TRUE(st.ok()) << st.error_message() << "\n" << coord.log();
  // Past the election TTL: still the leader (renewed through another member).
  std::this_thread::sleep_for(milliseconds(3500));
  EXPECT_FALSE(coord.waitExit(milliseconds(0)).has_value()) << coord.log();
  coord::ListAgentsReply agents;
  ASSERT_TRUE(client.listAgents(&agents).ok()) << coord.log();
  EXPECT_EQ(agents.agents_size(), 2);
}

TEST(EtcdHaFlagsTest, BadEtcdFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--etcd-endpoints", "127.0.0.1:2379", "--state-dir", "/tmp/x"},
            "--state-dir and --etcd-endpoints are mutually exclusive"},
           {{"--etcd-endpoints", "nohost"}, "is not host:port"},
           {{"--etcd-endpoints", "https://127.0.0.1:2379"}, "TLS to etcd is not supported"},
           {{"--etcd-endpoints", "127.0.0.1:2379", "--etcd-prefix", "kolo"},
            "--etcd-prefix must start with '/'"},
           {{"--etcd-endpoints", "127.0.0.1:2379", "--election-ttl-ms", "-1"},
            "--election-ttl-ms must not be negative"},
           {{"--etcd-endpoints", "127.0.0.1:2379", "--advertise-address", "host"},
            "--advertise-address must be host:port"},
       }) {
    auto r = testing::runToCompletion(KOLO_COORDINATOR_BIN, c.args, milliseconds(10000));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
  }
}

TEST_F(EtcdHaTest, EtcdUnreachableAtStartIsAClearErrorWithinTheBound) {
  std::string endpoint = "127.0.0.1:" + std::to_string(testing::freePort());
  auto t0 = SteadyClock::now();
  auto r = testing::runToCompletion(KOLO_COORDINATOR_BIN,
                                    {"--listen", "127.0.0.1:0", "--etcd-endpoints", endpoint,
                                     "--etcd-connect-timeout-ms", "1000"},
                                    milliseconds(10000));
  auto took = SteadyClock::now() - t0;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot reach etcd at " + endpoint + " within 1000 ms"),
            std::string::npos)
      << r.output;
  EXPECT_LT(took, std::chrono::seconds(5));
  // --state-dir and --etcd-endpoints together: a usage error.
  r = testing::runToCompletion(KOLO_COORDINATOR_BIN,
                               {"--etcd-endpoints", endpoint, "--state-dir", "/tmp/x"},
                               milliseconds(10000));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--state-dir and --etcd-endpoints are mutually exclusive"),
            std::string::npos)
      << r.output;
}

// etcd hangs (SIGSTOP: connections stay open, nothing answers): the
// leader's calls block until their deadlines, yet it stops serving before
// its lease could expire in etcd (TTL after its last renewal), then exits 3.
TEST_F(EtcdHaTest, ALeaderStopsServingWithinTheTtlWhenEtcdHangs) {
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  putState(*clients_[leader]);
  auto t0 = SteadyClock::now();
  etcd_.signal(SIGSTOP);
  grpc::Status st;
  do {
    coord::ListJobsReply reply;
    st = clients_[leader]->listJobs(&reply, milliseconds(500));
    if (!st.ok()) break;
    std::this_thread::sleep_for(milliseconds(20));
  } while (SteadyClock::now() - t0 < milliseconds(kTtlMs + 3000));
  auto took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0);
  etcd_.signal(SIGCONT);
  ASSERT_FALSE(st.ok()) << "still serving " << took.count() << " ms after etcd hung\n" << logs();
  std::printf("the leader stopped serving %lld ms after etcd hung (TTL %d ms)\n",
              static_cast<long long>(took.count()), kTtlMs);
  EXPECT_LE(took.count(), kTtlMs) << st.error_message();
  auto status = procs_[leader]->waitExit(milliseconds(10000));
  ASSERT_TRUE(status.has_value()) << logs();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3);
}

TEST_F(EtcdHaTest, ALeaderThatLosesEtcdStepsDownAndNothingIsLost) {
  startCoordinator();
  int leader = waitForLeader(milliseconds(5000));
  ASSERT_GE(leader, 0) << logs();
  putState(*clients_[leader]);

  auto t0 = SteadyClock::now();
  etcd_.stop(SIGKILL);
  auto status = procs_[leader]->waitExit(milliseconds(kTtlMs + 5000));
  ASSERT_TRUE(status.has_value()) << "the leader must stop serving without etcd\n" << logs();
  EXPECT_LT(SteadyClock::now() - t0, milliseconds(kTtlMs + 5000));
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
  std::string log = procs_[leader]->log();
  EXPECT_NE(log.find("did not renew the election lease within its"), std::string::npos) << log;
  procs_[leader].reset();

  std::string error;
  ASSERT_TRUE(etcd_.start(milliseconds(10000), &error)) << error;
  startCoordinator();
  int next = waitForLeader(milliseconds(kTtlMs + 5000));
  ASSERT_GE(next, 0) << logs();
  expectState(*clients_[next]);
}

}  // namespace
}  // namespace kolo::coordinator
