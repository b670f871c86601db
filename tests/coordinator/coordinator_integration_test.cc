// Integration tests: the real kolo-coordinator binary in a child process,
// spoken to with the generated gRPC stubs over loopback.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "health.grpc.pb.h"
#include "kolo/proto/coordinator.grpc.pb.h"
#include "tests/coordinator/coordinator_process.h"

#ifndef KOLO_COORDINATOR_BIN
#error "KOLO_COORDINATOR_BIN must name the kolo-coordinator binary"
#endif

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr int64_t kLeaseMs = 500;

std::unique_ptr<grpc::ClientContext> ctxWithDeadline(milliseconds d = milliseconds(5000)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

// Renews an agent's lease every `period` on its own thread until destroyed.
class Heartbeater {
 public:
  Heartbeater(coord::Coordinator::Stub* stub, std::string agent_id, milliseconds period)
      : thread_([this, stub, agent_id, period] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!stop_) {
            lock.unlock();
            coord::HeartbeatRequest req;
            req.set_agent_id(agent_id);
            coord::HeartbeatReply reply;
            auto ctx = ctxWithDeadline(milliseconds(2000));
            stub->Heartbeat(ctx.get(), req, &reply);
            lock.lock();
            cv_.wait_for(lock, period, [this] { return stop_; });
          }
        }) {}
  ~Heartbeater() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class CoordinatorIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(
        proc_.start(KOLO_COORDINATOR_BIN,
                    {"--lease-ms", std::to_string(kLeaseMs), "--heartbeat-interval-ms", "100"},
                    milliseconds(15000), &error))
        << error;
    channel_ = grpc::CreateChannel(proc_.address(), grpc::InsecureChannelCredentials());
    ASSERT_TRUE(
        channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
        << "cannot connect to " << proc_.address();
    stub_ = coord::Coordinator::NewStub(channel_);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "--- kolo-coordinator log ---\n" << proc_.log() << "---\n";
    stub_.reset();
    channel_.reset();
    proc_.kill();
  }

  coord::RegisterAgentReply registerAgent(const std::string& id, const std::string& host) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname(host);
    req.mutable_agent()->set_rpc_address(host + ":7471");
    req.mutable_agent()->set_data_address("ucx-address-of-" + id);
    coord::RegisterAgentReply reply;
    auto ctx = ctxWithDeadline();
    grpc::Status st = stub_->RegisterAgent(ctx.get(), req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return reply;
  }
  grpc::Status join(const std::string& job, const std::string& token, const std::string& agent,
                    int local, int world) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    req.set_local_size(local);
    req.set_world_size(world);
    coord::JoinJobReply reply;
    auto ctx = ctxWithDeadline();
    return stub_->JoinJob(ctx.get(), req, &reply);
  }
  grpc::Status leave(const std::string& job, const std::string& agent) {
    coord::LeaveJobRequest req;
    req.set_job_id(job);
    req.set_agent_id(agent);
    coord::LeaveJobReply reply;
    auto ctx = ctxWithDeadline();
    return stub_->LeaveJob(ctx.get(), req, &reply);
  }
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<coord::World>> reader;
  };
  Watch watch(const std::string& job, const std::string& token, const std::string& agent) {
    coord::WatchJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    Watch w;
    w.ctx = ctxWithDeadline(milliseconds(15000));
    w.reader = stub_->WatchJob(w.ctx.get(), req);
    return w;
  }
  std::unique_ptr<Heartbeater> heartbeat(const std::string& agent) {
    return std::make_unique<Heartbeater>(stub_.get(), agent, milliseconds(100));
  }
  grpc::Status kvPut(const std::string& job, const std::string& token, const std::string& key,
                     const std::string& value) {
    coord::KvPutRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_key(key);
    req.set_value(value);
    coord::KvPutReply reply;
    auto ctx = ctxWithDeadline();
    return stub_->KvPut(ctx.get(), req, &reply);
  }
  grpc::Status kvGet(const std::string& job, const std::string& token, const std::string& key,
                     uint64_t wait_ms, coord::KvGetReply* reply) {
    coord::KvGetRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_key(key);
    req.set_wait_ms(wait_ms);
    auto ctx = ctxWithDeadline(milliseconds(wait_ms + 5000));
    return stub_->KvGet(ctx.get(), req, reply);
  }

  testing::CoordinatorProcess proc_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorIntegrationTest, TwoAgentsJoinAndBothWatchersSeeGenerationOne) {
  auto reply = registerAgent("agent-1", "host-b");
  EXPECT_EQ(reply.lease_ms(), static_cast<uint64_t>(kLeaseMs));
  EXPECT_EQ(reply.heartbeat_interval_ms(), 100u);
  registerAgent("agent-2", "host-a");
  auto hb1 = heartbeat("agent-1");
  auto hb2 = heartbeat("agent-2");

  ASSERT_TRUE(join("job-1", "tok", "agent-1", 2, 3).ok());
  Watch w1 = watch("job-1", "tok", "agent-1");
  Watch w2 = watch("job-1", "tok", "agent-2");
  coord::World world;
  for (Watch* w : {&w1, &w2}) {
    ASSERT_TRUE(w->reader->Read(&world));
    EXPECT_EQ(world.state(), coord::FORMING);
    EXPECT_EQ(world.generation(), 0u);
  }
  ASSERT_TRUE(join("job-1", "tok", "agent-2", 1, 3).ok());
  for (Watch* w : {&w1, &w2}) {
    ASSERT_TRUE(w->reader->Read(&world));
    EXPECT_EQ(world.job_id(), "job-1");
    EXPECT_EQ(world.state(), coord::RUNNING);
    EXPECT_EQ(world.generation(), 1u);
    EXPECT_EQ(world.world_size(), 3);
    ASSERT_EQ(world.agents_size(), 2);
    // host-a sorts first.
    EXPECT_EQ(world.agents(0).agent().agent_id(), "agent-2");
    EXPECT_EQ(world.agents(0).rank_offset(), 0);
    EXPECT_EQ(world.agents(0).local_size(), 1);
    EXPECT_EQ(world.agents(0).cross_rank(), 0);
    EXPECT_EQ(world.agents(1).agent().agent_id(), "agent-1");
    EXPECT_EQ(world.agents(1).rank_offset(), 1);
    EXPECT_EQ(world.agents(1).local_size(), 2);
    EXPECT_EQ(world.agents(1).cross_rank(), 1);
    EXPECT_EQ(world.agents(1).agent().data_address(), "ucx-address-of-agent-1");
  }

  // Listings.
  {
    coord::ListJobsReply jobs;
    auto ctx = ctxWithDeadline();
    ASSERT_TRUE(stub_->ListJobs(ctx.get(), {}, &jobs).ok());
    ASSERT_EQ(jobs.jobs_size(), 1);
    EXPECT_EQ(jobs.jobs(0).joined_ranks(), 3);
    EXPECT_EQ(jobs.jobs(0).state(), coord::RUNNING);
    EXPECT_GT(jobs.jobs(0).created_unix_ms(), 0);
    coord::ListAgentsReply agents;
    auto ctx2 = ctxWithDeadline();
    ASSERT_TRUE(stub_->ListAgents(ctx2.get(), {}, &agents).ok());
    ASSERT_EQ(agents.agents_size(), 2);
    for (const auto& a : agents.agents()) {
      EXPECT_LT(a.last_heartbeat_age_ms(), kLeaseMs);
      ASSERT_EQ(a.job_ids_size(), 1);
      EXPECT_EQ(a.job_ids(0), "job-1");
    }
  }

  // Both leave cleanly: FINISHED, and the streams end OK.
  ASSERT_TRUE(leave("job-1", "agent-1").ok());
  ASSERT_TRUE(leave("job-1", "agent-2").ok());
  for (Watch* w : {&w1, &w2}) {
    ASSERT_TRUE(w->reader->Read(&world));
    EXPECT_EQ(world.state(), coord::FINISHED);
    EXPECT_FALSE(w->reader->Read(&world));
    grpc::Status st = w->reader->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
}

TEST_F(CoordinatorIntegrationTest, WrongTokenAndOtherErrorsAreRejected) {
  registerAgent("a", "h1");
  registerAgent("b", "h2");
  auto hb1 = heartbeat("a");
  auto hb2 = heartbeat("b");
  ASSERT_TRUE(join("job", "right", "a", 1, 2).ok());

  grpc::Status st = join("job", "wrong", "b", 1, 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("wrong token for job job"), std::string::npos)
      << st.error_message();

  st = join("job", "right", "b", 1, 5);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();

  st = join("job", "right", "nobody", 1, 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("agent not registered"), std::string::npos)
      << st.error_message();

  Watch w = watch("job", "wrong", "b");
  coord::World world;
  EXPECT_FALSE(w.reader->Read(&world));
  EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);

  Watch w2 = watch("no-such-job", "right", "b");
  EXPECT_FALSE(w2.reader->Read(&world));
  EXPECT_EQ(w2.reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  EXPECT_EQ(kvPut("job", "wrong", "k", "v").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  coord::KvGetReply got;
  EXPECT_EQ(kvGet("job", "wrong", "k", 0, &got).error_code(), grpc::StatusCode::PERMISSION_DENIED);

  coord::HeartbeatRequest hreq;
  hreq.set_agent_id("nobody");
  coord::HeartbeatReply hreply;
  auto ctx = ctxWithDeadline();
  ASSERT_TRUE(stub_->Heartbeat(ctx.get(), hreq, &hreply).ok());
  EXPECT_FALSE(hreply.known());
}

TEST_F(CoordinatorIntegrationTest, KvPutGetWithWait) {
  registerAgent("a", "h1");
  auto hb = heartbeat("a");
  ASSERT_TRUE(join("job", "t", "a", 1, 2).ok());

  coord::KvGetReply got;
  ASSERT_TRUE(kvGet("job", "t", "nccl-id", 0, &got).ok());
  EXPECT_FALSE(got.found());

  // A bounded wait for a key that never comes answers found=false after it.
  auto t0 = Clock::now();
  ASSERT_TRUE(kvGet("job", "t", "never", 300, &got).ok());
  EXPECT_FALSE(got.found());
  EXPECT_GE(Clock::now() - t0, milliseconds(250));

  // A waiting reader gets the value as soon as it is put.
  auto waiter = std::async(std::launch::async, [&] {
    coord::KvGetReply r;
    grpc::Status st = kvGet("job", "t", "nccl-id", 10000, &r);
    return std::make_pair(st, r);
  });
  t0 = Clock::now();
  ASSERT_TRUE(kvPut("job", "t", "nccl-id", std::string("\x01\x02\x00\x03", 4)).ok());
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(8)), std::future_status::ready);
  auto [st, r] = waiter.get();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(r.found());
  EXPECT_EQ(r.value(), std::string("\x01\x02\x00\x03", 4));
  EXPECT_LT(Clock::now() - t0, milliseconds(5000)) << "the reader must not wait out its wait_ms";

  // Keys are scoped by job.
  registerAgent("b", "h2");
  auto hb2 = heartbeat("b");
  ASSERT_TRUE(join("other", "t", "b", 1, 1).ok());
  ASSERT_TRUE(kvGet("other", "t", "nccl-id", 0, &got).ok());
  EXPECT_FALSE(got.found());
}

TEST_F(CoordinatorIntegrationTest, SilentAgentFailsItsJobWithinLeasePlusOneSecond) {
  registerAgent("alive", "host-a");
  auto hb = heartbeat("alive");
  registerAgent("silent", "host-s");
  auto registered = Clock::now();
  ASSERT_TRUE(join("job", "t", "alive", 1, 2).ok());
  ASSERT_TRUE(join("job", "t", "silent", 1, 2).ok());
  Watch w = watch("job", "t", "alive");
  coord::World world;
  ASSERT_TRUE(w.reader->Read(&world));
  if (world.state() == coord::RUNNING) {
    ASSERT_TRUE(w.reader->Read(&world));
  }
  auto failed_at = Clock::now();
  EXPECT_EQ(world.state(), coord::FAILED);
  EXPECT_EQ(world.reason().rfind("agent silent (host host-s) lost: no heartbeat for ", 0), 0u)
      << world.reason();
  EXPECT_LT(failed_at - registered, milliseconds(kLeaseMs + 1000));
  EXPECT_GE(failed_at - registered, milliseconds(kLeaseMs - 100));
  EXPECT_FALSE(w.reader->Read(&world));
  EXPECT_TRUE(w.reader->Finish().ok());

  coord::ListJobsReply jobs;
  auto ctx = ctxWithDeadline();
  ASSERT_TRUE(stub_->ListJobs(ctx.get(), {}, &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).state(), coord::FAILED);
  EXPECT_EQ(jobs.jobs(0).reason(), world.reason());
}

TEST_F(CoordinatorIntegrationTest, HealthCheckIsServing) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  for (const char* service : {"", "kolo.coord.Coordinator"}) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = ctxWithDeadline();
    grpc::Status st = health->Check(ctx.get(), req, &resp);
    ASSERT_TRUE(st.ok()) << service << ": " << st.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
}

TEST_F(CoordinatorIntegrationTest, SigtermEndsStreamsAndExitsZeroWithinThreeSeconds) {
  registerAgent("a", "h");
  ASSERT_TRUE(join("job", "t", "a", 1, 2).ok());
  Watch w = watch("job", "t", "a");
  coord::World world;
  ASSERT_TRUE(w.reader->Read(&world));
  EXPECT_EQ(world.state(), coord::FORMING);
  // Like an agent, keep reading the stream while the coordinator goes down.
  auto stream_end = std::async(std::launch::async, [&] {
    coord::World more;
    while (w.reader->Read(&more)) {
    }
    return w.reader->Finish();
  });

  auto t0 = Clock::now();
  proc_.signal(SIGTERM);
  auto status = proc_.waitExit(milliseconds(3000));
  ASSERT_TRUE(status.has_value()) << "kolo-coordinator did not exit within 3 s of SIGTERM";
  EXPECT_LT(Clock::now() - t0, milliseconds(3000));
  ASSERT_TRUE(WIFEXITED(*status)) << "status " << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  ASSERT_EQ(stream_end.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  grpc::Status st = stream_end.get();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_FALSE(std::filesystem::exists(proc_.dir() + "/ready"))
      << "a clean exit removes the ready file";
}

TEST_F(CoordinatorIntegrationTest, SecondCoordinatorOnTheSamePortFails) {
  auto second = testing::runToCompletion(KOLO_COORDINATOR_BIN, {"--listen", proc_.address()},
                                         milliseconds(10000));
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find("cannot listen on " + proc_.address()), std::string::npos)
      << second.output;
}

TEST(CoordinatorBinaryTest, HelpAndDumpConfig) {
  auto help = testing::runToCompletion(KOLO_COORDINATOR_BIN, {"--help"}, milliseconds(10000));
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag : {"--listen", "--ready-file", "--lease-ms", "--heartbeat-interval-ms",
                           "--finished-job-retention-s", "--log-level", "--state-dir",
                           "--state-compact-records", "--tls-cert", "--tls-key", "--tls-client-ca",
                           "--auth-token-file"}) {
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag;
  }
  auto dump = testing::runToCompletion(KOLO_COORDINATOR_BIN, {"--dump-config", "--lease-ms=750"},
                                       milliseconds(10000));
  EXPECT_EQ(dump.exit_code, 0);
  EXPECT_NE(dump.output.find("lease-ms = 750  # flag"), std::string::npos) << dump.output;
  EXPECT_NE(dump.output.find("listen = \"0.0.0.0:7470\"  # default"), std::string::npos)
      << dump.output;

  auto bad = testing::runToCompletion(KOLO_COORDINATOR_BIN,
                                      {"--lease-ms", "100", "--heartbeat-interval-ms", "200"},
                                      milliseconds(10000));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("heartbeat-interval-ms"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace kolo::coordinator
