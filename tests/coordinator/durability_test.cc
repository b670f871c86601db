// Durability with the real binary: a coordinator with --state-dir is killed
// with SIGKILL and restarted on the same port with the same directory; its
// jobs, generations, keys and agents are back.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "coordinator/membership/secrets.h"
#include "kolo/proto/coordinator.grpc.pb.h"
#include "tests/coordinator/coordinator_process.h"

#ifndef KOLO_COORDINATOR_BIN
#error "KOLO_COORDINATOR_BIN must name the kolo-coordinator binary"
#endif

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

std::unique_ptr<grpc::ClientContext> ctxWithDeadline(milliseconds d = milliseconds(5000)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

struct StatusOrKnown {
  grpc::Status status;
  bool known = false;
};

// A client of one coordinator incarnation.
// The secret each agent's registration got: an agent keeps it across a
// coordinator restart (it is journaled), so it is shared by the clients.
std::map<std::string, std::string>& agentSecrets() {
  static std::map<std::string, std::string> secrets;
  return secrets;
}

struct Client {
  // Each client has its own connections (not gRPC's process-wide subchannel
  // pool), so the restarted coordinator is not reached through a connection
  // to the killed one.
  explicit Client(const std::string& address)
      : channel(
            grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), localPool())),
        stub(coord::Coordinator::NewStub(channel)) {}
  static grpc::ChannelArguments localPool() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return args;
  }

  bool connected() {
    return channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }
  grpc::Status registerAgent(const std::string& id, const std::string& host) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname(host);
    req.mutable_agent()->set_rpc_address(host + ":7471");
    req.mutable_agent()->set_data_address(std::string("\x00ucx-", 5) + id);
    coord::RegisterAgentReply reply;
    auto ctx = ctxWithDeadline();
    grpc::Status st = stub->RegisterAgent(ctx.get(), req, &reply);
    if (st.ok()) agentSecrets()[id] = reply.agent_secret();
    return st;
  }
  grpc::Status join(const std::string& job, const std::string& agent, int local, int world) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_agent_id(agent);
    req.set_agent_secret(agentSecrets()[agent]);
    req.set_local_size(local);
    req.set_world_size(world);
    coord::JoinJobReply reply;
    auto ctx = ctxWithDeadline();
    return stub->JoinJob(ctx.get(), req, &reply);
  }
  StatusOrKnown heartbeat(const std::string& agent);
  grpc::Status kvPut(const std::string& job, const std::string& key, const std::string& value) {
    coord::KvPutRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_key(key);
    req.set_value(value);
    coord::KvPutReply reply;
    auto ctx = ctxWithDeadline();
    return stub->KvPut(ctx.get(), req, &reply);
  }
  grpc::Status kvGet(const std::string& job, const std::string& key, coord::KvGetReply* reply) {
    coord::KvGetRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_key(key);
    auto ctx = ctxWithDeadline();
    return stub->KvGet(ctx.get(), req, reply);
  }
  // The first World a new watch gets.
  grpc::Status firstWorld(const std::string& job, const std::string& agent, coord::World* world) {
    coord::WatchJobRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_agent_id(agent);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto reader = stub->WatchJob(&ctx, req);
    if (reader->Read(world)) {
      ctx.TryCancel();
      reader->Finish();
      return grpc::Status::OK;
    }
    return reader->Finish();
  }
  coord::ListJobsReply jobs() {
    coord::ListJobsReply reply;
    auto ctx = ctxWithDeadline();
    EXPECT_TRUE(stub->ListJobs(ctx.get(), {}, &reply).ok());
    return reply;
  }

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<coord::Coordinator::Stub> stub;
};

StatusOrKnown Client::heartbeat(const std::string& agent) {
  coord::HeartbeatRequest req;
  req.set_agent_id(agent);
  req.set_agent_secret(agentSecrets()[agent]);
  coord::HeartbeatReply reply;
  auto ctx = ctxWithDeadline();
  StatusOrKnown out;
  out.status = stub->Heartbeat(ctx.get(), req, &reply);
  out.known = reply.known();
  return out;
}

std::string sameWorld(const coord::World& a, const coord::World& b) {
  if (a.SerializeAsString() == b.SerializeAsString()) return "";
  return "before:\n" + a.DebugString() + "after:\n" + b.DebugString();
}

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = first_.dir() + "/state";
    std::string error;
    ASSERT_TRUE(first_.start(KOLO_COORDINATOR_BIN, args(), milliseconds(15000), &error)) << error;
  }
  void TearDown() override {
    if (HasFailure()) {
      std::cerr << "--- first kolo-coordinator log ---\n" << first_.log() << "---\n";
      std::cerr << "--- restarted kolo-coordinator log ---\n" << second_.log() << "---\n";
    }
    first_.kill();
    second_.kill();
  }
  std::vector<std::string> args() const {
    return {"--state-dir",
            state_dir_,
            "--lease-ms",
            std::to_string(kLeaseMs),
            "--heartbeat-interval-ms",
            "200"};
  }
  // SIGKILLs the first coordinator and starts another on its port and dir.
  void killAndRestart() {
    first_.signal(SIGKILL);
    auto status = first_.waitExit(milliseconds(5000));
    ASSERT_TRUE(status.has_value());
    ASSERT_TRUE(WIFSIGNALED(*status));
    std::vector<std::string> a = args();
    a.insert(a.end(), {"--listen", first_.address()});  // the last --listen wins
    std::string error;
    ASSERT_TRUE(second_.start(KOLO_COORDINATOR_BIN, a, milliseconds(15000), &error)) << error;
    ASSERT_EQ(second_.address(), first_.address());
  }

  static constexpr int64_t kLeaseMs = 4000;
  testing::CoordinatorProcess first_;
  testing::CoordinatorProcess second_;
  std::string state_dir_;
};

TEST_F(DurabilityTest, KillNineAndRestartKeepsJobsGenerationsKeysAndAgents) {
  Client before(first_.address());
  ASSERT_TRUE(before.connected());
  ASSERT_TRUE(before.registerAgent("agent-1", "host-b").ok());
  ASSERT_TRUE(before.registerAgent("agent-2", "host-a").ok());
  ASSERT_TRUE(before.join("job", "agent-1", 2, 3).ok());
  ASSERT_TRUE(before.join("job", "agent-2", 1, 3).ok());
  ASSERT_TRUE(before.join("forming", "agent-1", 1, 4).ok());
  ASSERT_TRUE(before.kvPut("job", "nccl-id", std::string("\x00\x01\x02", 3)).ok());
  coord::World world_before;
  ASSERT_TRUE(before.firstWorld("job", "agent-1", &world_before).ok());
  ASSERT_EQ(world_before.state(), coord::RUNNING);
  ASSERT_EQ(world_before.generation(), 1u);

  killAndRestart();
  auto restarted_at = SteadyClock::now();
  Client after(second_.address());
  ASSERT_TRUE(after.connected());

  // The old agents are known (fresh lease), so they keep their jobs.
  for (const char* id : {"agent-1", "agent-2"}) {
    StatusOrKnown hb = after.heartbeat(id);
    ASSERT_TRUE(hb.status.ok()) << hb.status.error_message();
    EXPECT_TRUE(hb.known) << id << " must be known after the restart";
  }
  ASSERT_LT(SteadyClock::now() - restarted_at, milliseconds(kLeaseMs))
      << "the checks above must run within one lease to mean anything";

  // The job is RUNNING with the same generation and offsets, and a watch
  // re-opened by an agent gets that World at once.
  coord::World world_after;
  ASSERT_TRUE(after.firstWorld("job", "agent-1", &world_after).ok());
  EXPECT_EQ(sameWorld(world_before, world_after), "");
  coord::ListJobsReply jobs = after.jobs();
  ASSERT_EQ(jobs.jobs_size(), 2);
  for (const auto& j : jobs.jobs()) {
    if (j.job_id() == "job") {
      EXPECT_EQ(j.state(), coord::RUNNING);
      EXPECT_EQ(j.generation(), 1u);
      EXPECT_EQ(j.joined_ranks(), 3);
    } else {
      EXPECT_EQ(j.job_id(), "forming");
      EXPECT_EQ(j.state(), coord::FORMING);
      EXPECT_EQ(j.joined_ranks(), 1);
    }
  }
  // The key survived.
  coord::KvGetReply got;
  ASSERT_TRUE(after.kvGet("job", "nccl-id", &got).ok());
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.value(), std::string("\x00\x01\x02", 3));
  // A member retrying its join of the RUNNING job is fine; the forming job
  // goes on forming and seals with the same rules.
  EXPECT_TRUE(after.join("job", "agent-1", 2, 3).ok());
  ASSERT_TRUE(after.registerAgent("agent-3", "host-c").ok());
  ASSERT_TRUE(after.join("forming", "agent-3", 3, 4).ok());
  coord::World sealed;
  ASSERT_TRUE(after.firstWorld("forming", "agent-3", &sealed).ok());
  EXPECT_EQ(sealed.state(), coord::RUNNING);
  EXPECT_EQ(sealed.generation(), 1u);
}

TEST_F(DurabilityTest, AnAgentThatDoesNotComeBackIsLostOneLeaseAfterTheRestart) {
  Client before(first_.address());
  ASSERT_TRUE(before.connected());
  ASSERT_TRUE(before.registerAgent("alive", "host-a").ok());
  ASSERT_TRUE(before.registerAgent("dead", "host-d").ok());
  ASSERT_TRUE(before.join("job", "alive", 1, 2).ok());
  ASSERT_TRUE(before.join("job", "dead", 1, 2).ok());

  killAndRestart();
  auto restarted_at = SteadyClock::now();
  Client after(second_.address());
  ASSERT_TRUE(after.connected());
  // Only "alive" heartbeats; watch until the job fails (bounded).
  coord::WatchJobRequest req;
  req.set_job_id("job");
  req.set_token("tok");
  req.set_agent_id("alive");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(kLeaseMs + 10000));
  auto reader = after.stub->WatchJob(&ctx, req);
  coord::World world;
  ASSERT_TRUE(reader->Read(&world));
  EXPECT_EQ(world.state(), coord::RUNNING);
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread heartbeats([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      lock.unlock();
      after.heartbeat("alive");
      lock.lock();
      cv.wait_for(lock, milliseconds(200), [&] { return stop; });
    }
  });
  bool failed = false;
  while (reader->Read(&world)) {
    if (world.state() == coord::FAILED) {
      failed = true;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  heartbeats.join();
  ASSERT_TRUE(failed);
  EXPECT_EQ(world.reason().rfind("agent dead (host host-d) lost", 0), 0u) << world.reason();
  EXPECT_GE(SteadyClock::now() - restarted_at, milliseconds(kLeaseMs - 500))
      << "restored agents get a whole lease";
  ctx.TryCancel();
  reader->Finish();
  StatusOrKnown hb = after.heartbeat("alive");
  EXPECT_TRUE(hb.known);
}

TEST_F(DurabilityTest, ACorruptStateDirRefusesToStart) {
  Client before(first_.address());
  ASSERT_TRUE(before.connected());
  ASSERT_TRUE(before.registerAgent("a", "h").ok());
  first_.signal(SIGKILL);
  ASSERT_TRUE(first_.waitExit(milliseconds(5000)).has_value());
  {
    std::ofstream journal(state_dir_ + "/journal", std::ios::trunc);
    journal << "this is not a record\n{\"seq\":9}\n";
  }
  auto run = testing::runToCompletion(KOLO_COORDINATOR_BIN,
                                      {"--listen", "127.0.0.1:0", "--state-dir", state_dir_},
                                      milliseconds(10000));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("journal line 1"), std::string::npos) << run.output;
}

// Someone with access to the state dir swaps a job's token in the journal
// (to take the job over after the restart): the record's checksum no
// longer matches and the coordinator refuses to start, naming file and line.
TEST_F(DurabilityTest, AJournalWithAnAlteredTokenRefusesToStartNamingTheLine) {
  Client before(first_.address());
  ASSERT_TRUE(before.connected());
  ASSERT_TRUE(before.registerAgent("a", "h").ok());
  ASSERT_TRUE(before.join("job", "a", 1, 2).ok());
  first_.signal(SIGKILL);
  ASSERT_TRUE(first_.waitExit(milliseconds(5000)).has_value());

  std::string path = state_dir_ + "/journal";
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  // Only the token's hash is journaled (issue 47), never the token.
  EXPECT_EQ(text.find("\"tok\""), std::string::npos) << text;
  const std::string was = "\"token\":\"" + hashSecret("tok") + "\"";
  size_t at = text.find(was);
  ASSERT_NE(at, std::string::npos) << text;
  size_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
  text.replace(at, was.size(), "\"token\":\"" + hashSecret("own") + "\"");
  {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }
  auto run = testing::runToCompletion(KOLO_COORDINATOR_BIN,
                                      {"--listen", "127.0.0.1:0", "--state-dir", state_dir_},
                                      milliseconds(10000));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find(path + " line " + std::to_string(line) + ": checksum mismatch"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace kolo::coordinator
