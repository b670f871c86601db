// Issue 47: the coordinator attacked as a tenant would (any local user on
// loopback, no credentials but its own job tokens), through the real
// process, with a victim job beside that must keep working. Each attack is
// listed in docs/security.md, "Attacks on the coordinator (issue 47)".
// KOLO_TEST_COORDINATOR_BIN runs them against another binary (an older
// coordinator, for the "before" column).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "kolo/proto/coordinator.grpc.pb.h"
#include "tests/coordinator/coordinator_process.h"
#include "tests/coordinator/raw_calls.h"

#ifndef KOLO_COORDINATOR_BIN
#error "KOLO_COORDINATOR_BIN must name the kolo-coordinator binary"
#endif

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

std::string binary() {
  const char* other = std::getenv("KOLO_TEST_COORDINATOR_BIN");
  return other != nullptr && *other != '\0' ? other : KOLO_COORDINATOR_BIN;
}

std::unique_ptr<grpc::ClientContext> ctxFor(milliseconds d = milliseconds(5000)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

class AttackTest : public ::testing::Test {
 protected:
  void start(std::vector<std::string> flags) {
    std::vector<std::string> args{"--lease-ms", "3000", "--heartbeat-interval-ms", "500"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::string error;
    ASSERT_TRUE(proc_.start(binary(), args, milliseconds(15000), &error)) << error;
    channel_ = grpc::CreateChannel(proc_.address(), grpc::InsecureChannelCredentials());
    ASSERT_TRUE(
        channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
    stub_ = coord::Coordinator::NewStub(channel_);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "--- kolo-coordinator log ---\n" << proc_.log() << "---\n";
    proc_.kill();
  }
  bool alive() { return !proc_.waitExit(milliseconds(0)).has_value(); }

  grpc::Status registerAgent(const std::string& id) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname("host-" + id);
    coord::RegisterAgentReply reply;
    auto ctx = ctxFor();
    grpc::Status st = stub_->RegisterAgent(ctx.get(), req, &reply);
    if (st.ok()) secrets_[id] = reply.agent_secret();
    return st;
  }
  grpc::Status join(const std::string& job, const std::string& token, const std::string& agent,
                    int world) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_local_size(1);
    req.set_world_size(world);
    coord::JoinJobReply reply;
    auto ctx = ctxFor();
    return stub_->JoinJob(ctx.get(), req, &reply);
  }
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<coord::World>> reader;
    coord::World first;
    grpc::Status refusal;  // when no first World came
    bool served = false;
  };
  // A stream with the agent's secret when `as_member` (the job's own agent).
  Watch watch(const std::string& job, const std::string& token, const std::string& agent,
              bool as_member) {
    coord::WatchJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    if (as_member) req.set_agent_secret(secrets_[agent]);
    Watch w;
    w.ctx = ctxFor(milliseconds(30000));
    w.reader = stub_->WatchJob(w.ctx.get(), req);
    w.served = w.reader->Read(&w.first);
    if (!w.served) w.refusal = w.reader->Finish();
    return w;
  }
  // The victim: two agents, a RUNNING job, a member's watch.
  void startVictim() {
    ASSERT_TRUE(registerAgent("victim-a").ok());
    ASSERT_TRUE(registerAgent("victim-b").ok());
    ASSERT_TRUE(join("victim", "victim-token", "victim-a", 2).ok());
    ASSERT_TRUE(join("victim", "victim-token", "victim-b", 2).ok());
    victim_watch_ = watch("victim", "victim-token", "victim-a", true);
    ASSERT_TRUE(victim_watch_.served) << victim_watch_.refusal.error_message();
    ASSERT_EQ(victim_watch_.first.state(), coord::RUNNING);
  }
  // The victim job still runs and answers: its KV, a new member stream.
  void expectVictimWorks() {
    ASSERT_TRUE(alive()) << "the coordinator died";
    coord::KvPutRequest put;
    put.set_job_id("victim");
    put.set_token("victim-token");
    put.set_key("nccl-id");
    put.set_value("id-bytes");
    coord::KvPutReply put_reply;
    auto ctx = ctxFor();
    grpc::Status st = stub_->KvPut(ctx.get(), put, &put_reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    Watch w = watch("victim", "victim-token", "victim-b", true);
    ASSERT_TRUE(w.served) << w.refusal.error_message();
    EXPECT_EQ(w.first.state(), coord::RUNNING);
    EXPECT_EQ(w.first.generation(), 1u);
    w.ctx->TryCancel();
    (void)w.reader->Finish();
  }

  testing::CoordinatorProcess proc_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
  std::map<std::string, std::string> secrets_;
  Watch victim_watch_;
};

// Attack 2 of issue 47: streaming calls with bytes that do not parse (and
// valid ones for jobs that do not exist), cancelled at once or 1 ms later,
// from 4 threads. Before: WatchJob finished such a call twice (its refusal,
// then OnCancel) and gRPC aborted the coordinator within ~200 calls.
TEST_F(AttackTest, MalformedStreamingCallsCancelledAtOnceNeverCrashIt) {
  start({});
  startVictim();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 150;
  const std::string methods[] = {"/kolo.coord.Coordinator/WatchJob",
                                 "/kolo.coord.Coordinator/HeartbeatStream",
                                 "/kolo.coord.Coordinator/KvGet"};
  coord::WatchJobRequest unknown;
  unknown.set_job_id("no-such-job");
  unknown.set_token("t");
  const std::string valid_unknown = unknown.SerializeAsString();
  std::atomic<int> unfinished{0}, calls{0};
  auto t0 = SteadyClock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        // Two in three calls are WatchJob (the one that crashed).
        const std::string& method = methods[k % 6 < 4 ? 0 : (k % 6 == 4 ? 1 : 2)];
        std::string bytes = k % 5 == 0 ? valid_unknown : testing::unparseableBytes(k);
        auto out = testing::rawCallCancelled(channel_, method, bytes, milliseconds(k % 2));
        ++calls;
        if (!out.finished) ++unfinished;
      }
    });
  }
  for (auto& th : threads) th.join();
  auto took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0);
  std::printf("[attack] %d malformed/cancelled streaming calls in %lld ms; coordinator %s\n",
              calls.load(), static_cast<long long>(took.count()), alive() ? "alive" : "DEAD");
  EXPECT_EQ(unfinished.load(), 0) << "calls that did not end within their deadline";
  ASSERT_TRUE(alive()) << "the coordinator died under malformed, cancelled calls";
  expectVictimWorks();
}

// Attack 3: RegisterAgent in another agent's name (default configuration).
// Before: the victim's job FAILED at once and its agent was locked out.
TEST_F(AttackTest, RegisterAgentInALiveAgentsNameIsRefusedAndItsJobRunsOn) {
  start({});
  startVictim();
  for (const char* wrong : {"", "0123456789abcdef0123456789abcdef"}) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id("victim-b");
    req.mutable_agent()->set_hostname("attacker");
    req.set_previous_secret(wrong);
    coord::RegisterAgentReply reply;
    auto ctx = ctxFor();
    grpc::Status st = stub_->RegisterAgent(ctx.get(), req, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
    EXPECT_NE(st.error_message().find(
                  "RegisterAgent for agent victim-b refused: the id is registered by a live "
                  "agent (host host-victim-b"),
              std::string::npos)
        << st.error_message();
    EXPECT_TRUE(reply.agent_secret().empty());
  }
  // The victim's agent still holds its id: its heartbeat is accepted.
  coord::HeartbeatRequest hb;
  hb.set_agent_id("victim-b");
  hb.set_agent_secret(secrets_["victim-b"]);
  coord::HeartbeatReply hb_reply;
  auto ctx = ctxFor();
  ASSERT_TRUE(stub_->Heartbeat(ctx.get(), hb, &hb_reply).ok());
  EXPECT_TRUE(hb_reply.known());
  // ListAgents shows ids, not secrets: nothing there re-registers an id.
  coord::ListAgentsReply agents;
  auto lctx = ctxFor();
  ASSERT_TRUE(stub_->ListAgents(lctx.get(), coord::ListAgentsRequest(), &agents).ok());
  EXPECT_EQ(agents.SerializeAsString().find(secrets_["victim-b"]), std::string::npos);
  expectVictimWorks();
}

// Attack 5: a tenant with job tokens of its own opens watch streams on its
// jobs. Before: 16,384 streams from two tokens and every new job's watch was
// refused. Now: per token, then the share of non-agent streams, are bounded
// and the capacity reserved for the jobs' own agents stays free.
TEST_F(AttackTest, WatchStreamFloodIsBoundedPerTokenAndLeavesTheAgentsReserve) {
  start({"--max-watch-streams", "200", "--reserved-watch-streams", "80",
         "--max-watch-streams-per-token", "40", "--max-watch-streams-per-peer", "1000"});
  startVictim();
  ASSERT_TRUE(registerAgent("tenant").ok());
  std::vector<Watch> open;
  std::map<std::string, std::string> refusals;  // token -> last refusal
  int served = 0;
  auto flood = [&](const std::string& token, int n) {
    for (int i = 0; i < n; ++i) {
      Watch w = watch("job-" + token, token, "tenant", false);
      if (w.served) {
        ++served;
        open.push_back(std::move(w));
      } else {
        refusals[token] = w.refusal.error_message();
        EXPECT_EQ(w.refusal.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      }
    }
  };
  for (const char* token : {"A", "B", "C", "D"}) {
    ASSERT_TRUE(join(std::string("job-") + token, token, "tenant", 1).ok());  // RUNNING at once
  }
  flood("A", 50);
  EXPECT_EQ(served, 40);
  EXPECT_EQ(refusals["A"],
            "WatchJob of job job-A refused: the jobs of this token already have 40 watch streams "
            "of callers that are not their agents (--max-watch-streams-per-token 40)");
  flood("B", 40);
  flood("C", 40);
  flood("D", 40);
  // 200 - 80 reserved = 120 for non-agent streams; victim-a's stream is an agent's.
  EXPECT_EQ(served, 120);
  EXPECT_NE(refusals["D"].find("the other 80 of --max-watch-streams 200 are kept for the jobs' "
                               "agents"),
            std::string::npos)
      << refusals["D"];
  EXPECT_NE(refusals["D"].find("(--reserved-watch-streams 80)"), std::string::npos);
  // A new legit job is created and its agents watch it, from the reserve.
  ASSERT_TRUE(registerAgent("new-a").ok());
  ASSERT_TRUE(registerAgent("new-b").ok());
  ASSERT_TRUE(join("new-job", "new-token", "new-a", 2).ok());
  ASSERT_TRUE(join("new-job", "new-token", "new-b", 2).ok());
  for (const char* agent : {"new-a", "new-b"}) {
    Watch w = watch("new-job", "new-token", agent, true);
    ASSERT_TRUE(w.served) << w.refusal.error_message();
    EXPECT_EQ(w.first.state(), coord::RUNNING);
    open.push_back(std::move(w));
  }
  // One member agent cannot take the reserve alone either.
  int member_served = 0;
  grpc::Status member_refusal;
  for (int i = 0; i < 6; ++i) {
    Watch w = watch("new-job", "new-token", "new-a", true);
    if (w.served) {
      ++member_served;
      open.push_back(std::move(w));
    } else {
      member_refusal = w.refusal;
    }
  }
  EXPECT_EQ(member_served, 3);  // 4 per member, one already open
  EXPECT_NE(member_refusal.error_message().find("(--max-watch-streams-per-member 4)"),
            std::string::npos)
      << member_refusal.error_message();
  expectVictimWorks();
  for (Watch& w : open) w.ctx->TryCancel();
  for (Watch& w : open) (void)w.reader->Finish();
}

// Attack 7: growing the coordinator: jobs per agent and in all, keys and
// bytes per job, KvGet waiters per job, and ListJobs past gRPC's 4 MiB.
TEST_F(AttackTest, JobsKeysWaitersAndListingsAreBoundedAndNameTheirFlags) {
  start({"--max-jobs", "40", "--max-jobs-per-agent", "3", "--max-kv-keys-per-job", "10",
         "--max-kv-bytes-per-job", "2000", "--max-kv-waiters-per-job", "5",
         "--max-list-reply-bytes", "4096"});
  startVictim();
  ASSERT_TRUE(registerAgent("tenant").ok());
  // Jobs per agent.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(join("t" + std::to_string(i), "T", "tenant", 2).ok());
  grpc::Status st = join("t3", "T", "tenant", 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "JoinJob of job t3 (agent tenant) refused: agent tenant is already in 3 active jobs "
            "(--max-jobs-per-agent 3)");
  // Jobs in all, from many agents, with long ids: the listing is cut.
  const std::string pad(120, 'x');
  int created = 4;  // victim + t0..t2
  for (int a = 0; created < 40; ++a) {
    std::string agent = "flood-" + std::to_string(a);
    ASSERT_TRUE(registerAgent(agent).ok());
    for (int j = 0; j < 3 && created < 40; ++j, ++created) {
      ASSERT_TRUE(join(agent + "-" + std::to_string(j) + pad, "F", agent, 2).ok());
    }
  }
  ASSERT_TRUE(registerAgent("one-more").ok());
  st = join("job-41", "F", "one-more", 2);
  EXPECT_EQ(st.error_message(),
            "JoinJob of job job-41 (agent one-more) refused: the coordinator already holds 40 "
            "jobs (active and retained) (--max-jobs 40)");
  coord::ListJobsReply jobs;
  auto ctx = ctxFor();
  ASSERT_TRUE(stub_->ListJobs(ctx.get(), coord::ListJobsRequest(), &jobs).ok());
  EXPECT_TRUE(jobs.truncated());
  EXPECT_EQ(jobs.total(), 40u);
  EXPECT_LT(jobs.jobs_size(), 40);
  EXPECT_LE(jobs.ByteSizeLong(), 4096u + 64u);
  // Keys and bytes per job.
  auto put = [&](const std::string& key, size_t bytes) {
    coord::KvPutRequest req;
    req.set_job_id("t0");
    req.set_token("T");
    req.set_key(key);
    req.set_value(std::string(bytes, 'v'));
    coord::KvPutReply reply;
    auto c = ctxFor();
    return stub_->KvPut(c.get(), req, &reply);
  };
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(put("k" + std::to_string(i), 10).ok());
  st = put("k10", 10);
  EXPECT_EQ(st.error_message(),
            "KvPut of key 'k10' of job t0 refused: the job already has 10 keys "
            "(--max-kv-keys-per-job 10)");
  EXPECT_TRUE(put("k3", 100).ok()) << "an existing key may still change";
  st = put("k4", 3000);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("(--max-kv-bytes-per-job 2000)"), std::string::npos)
      << st.error_message();
  // KvGet waiters per job: 8 waits at once, 5 wait, 3 are refused at once.
  struct Get {
    grpc::ClientContext ctx;
    coord::KvGetRequest req;
    coord::KvGetReply reply;
    grpc::Status status;
    std::atomic<bool> done{false};
  };
  std::vector<std::unique_ptr<Get>> gets;
  for (int i = 0; i < 8; ++i) {
    auto g = std::make_unique<Get>();
    g->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    g->req.set_job_id("t1");
    g->req.set_token("T");
    g->req.set_key("later");
    g->req.set_wait_ms(8000);
    Get* raw = g.get();
    stub_->async()->KvGet(&raw->ctx, &raw->req, &raw->reply, [raw](grpc::Status s) {
      raw->status = std::move(s);
      raw->done = true;
    });
    gets.push_back(std::move(g));
  }
  auto wait_refused = SteadyClock::now() + std::chrono::seconds(5);
  auto refusedCount = [&] {
    int n = 0;
    for (auto& g : gets) n += g->done.load() ? 1 : 0;
    return n;
  };
  while (refusedCount() < 3 && SteadyClock::now() < wait_refused) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(refusedCount(), 3);
  for (auto& g : gets) {
    if (!g->done.load()) continue;
    EXPECT_EQ(g->status.error_message(),
              "KvGet of key 'later' of job t1 refused: the job already has 5 KvGet calls waiting "
              "(--max-kv-waiters-per-job 5)");
  }
  coord::KvPutRequest later;
  later.set_job_id("t1");
  later.set_token("T");
  later.set_key("later");
  later.set_value("v");
  coord::KvPutReply later_reply;
  auto c = ctxFor();
  ASSERT_TRUE(stub_->KvPut(c.get(), later, &later_reply).ok());
  auto wait_all = SteadyClock::now() + std::chrono::seconds(5);
  while (refusedCount() < 8 && SteadyClock::now() < wait_all) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  int found = 0;
  for (auto& g : gets) found += g->done.load() && g->status.ok() && g->reply.found() ? 1 : 0;
  EXPECT_EQ(found, 5);
  expectVictimWorks();
}

}  // namespace
}  // namespace kolo::coordinator

namespace kolo::coordinator {
namespace {

// Attack 7 (journal growth): a job's member rewriting one key with values
// of 2 KB. Before: the journal was compacted only every 10,000 records, so
// it grew by the values' bytes (GBs with values of MBs). Now it is
// compacted by bytes too (--state-compact-bytes).
TEST_F(AttackTest, TheJournalIsCompactedByBytesNotOnlyByRecords) {
  char tmpl[] = "/tmp/kolo-attack-state-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/state";
  start({"--state-dir", dir, "--state-compact-bytes", "65536"});
  startVictim();
  size_t largest = 0;
  for (int i = 0; i < 300; ++i) {
    coord::KvPutRequest put;
    put.set_job_id("victim");
    put.set_token("victim-token");
    put.set_key("big");
    put.set_value(std::string(2000, static_cast<char>('a' + i % 26)));
    coord::KvPutReply reply;
    auto ctx = ctxFor();
    ASSERT_TRUE(stub_->KvPut(ctx.get(), put, &reply).ok());  // durable when answered
    std::error_code ec;
    largest = std::max<size_t>(largest, std::filesystem::file_size(dir + "/journal", ec));
  }
  std::printf("[attack] 300 KvPuts of 2 KB (600 KB): the journal peaked at %zu bytes\n", largest);
  EXPECT_LT(largest, 65536u + 3 * 4096u) << "the journal grew past --state-compact-bytes";
  expectVictimWorks();
  proc_.kill();
  std::filesystem::remove_all(tmpl);
}

// A TCP connection to 127.0.0.1:port (or -1).
int connectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET /healthz with a `deadline` on the whole exchange: the status line, or
// "" if none came in time.
std::string probeHealthz(int port, milliseconds deadline) {
  int fd = connectLoopback(port);
  if (fd < 0) return "";
  timeval tv{0, static_cast<suseconds_t>(deadline.count() * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n";
  std::string got;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[512];
    auto until = SteadyClock::now() + deadline;
    while (got.find("\r\n") == std::string::npos && SteadyClock::now() < until) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  auto eol = got.find("\r\n");
  return eol == std::string::npos ? "" : got.substr(0, eol);
}

// Attack 8 (coordinator side): slow-loris clients on --metrics-listen while
// /healthz is probed as a liveness probe would (1 s deadline). Before: 8
// slow connections made 5 of 6 probes time out.
TEST_F(AttackTest, HealthzAnswersWithinItsDeadlineUnderSlowLorisClients) {
  start({"--metrics-listen", "127.0.0.1:0"});
  // The bound address is logged: "metrics on http://127.0.0.1:PORT/metrics".
  int port = 0;
  for (auto until = SteadyClock::now() + std::chrono::seconds(5);
       port == 0 && SteadyClock::now() < until;) {
    std::string log = proc_.log();
    auto at = log.find("metrics on http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(log.c_str() + at + 28);
    if (port == 0) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GT(port, 0) << proc_.log();
  ASSERT_EQ(probeHealthz(port, milliseconds(1000)), "HTTP/1.1 200 OK");
  // 80 slow clients (more than the server's 64 connections): each sends
  // part of a request and then nothing.
  std::vector<int> slow;
  for (int i = 0; i < 80; ++i) {
    int fd = connectLoopback(port);
    if (fd < 0) continue;
    const std::string part = "GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Slow: ";
    (void)::send(fd, part.data(), part.size(), MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  EXPECT_GE(slow.size(), 8u);
  int answered = 0;
  milliseconds worst{0};
  for (int i = 0; i < 6; ++i) {
    auto t0 = SteadyClock::now();
    std::string line = probeHealthz(port, milliseconds(1000));
    auto took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0);
    worst = std::max(worst, took);
    answered += line == "HTTP/1.1 200 OK" ? 1 : 0;
  }
  std::printf(
      "[attack] /healthz with %zu slow clients: %d of 6 probes answered within 1 s "
      "(slowest %lld ms)\n",
      slow.size(), answered, static_cast<long long>(worst.count()));
  EXPECT_EQ(answered, 6);
  for (int fd : slow) ::close(fd);
  ASSERT_TRUE(alive());
}

}  // namespace
}  // namespace kolo::coordinator

namespace kolo::coordinator {
namespace {

int64_t rssKb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

// Not a test: what one tenant's quotas cost the coordinator at their
// defaults (docs/security.md, "Attacks on the coordinator (issue 47)").
// Run with --gtest_also_run_disabled_tests --gtest_filter='*MeasureDefaultBounds'.
TEST_F(AttackTest, DISABLED_MeasureDefaultBounds) {
  start({});
  startVictim();
  ASSERT_TRUE(registerAgent("tenant").ok());
  ASSERT_TRUE(join("t", "T", "tenant", 2).ok());
  const int64_t base = rssKb(proc_.pid());
  // KvGet waiters on one job, up to the quota and one more.
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<coord::KvGetRequest>> reqs;
  std::vector<std::unique_ptr<coord::KvGetReply>> replies;
  std::atomic<int> refused{0};
  for (int i = 0; i < 1025; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    ctxs.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    reqs.push_back(std::make_unique<coord::KvGetRequest>());
    reqs.back()->set_job_id("t");
    reqs.back()->set_token("T");
    reqs.back()->set_key("never-" + std::to_string(i));
    reqs.back()->set_wait_ms(25000);
    replies.push_back(std::make_unique<coord::KvGetReply>());
    stub_->async()->KvGet(ctxs.back().get(), reqs.back().get(), replies.back().get(),
                          [&refused](grpc::Status s) {
                            if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
                          });
  }
  for (auto until = SteadyClock::now() + std::chrono::seconds(10);
       refused.load() < 1 && SteadyClock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  const int64_t waiters = rssKb(proc_.pid());
  // The job's KV store filled to --max-kv-bytes-per-job (16 MiB) in 4 KB values.
  int puts = 0;
  for (int i = 0; i < 4096; ++i) {
    coord::KvPutRequest put;
    put.set_job_id("t");
    put.set_token("T");
    put.set_key("k" + std::to_string(i));
    put.set_value(std::string(4080, 'v'));
    coord::KvPutReply reply;
    auto ctx = ctxFor();
    if (!stub_->KvPut(ctx.get(), put, &reply).ok()) break;
    ++puts;
  }
  const int64_t kv = rssKb(proc_.pid());
  // Non-member watch streams of one token, up to --max-watch-streams-per-token.
  std::vector<Watch> open;
  int served = 0;
  for (int i = 0; i < 260; ++i) {
    Watch w = watch("t", "T", "tenant", false);
    if (w.served) {
      ++served;
      open.push_back(std::move(w));
    }
  }
  const int64_t streams = rssKb(proc_.pid());
  std::printf(
      "[bounds] RSS %lld KB idle; +%lld KB with %d KvGet waiters (%d refused); "
      "+%lld KB with %d KvPuts of 4 KB; +%lld KB with %d watch streams of one token\n",
      static_cast<long long>(base), static_cast<long long>(waiters - base), 1025 - refused.load(),
      refused.load(), static_cast<long long>(kv - waiters), puts,
      static_cast<long long>(streams - kv), served);
  for (Watch& w : open) w.ctx->TryCancel();
  for (Watch& w : open) (void)w.reader->Finish();
  for (auto& c : ctxs) c->TryCancel();
  proc_.kill();
}

}  // namespace
}  // namespace kolo::coordinator
