// The agent's coordinator client against the real kolo-coordinator (a child
// process on loopback) and, for the fallback, a coordinator that predates
// HeartbeatStream (a gRPC server in the test with RegisterAgent and
// Heartbeat only, as such a binary serves them).
#include "agent/coord/coord_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "common/event_loop.h"
#include "kolo/proto/coordinator.grpc.pb.h"
#include "tests/coordinator/coordinator_process.h"

#ifndef KOLO_COORDINATOR_BIN
#error "KOLO_COORDINATOR_BIN must name the kolo-coordinator binary"
#endif

namespace kolo {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr int64_t kLeaseMs = 500;

// Polls `pred` every 20 ms until it holds or `within` passes.
template <typename Pred>
bool eventually(milliseconds within, Pred pred) {
  auto until = Clock::now() + within;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pred();
}

class CoordClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    // An operator may take over a live agent's id (issue 47).
    char path[] = "/tmp/kolo-operator-XXXXXX";
    int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    const std::string text = std::string(kOperatorToken) + "\n";
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
    operator_token_file_ = path;
    ASSERT_TRUE(proc_.start(KOLO_COORDINATOR_BIN,
                            {"--lease-ms", std::to_string(kLeaseMs), "--heartbeat-interval-ms",
                             "100", "--operator-token-file", operator_token_file_},
                            milliseconds(15000), &error))
        << error;
    stub_ = coord::Coordinator::NewStub(
        grpc::CreateChannel(proc_.address(), grpc::InsecureChannelCredentials()));
    loop_.start();
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "--- kolo-coordinator log ---\n" << proc_.log() << "---\n";
    loop_.stop();
    proc_.kill();
    if (!operator_token_file_.empty()) ::unlink(operator_token_file_.c_str());
  }
  static constexpr const char* kOperatorToken = "operator-token-0123456789";
  std::string operator_token_file_;
  std::unique_ptr<CoordClient> client(const std::string& id) {
    coord::AgentInfo self;
    self.set_agent_id(id);
    self.set_hostname("host-" + id);
    auto c = std::make_unique<CoordClient>(proc_.address(), self, loop_);
    Status st = c->registerAgent(Clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(st.isOk()) << st.message();
    return c;
  }
  // The agents the coordinator knows, with their last heartbeat's age.
  std::map<std::string, int64_t> agents() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    coord::ListAgentsReply rep;
    grpc::Status st = stub_->ListAgents(&ctx, coord::ListAgentsRequest(), &rep);
    EXPECT_TRUE(st.ok()) << st.error_message();
    std::map<std::string, int64_t> out;
    for (const auto& a : rep.agents()) out[a.agent().agent_id()] = a.last_heartbeat_age_ms();
    return out;
  }
  grpc::Status heartbeat(const std::string& id, const std::string& secret, bool leaving,
                         coord::HeartbeatReply* rep) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    coord::HeartbeatRequest req;
    req.set_agent_id(id);
    req.set_agent_secret(secret);
    req.set_leaving(leaving);
    return stub_->Heartbeat(&ctx, req, rep);
  }

  coordinator::testing::CoordinatorProcess proc_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
  EventLoop loop_{"test-loop"};
};

TEST_F(CoordClientTest, StreamHeartbeatsKeepTheLeaseAndAForgottenAgentRegistersAgain) {
  auto c = client("a1");
  c->startHeartbeats();
  // Three leases: still known, its last heartbeat recent.
  std::this_thread::sleep_for(milliseconds(3 * kLeaseMs));
  auto known = agents();
  ASSERT_EQ(known.count("a1"), 1u);
  EXPECT_LT(known["a1"], kLeaseMs);
  EXPECT_FALSE(c->heartbeatsUnary());
  // On the stream at the coordinator's stream interval, max(100, lease / 3)
  // = 166 ms, not the unary 100 ms: the oldest last heartbeat seen in 1.5 s
  // of 20 ms samples is older than 100 ms (and younger than the lease).
  int64_t oldest = 0;
  for (auto until = Clock::now() + milliseconds(1500); Clock::now() < until;) {
    auto now = agents();
    ASSERT_EQ(now.count("a1"), 1u);
    oldest = std::max(oldest, now["a1"]);
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GT(oldest, 130) << "heartbeats on the stream come at the unary interval";
  EXPECT_LT(oldest, kLeaseMs);
  // The coordinator forgets it (a leaving heartbeat in its name): its next
  // quiet heartbeat is answered known = false and it registers again.
  const std::string old_secret = c->agentSecret();
  coord::HeartbeatReply rep;
  ASSERT_TRUE(heartbeat("a1", old_secret, true, &rep).ok());
  EXPECT_TRUE(eventually(milliseconds(2000), [&] { return c->agentSecret() != old_secret; }));
  EXPECT_EQ(agents().count("a1"), 1u);
  c->shutdown();
}

TEST_F(CoordClientTest, AStoppedAgentIsLostWithinTheLease) {
  auto c = client("a2");
  c->startHeartbeats();
  std::this_thread::sleep_for(milliseconds(2 * kLeaseMs));
  ASSERT_EQ(agents().count("a2"), 1u);
  // Its stream is cancelled, nothing deregisters: lost within lease + 1 s.
  auto stopped = Clock::now();
  c->shutdown();
  EXPECT_TRUE(eventually(milliseconds(kLeaseMs + 1000), [&] { return agents().count("a2") == 0; }));
  EXPECT_LT(Clock::now() - stopped, milliseconds(kLeaseMs + 1000));
}

TEST_F(CoordClientTest, AReplacedAgentIsRefusedAndDoesNotTakeItsIdBack) {
  auto c = client("a3");
  c->startHeartbeats();
  std::this_thread::sleep_for(milliseconds(300));
  const std::string old_secret = c->agentSecret();
  // Another process registers the same id: refused without the agent's
  // secret (issue 47), accepted with the operator token.
  coord::RegisterAgentRequest req;
  req.mutable_agent()->set_agent_id("a3");
  req.mutable_agent()->set_hostname("other-host");
  coord::RegisterAgentReply reg;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    EXPECT_EQ(stub_->RegisterAgent(&ctx, req, &reg).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("x-kolo-operator-token", kOperatorToken);
    ASSERT_TRUE(stub_->RegisterAgent(&ctx, req, &reg).ok());
  }
  // Its heartbeats are refused (the stream ends PERMISSION_DENIED, then
  // the unary call): it says so and does not register again, for three
  // leases; the new registration keeps the id.
  // (The new process heartbeats, as it would.)
  auto until = Clock::now() + milliseconds(3 * kLeaseMs);
  while (Clock::now() < until) {
    coord::HeartbeatReply rep;
    ASSERT_TRUE(heartbeat("a3", reg.agent_secret(), false, &rep).ok());
    ASSERT_TRUE(rep.known()) << "the new registration was taken over";
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(c->agentSecret(), old_secret);
  c->shutdown();
}

// A coordinator that predates HeartbeatStream: RegisterAgent and Heartbeat.
class OldCoordinator final : public coord::Coordinator::Service {
 public:
  grpc::Status RegisterAgent(grpc::ServerContext*, const coord::RegisterAgentRequest*,
                             coord::RegisterAgentReply* rep) override {
    rep->set_lease_ms(kLeaseMs);
    rep->set_heartbeat_interval_ms(100);
    rep->set_agent_secret("secret");
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const coord::HeartbeatRequest* req,
                         coord::HeartbeatReply* rep) override {
    if (req->agent_secret() == "secret") heartbeats++;
    rep->set_known(true);
    return grpc::Status::OK;
  }
  std::atomic<int> heartbeats{0};
};

TEST(CoordClientOldCoordinatorTest, HeartbeatsFallBackToUnaryCalls) {
  OldCoordinator service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  EventLoop loop("test-loop");
  loop.start();
  coord::AgentInfo self;
  self.set_agent_id("old");
  CoordClient c("127.0.0.1:" + std::to_string(port), self, loop);
  ASSERT_TRUE(c.registerAgent(Clock::now() + std::chrono::seconds(10)).isOk());
  c.startHeartbeats();
  // UNIMPLEMENTED at the first stream: unary calls every 100 ms from then on.
  EXPECT_TRUE(eventually(milliseconds(3000), [&] { return service.heartbeats.load() >= 10; }))
      << service.heartbeats.load() << " heartbeats";
  EXPECT_TRUE(c.heartbeatsUnary());
  c.shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  loop.stop();
}

}  // namespace
}  // namespace kolo
