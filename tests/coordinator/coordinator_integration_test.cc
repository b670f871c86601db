// Integration tests: the real kolo-coordinator binary in a child process,
// spoken to with the generated gRPC stubs over loopback.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
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
  Heartbeater(coord::Coordinator::Stub* stub, std::string agent_id, std::string secret,
              milliseconds period)
      : thread_([this, stub, agent_id, secret, period] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!stop_) {
            lock.unlock();
            coord::HeartbeatRequest req;
            req.set_agent_id(agent_id);
            req.set_agent_secret(secret);
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
    std::vector<std::string> args{"--lease-ms", std::to_string(kLeaseMs), "--heartbeat-interval-ms",
                                  "100"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    ASSERT_TRUE(proc_.start(KOLO_COORDINATOR_BIN, args, milliseconds(15000), &error)) << error;
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

  // `previous_secret`: what the same process got before (empty: a new process).
  coord::RegisterAgentReply registerAgent(const std::string& id, const std::string& host,
                                          const std::string& previous_secret = "") {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname(host);
    req.mutable_agent()->set_rpc_address(host + ":7471");
    req.mutable_agent()->set_data_address("ucx-address-of-" + id);
    req.set_previous_secret(previous_secret);
    coord::RegisterAgentReply reply;
    auto ctx = ctxWithDeadline();
    grpc::Status st = stub_->RegisterAgent(ctx.get(), req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    secrets_[id] = reply.agent_secret();
    return reply;
  }
  grpc::Status join(const std::string& job, const std::string& token, const std::string& agent,
                    int local, int world) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_local_size(local);
    req.set_world_size(world);
    coord::JoinJobReply reply;
    auto ctx = ctxWithDeadline();
    return stub_->JoinJob(ctx.get(), req, &reply);
  }
  grpc::Status leave(const std::string& job, const std::string& token, const std::string& agent) {
    coord::LeaveJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
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
    return std::make_unique<Heartbeater>(stub_.get(), agent, secrets_[agent], milliseconds(100));
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

  std::vector<std::string> extra_args_;  // more flags for the coordinator (set before SetUp)
  testing::CoordinatorProcess proc_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
  std::map<std::string, std::string> secrets_;  // agent id -> its registration's secret
};

TEST_F(CoordinatorIntegrationTest, TwoAgentsJoinAndBothWatchersSeeGenerationOne) {
  auto reply = registerAgent("agent-1", "host-b");
  EXPECT_EQ(reply.lease_ms(), static_cast<uint64_t>(kLeaseMs));
  EXPECT_EQ(reply.heartbeat_interval_ms(), 100u);
  EXPECT_EQ(reply.stream_heartbeat_interval_ms(), 166u);  // max(100, lease / 3)
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
  ASSERT_TRUE(leave("job-1", "tok", "agent-1").ok());
  ASSERT_TRUE(leave("job-1", "tok", "agent-2").ok());
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

// --- Tenants that attack each other (issue 21), through the real process. ---

// A client of the attacker's own: its own connection, no agent registration,
// no job token; it knows only ids (ListJobs and ListAgents are open).
struct Intruder {
  explicit Intruder(const std::string& address)
      : stub(coord::Coordinator::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}
  grpc::Status leave(const std::string& job, const std::string& agent, const std::string& token,
                     const std::string& secret = "") {
    coord::LeaveJobRequest req;
    req.set_job_id(job);
    req.set_agent_id(agent);
    req.set_token(token);
    req.set_agent_secret(secret);
    req.set_failed(true);
    req.set_reason("sabotage");
    coord::LeaveJobReply reply;
    auto ctx = ctxWithDeadline();
    return stub->LeaveJob(ctx.get(), req, &reply);
  }
  grpc::Status heartbeat(const std::string& agent, const std::string& secret,
                         bool* known = nullptr) {
    coord::HeartbeatRequest req;
    req.set_agent_id(agent);
    req.set_agent_secret(secret);
    coord::HeartbeatReply reply;
    auto ctx = ctxWithDeadline(milliseconds(2000));
    grpc::Status st = stub->Heartbeat(ctx.get(), req, &reply);
    if (known != nullptr) *known = reply.known();
    return st;
  }
  std::unique_ptr<coord::Coordinator::Stub> stub;
};

TEST_F(CoordinatorIntegrationTest, LeaveJobWithoutTheJobsTokenIsRefusedAndTheJobRunsOn) {
  registerAgent("a", "host-a");
  registerAgent("b", "host-b");
  auto hb1 = heartbeat("a");
  auto hb2 = heartbeat("b");
  ASSERT_TRUE(join("victim", "victim-token", "a", 1, 2).ok());
  ASSERT_TRUE(join("victim", "victim-token", "b", 1, 2).ok());

  Intruder intruder(proc_.address());
  for (const char* token : {"", "guessed-token"}) {
    grpc::Status st = intruder.leave("victim", "a", token);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << token;
    EXPECT_EQ(st.error_message(),
              "LeaveJob refused: wrong token for job victim (agent a); only the job's own agents "
              "may leave or fail it");
  }
  // Even the job's token does not speak for a registered agent without its secret.
  grpc::Status st = intruder.leave("victim", "a", "victim-token", "not-its-secret");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(),
            "LeaveJob for agent a refused: the agent secret does not match its registration");

  coord::ListJobsReply jobs;
  auto ctx = ctxWithDeadline();
  ASSERT_TRUE(stub_->ListJobs(ctx.get(), {}, &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).state(), coord::RUNNING);
  EXPECT_EQ(jobs.jobs(0).reason(), "");
  // The job's own agents still leave it.
  ASSERT_TRUE(leave("victim", "victim-token", "a").ok());
  ASSERT_TRUE(leave("victim", "victim-token", "b").ok());
}

TEST_F(CoordinatorIntegrationTest, HeartbeatsForAnotherAgentAreRefusedAndItsLeaseRunsOut) {
  registerAgent("alive", "host-a");
  auto hb = heartbeat("alive");
  registerAgent("stopped", "host-s");
  ASSERT_TRUE(join("job", "t", "alive", 1, 2).ok());
  ASSERT_TRUE(join("job", "t", "stopped", 1, 2).ok());
  auto stopped_at = Clock::now();
  Watch w = watch("job", "t", "alive");

  // "stopped" sends nothing any more; the intruder heartbeats in its name.
  std::atomic<bool> done{false};
  std::atomic<int> refused{0}, accepted{0};
  std::string first_refusal;
  std::thread forger([&] {
    Intruder intruder(proc_.address());
    while (!done.load()) {
      for (const char* secret : {"", "0123456789abcdef0123456789abcdef"}) {
        bool known = false;
        grpc::Status st = intruder.heartbeat("stopped", secret, &known);
        if (st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          if (refused.fetch_add(1) == 0) first_refusal = st.error_message();
        } else if (st.ok() && known) {
          accepted.fetch_add(1);
        }
      }
    }
  });
  coord::World world;
  bool failed = false;
  while (!failed && w.reader->Read(&world)) failed = world.state() == coord::FAILED;
  auto failed_at = Clock::now();
  done.store(true);
  forger.join();
  ASSERT_TRUE(failed);
  EXPECT_EQ(world.reason().rfind("agent stopped (host host-s) lost: no heartbeat for ", 0), 0u)
      << world.reason();
  EXPECT_LT(failed_at - stopped_at, milliseconds(kLeaseMs + 1000));
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(first_refusal,
            "Heartbeat for agent stopped refused: the agent secret does not match its "
            "registration; only the agent process that registered may renew its lease (a "
            "restarted agent calls RegisterAgent)");
  // (After the loss the id is unknown: a forged heartbeat is told to
  // register again, which renews nothing.)
  EXPECT_EQ(accepted.load(), 0) << "no forged heartbeat renewed the lease";
}

// kolo-agent's heartbeats: quiet heartbeats on one HeartbeatStream renew the
// lease without an answer; one that asks is answered; a forgotten agent is
// told so on the stream; a silent stream is a lost agent within the lease.
TEST_F(CoordinatorIntegrationTest, QuietHeartbeatStreamRenewsTheLeaseAndAnswersOnlyNews) {
  registerAgent("quiet", "host-q");
  registerAgent("silent", "host-s");
  ASSERT_TRUE(join("job", "t", "quiet", 1, 2).ok());
  ASSERT_TRUE(join("job", "t", "silent", 1, 2).ok());
  Watch w = watch("job", "t", "quiet");
  auto ctx = ctxWithDeadline(milliseconds(20000));
  auto stream = stub_->HeartbeatStream(ctx.get());
  auto silent_ctx = ctxWithDeadline(milliseconds(20000));
  auto silent = stub_->HeartbeatStream(silent_ctx.get());
  auto beat = [&](auto& s, const std::string& agent, bool quiet) {
    coord::HeartbeatRequest req;
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_quiet(quiet);
    return s->Write(req);
  };
  // "silent" beats once on its stream, then writes nothing (the stream stays open).
  ASSERT_TRUE(beat(silent, "silent", true));
  auto silent_from = Clock::now();
  // Three leases of quiet heartbeats every 100 ms from "quiet".
  std::atomic<bool> done{false};
  std::thread beater([&] {
    while (!done.load()) {
      if (!beat(stream, "quiet", true)) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
  });
  coord::World world;
  bool failed = false;
  while (!failed && w.reader->Read(&world)) failed = world.state() == coord::FAILED;
  auto failed_at = Clock::now();
  ASSERT_TRUE(failed);
  EXPECT_EQ(world.reason().rfind("agent silent (host host-s) lost: no heartbeat for ", 0), 0u)
      << world.reason();
  EXPECT_LT(failed_at - silent_from, milliseconds(kLeaseMs + 1000));
  std::this_thread::sleep_for(milliseconds(3 * kLeaseMs));
  done.store(true);
  beater.join();
  // "quiet" is still known after three leases of quiet heartbeats.
  coord::ListAgentsReply agents;
  {
    auto lctx = ctxWithDeadline();
    ASSERT_TRUE(stub_->ListAgents(lctx.get(), coord::ListAgentsRequest(), &agents).ok());
  }
  std::vector<std::string> ids;
  for (const auto& a : agents.agents()) ids.push_back(a.agent().agent_id());
  EXPECT_EQ(ids, std::vector<std::string>{"quiet"});
  // A heartbeat that asks is answered: the first answer on the stream, so
  // none of the quiet ones got one.
  ASSERT_TRUE(beat(stream, "quiet", false));
  coord::HeartbeatReply rep;
  ASSERT_TRUE(stream->Read(&rep));
  EXPECT_TRUE(rep.known());
  // Forgotten (a leaving heartbeat, as at a clean stop): a quiet heartbeat
  // is answered known = false.
  {
    coord::HeartbeatRequest req;
    req.set_agent_id("quiet");
    req.set_agent_secret(secrets_["quiet"]);
    req.set_leaving(true);
    coord::HeartbeatReply leave_rep;
    auto lctx = ctxWithDeadline();
    ASSERT_TRUE(stub_->Heartbeat(lctx.get(), req, &leave_rep).ok());
  }
  ASSERT_TRUE(beat(stream, "quiet", true));
  ASSERT_TRUE(stream->Read(&rep));
  EXPECT_FALSE(rep.known());
  // A quiet heartbeat with another registration's secret ends the stream
  // with the refusal, as Heartbeat answers it.
  registerAgent("quiet", "host-q");
  ASSERT_TRUE(beat(stream, "quiet", true));
  coord::HeartbeatRequest forged;
  forged.set_agent_id("quiet");
  forged.set_agent_secret("0123456789abcdef0123456789abcdef");
  forged.set_quiet(true);
  (void)stream->Write(forged);
  EXPECT_FALSE(stream->Read(&rep));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  silent_ctx->TryCancel();
  (void)silent->Finish();
}

// A coordinator with a long lease and an operator token: a restarted agent
// is reconciled at once when the operator says so; without the operator
// token or the agent's secret the id is not taken over (issue 47).
class LongLeaseTest : public CoordinatorIntegrationTest {
 protected:
  static constexpr int64_t kLongLeaseMs = 20000;
  static constexpr const char* kOperatorToken = "operator-token-0123456789";
  LongLeaseTest() {
    char path[] = "/tmp/kolo-operator-XXXXXX";
    int fd = ::mkstemp(path);
    EXPECT_GE(fd, 0);
    std::string text = std::string(kOperatorToken) + "\n";
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
    token_file_ = path;
    extra_args_ = {"--lease-ms", std::to_string(kLongLeaseMs), "--heartbeat-interval-ms",
                   "1000",       "--operator-token-file",      token_file_};
  }
  ~LongLeaseTest() override { std::filesystem::remove(token_file_); }
  // RegisterAgent of a new process under `id`, with `operator_token` (if any).
  grpc::Status registerNew(const std::string& id, const std::string& operator_token,
                           coord::RegisterAgentReply* reply) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname("host-" + id);
    auto ctx = ctxWithDeadline();
    if (!operator_token.empty()) ctx->AddMetadata("x-kolo-operator-token", operator_token);
    return stub_->RegisterAgent(ctx.get(), req, reply);
  }
  std::string token_file_;
};

TEST_F(LongLeaseTest, AnAgentRestartedWithTheSameIdFailsItsOldJobAtOnceNamingIt) {
  registerAgent("a", "host-a");
  auto first = registerAgent("b", "host-b");
  ASSERT_EQ(first.lease_ms(), static_cast<uint64_t>(kLongLeaseMs));
  ASSERT_TRUE(join("job", "t", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "t", "b", 1, 2).ok());
  Watch w = watch("job", "t", "a");
  coord::World world;
  ASSERT_TRUE(w.reader->Read(&world));
  ASSERT_EQ(world.state(), coord::RUNNING);

  // The same process registering again (it presents its secret) keeps the job.
  auto again = registerAgent("b", "host-b", first.agent_secret());
  EXPECT_EQ(again.agent_secret(), first.agent_secret());

  // Another process registering b's id, without b's secret or with a wrong
  // operator token, is refused and b's job runs on (issue 47: before, this
  // failed b's job at once and locked b out of its id).
  for (const char* op : {"", "not-the-operator-token-xx"}) {
    coord::RegisterAgentReply taken;
    grpc::Status st = registerNew("b", op, &taken);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
    EXPECT_NE(st.error_message().find("RegisterAgent for agent b refused: the id is registered "
                                      "by a live agent (host host-b"),
              std::string::npos)
        << st.error_message();
    EXPECT_TRUE(taken.agent_secret().empty());
  }
  {
    Intruder real(proc_.address());
    EXPECT_TRUE(real.heartbeat("b", first.agent_secret()).ok());
    coord::ListJobsReply jobs;
    auto ctx = ctxWithDeadline();
    ASSERT_TRUE(stub_->ListJobs(ctx.get(), coord::ListJobsRequest(), &jobs).ok());
    ASSERT_EQ(jobs.jobs_size(), 1);
    EXPECT_EQ(jobs.jobs(0).state(), coord::RUNNING);
  }

  // b is killed and started again with the same id, an operator vouching.
  auto restarted_at = Clock::now();
  coord::RegisterAgentReply second;
  ASSERT_TRUE(registerNew("b", kOperatorToken, &second).ok());
  EXPECT_NE(second.agent_secret(), first.agent_secret());
  ASSERT_TRUE(w.reader->Read(&world));
  auto failed_at = Clock::now();
  EXPECT_EQ(world.state(), coord::FAILED);
  EXPECT_EQ(world.reason(),
            "agent b (host host-b) restarted: it registered again as a new incarnation");
  EXPECT_LT(failed_at - restarted_at, milliseconds(2000)) << "well under the 20 s lease";
  EXPECT_FALSE(w.reader->Read(&world));
  EXPECT_TRUE(w.reader->Finish().ok());
  // The new incarnation works; the old one's secret renews nothing.
  Intruder old_process(proc_.address());
  EXPECT_EQ(old_process.heartbeat("b", first.agent_secret()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(old_process.heartbeat("b", second.agent_secret()).ok());
}

// A coordinator with small watch limits, flooded with WatchJob streams.
class WatchLimitTest : public CoordinatorIntegrationTest {
 protected:
  static constexpr int kTotal = 100;
  static constexpr int kPerJob = 60;
  WatchLimitTest() {
    // No reserve for the jobs' agents: these streams are not an agent's.
    extra_args_ = {"--max-watch-streams",         std::to_string(kTotal),
                   "--max-watch-streams-per-job", std::to_string(kPerJob),
                   "--reserved-watch-streams",    "0"};
  }
};

TEST_F(WatchLimitTest, StreamsPastTheLimitAreRefusedHeartbeatsAnsweredAndShutdownBounded) {
  registerAgent("a", "host-a");
  auto hb = heartbeat("a");
  ASSERT_TRUE(join("j1", "t", "a", 1, 2).ok());
  ASSERT_TRUE(join("j2", "t", "a", 1, 2).ok());

  // Opens a stream; true once it is served (its first World came).
  std::vector<Watch> open;
  auto tryWatch = [&](const std::string& job, grpc::Status* refusal) {
    Watch w = watch(job, "t", "a");
    coord::World world;
    if (w.reader->Read(&world)) {
      open.push_back(std::move(w));
      return true;
    }
    *refusal = w.reader->Finish();
    return false;
  };
  grpc::Status refusal;
  int served = 0;
  for (int i = 0; i < kPerJob + 10; ++i) served += tryWatch("j1", &refusal) ? 1 : 0;
  EXPECT_EQ(served, kPerJob);
  EXPECT_EQ(refusal.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refusal.error_message(),
            "WatchJob of job j1 refused: the job already has 60 watch streams "
            "(--max-watch-streams-per-job 60)");
  served = 0;
  for (int i = 0; i < kPerJob; ++i) served += tryWatch("j2", &refusal) ? 1 : 0;
  EXPECT_EQ(served, kTotal - kPerJob);
  EXPECT_EQ(refusal.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refusal.error_message(),
            "WatchJob of job j2 refused: the coordinator already serves 100 watch streams "
            "(--max-watch-streams 100)");

  // The rest of a 1000-stream flood is refused too, each at once.
  constexpr int kFlood = 1000;
  int refused = 0;
  auto flood_start = Clock::now();
  for (int i = kPerJob + 10 + kPerJob; i < kFlood; ++i) {
    refused += tryWatch(i % 2 == 0 ? "j1" : "j2", &refusal) ? 0 : 1;
  }
  EXPECT_EQ(refused, kFlood - (kPerJob + 10 + kPerJob));
  EXPECT_EQ(refusal.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(open.size(), static_cast<size_t>(kTotal));
  EXPECT_LT(Clock::now() - flood_start, milliseconds(30000));

  // A stream is a callback reactor, not a thread: 100 open streams leave the
  // coordinator with its usual few threads (a thread each before issue 20).
  int threads = 0;
  {
    std::ifstream status("/proc/" + std::to_string(proc_.pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Threads:", 0) == 0) threads = std::stoi(line.substr(8));
    }
  }
  EXPECT_GT(threads, 0);
  EXPECT_LT(threads, kTotal / 2) << "threads with " << kTotal << " watch streams open";

  // With every stream open, heartbeats are still answered promptly.
  Intruder other(proc_.address());  // any client: its own connection
  for (int i = 0; i < 20; ++i) {
    auto t0 = Clock::now();
    grpc::Status st = other.heartbeat("a", secrets_["a"]);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  }

  // And the coordinator shuts down within its bound with them all open.
  auto t0 = Clock::now();
  proc_.signal(SIGTERM);
  auto status = proc_.waitExit(milliseconds(5000));
  ASSERT_TRUE(status.has_value()) << "kolo-coordinator did not exit within 5 s with " << open.size()
                                  << " streams open";
  EXPECT_LT(Clock::now() - t0, milliseconds(5000));
  ASSERT_TRUE(WIFEXITED(*status)) << "status " << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  for (Watch& w : open) {
    w.ctx->TryCancel();
    w.reader->Finish();
  }
}

TEST(CoordinatorBinaryTest, HelpAndDumpConfig) {
  auto help = testing::runToCompletion(KOLO_COORDINATOR_BIN, {"--help"}, milliseconds(10000));
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag :
       {"--listen", "--ready-file", "--lease-ms", "--heartbeat-interval-ms",
        "--stream-heartbeat-interval-ms", "--finished-job-retention-s", "--log-level",
        "--state-dir", "--state-compact-records", "--tls-cert", "--tls-key", "--tls-client-ca",
        "--auth-token-file", "--max-watch-streams", "--max-watch-streams-per-job",
        "--brief-world-slots", "--watch-writer-threads",
        // issue 47
        "--operator-token-file", "--reserved-watch-streams", "--max-watch-streams-per-token",
        "--max-watch-streams-per-peer", "--max-watch-streams-per-member", "--max-jobs",
        "--max-jobs-per-agent", "--max-kv-keys-per-job", "--max-kv-bytes-per-job", "--max-kv-bytes",
        "--max-kv-waiters-per-job", "--max-kv-waiters", "--max-list-reply-bytes",
        "--state-compact-bytes"}) {
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
  auto bad_stream = testing::runToCompletion(KOLO_COORDINATOR_BIN,
                                             {"--lease-ms", "900", "--heartbeat-interval-ms", "100",
                                              "--stream-heartbeat-interval-ms", "900"},
                                             milliseconds(10000));
  EXPECT_EQ(bad_stream.exit_code, 2) << bad_stream.output;
  EXPECT_NE(bad_stream.output.find("--stream-heartbeat-interval-ms must be 0 (lease-ms / 3) or "
                                   "positive and below --lease-ms (900), got 900"),
            std::string::npos)
      << bad_stream.output;

  auto bad_writers = testing::runToCompletion(
      KOLO_COORDINATOR_BIN, {"--watch-writer-threads", "-1"}, milliseconds(10000));
  EXPECT_EQ(bad_writers.exit_code, 2) << bad_writers.output;
  EXPECT_NE(
      bad_writers.output.find("--watch-writer-threads must be in 0..64 (0: the cores), got -1"),
      std::string::npos)
      << bad_writers.output;

  auto no_watch = testing::runToCompletion(KOLO_COORDINATOR_BIN, {"--max-watch-streams", "0"},
                                           milliseconds(10000));
  EXPECT_EQ(no_watch.exit_code, 2) << no_watch.output;
  EXPECT_NE(no_watch.output.find("--max-watch-streams and --max-watch-streams-per-job must be "
                                 "positive, got 0 and 8192"),
            std::string::npos)
      << no_watch.output;

  auto bad_slots = testing::runToCompletion(KOLO_COORDINATOR_BIN, {"--brief-world-slots", "-1"},
                                            milliseconds(10000));
  EXPECT_EQ(bad_slots.exit_code, 2) << bad_slots.output;
  EXPECT_NE(bad_slots.output.find("--brief-world-slots must be in 0..1000000, got -1"),
            std::string::npos)
      << bad_slots.output;
}

}  // namespace
}  // namespace kolo::coordinator
