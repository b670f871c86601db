// A hostile client on the agent's socket (issue 21, docs/security.md
// "Bounds and quotas on the socket"): raw frames and a hand-driven arena,
// against the real kolo-agent and kolo-coordinator. Each test shows that the
// attacker gets a clear refusal (its text asserted) or only its own job
// fails, that an honest job on the same agent finishes with correct
// results, and that the agent stays up and still answers `kolo status`.
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "common/dtype.h"
#include "common/fd.h"
#include "common/frame.h"
#include "common/ipc_layout.h"
#include "harness.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string checkBin() { return binDir() + "/kolo_check"; }

// Non-blocking: connect fails with EAGAIN instead of waiting while the
// agent's backlog is full.
int connectRaw(const std::string& path, bool nonblocking = false) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One raw connection: frames out, AgentFrames (and descriptors) in.
struct RawConn {
  UniqueFd fd;
  FrameDecoder dec;
  std::deque<UniqueFd> fds;

  explicit RawConn(const std::string& socket, bool nonblocking = false)
      : fd(connectRaw(socket, nonblocking)) {}
  bool ok() const { return fd.valid(); }
  Status send(const ipc::ClientFrame& f) { return sendFrame(fd.get(), f); }
  // The next AgentFrame within the timeout (also one that arrived just
  // before the agent closed the connection).
  StatusOr<ipc::AgentFrame> recv(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = Clock::now() + timeout;
    std::string payload;
    Status st;
    while (!dec.next(&payload)) {
      if (!st.isOk()) return st;
      if (Clock::now() >= deadline) return timedOut("no frame from the agent");
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) st = readAvailable(fd.get(), &dec, &fds);
    }
    ipc::AgentFrame f;
    if (!f.ParseFromString(payload)) return internalError("not an AgentFrame");
    return f;
  }
  // True when the agent closes the connection within the timeout.
  bool closedByAgent(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        ssize_t n = ::recv(fd.get(), buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
        if (n > 0) (void)dec.feed(buf, static_cast<size_t>(n));
      }
    }
    return false;
  }
};

ipc::ClientFrame hello(const std::string& job, int local_rank, int local_size, int world_size) {
  ipc::ClientFrame f;
  ipc::Hello* h = f.mutable_hello();
  h->set_protocol_version(kIpcProtocolVersion);
  h->set_job_id(job);
  h->set_token("secret-" + job);
  h->set_local_rank(local_rank);
  h->set_local_size(local_size);
  h->set_world_size(world_size);
  h->set_pid(static_cast<int32_t>(::getpid()));
  h->set_arena_bytes(16 << 20);
  return f;
}

// An admitted raw trainer: its arena mapped, its rings and eventfds.
struct RawTrainer {
  RawConn conn;
  void* base = MAP_FAILED;
  size_t bytes = 0;
  UniqueFd doorbell, completion;
  SubmitRing submit;
  CompletionRing completions;
  uint64_t data_offset = 0;

  explicit RawTrainer(const std::string& socket) : conn(socket) {}
  ~RawTrainer() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  Status admit(const std::string& job, int local_rank, int local_size) {
    RETURN_IF_ERROR(conn.send(hello(job, local_rank, local_size, local_size)));
    ASSIGN_OR_RETURN(ipc::AgentFrame f, conn.recv());
    if (!f.has_welcome() || f.welcome().code() != 0)
      return internalError("not admitted: " + f.DebugString());
    if (conn.fds.size() < 3) return internalError("Welcome without its descriptors");
    bytes = f.welcome().arena_bytes();
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, conn.fds[0].get(), 0);
    if (base == MAP_FAILED) return errnoStatus("mmap", errno);
    doorbell = std::move(conn.fds[1]);
    completion = std::move(conn.fds[2]);
    conn.fds.clear();
    auto* hdr = static_cast<ArenaHeader*>(base);
    submit = SubmitRing(static_cast<char*>(base) + hdr->submit_ring_offset);
    completions = CompletionRing(static_cast<char*>(base) + hdr->completion_ring_offset);
    data_offset = hdr->data_offset;
    return okStatus();
  }
  // A one-element float allreduce named `name` on the first data slot.
  bool submitAllreduce(const std::string& name, uint64_t handle) {
    SubmitDesc d{};
    d.handle = handle;
    d.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
    d.dtype = static_cast<uint8_t>(DataType::kFloat32);
    d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    d.ndim = 1;
    d.shape[0] = 1;
    d.prescale = d.postscale = 1.0;
    d.data_offset = data_offset;
    d.data_bytes = 4;
    d.name_len = static_cast<uint32_t>(name.size());
    std::memcpy(d.name, name.data(), name.size());
    if (!submit.tryPush(d)) return false;
    uint64_t one = 1;
    return ::write(doorbell.get(), &one, sizeof one) == sizeof one;
  }
  // The next completion within the timeout.
  std::optional<CompletionDesc> nextCompletion(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    CompletionDesc c;
    while (!completions.tryPop(&c)) {
      if (Clock::now() >= deadline) return std::nullopt;
      pollfd p{completion.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        uint64_t v;
        (void)::read(completion.get(), &v, sizeof v);
      }
    }
    return c;
  }
};

std::string runKolo(const Cluster& c, const std::vector<std::string>& args, int* exit_code) {
  std::vector<std::string> argv = {binDir() + "/kolo"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--agent");
  argv.push_back(c.agentRpc(0));
  static int seq = 0;
  Proc p = spawnProcess(argv, {}, c.dir() + "/kolo-cli-" + std::to_string(seq++) + ".log");
  if (!waitProcess(p, std::chrono::seconds(20))) {
    killProcess(p, SIGKILL);
    waitProcess(p, std::chrono::seconds(5));
  }
  *exit_code = p.exit_code;
  return p.output();
}

// The honest job: two ranks of allreduces whose results kolo_check verifies.
void expectHonestJobFinishes(Cluster& c, const std::string& job) {
  auto ranks = c.launchJob(job, 2, {checkBin(), "loop", "20"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << c.agentLog(0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << c.agentLog(0);
    EXPECT_NE(ranks[r].output().find("OK 20 loop allreduces"), std::string::npos)
        << ranks[r].output();
  }
}

void expectAgentUpAndStatusWorks(Cluster& c) {
  EXPECT_FALSE(waitProcess(c.agent(0), std::chrono::milliseconds(0))) << "the agent died\n"
                                                                      << c.agentLog(0);
  int rc = -1;
  std::string out = runKolo(c, {"status"}, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("node0"), std::string::npos) << out;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos;
       p = text.find(needle, p + needle.size()))
    ++n;
  return n;
}

TEST(HostileClient, JobSettingsAreCheckedAndEveryRankMustAgree) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  RawConn bad(c.socket());
  ASSERT_TRUE(bad.ok());
  ipc::ClientFrame f0 = hello("tuned", 0, 2, 2);
  (*f0.mutable_hello()->mutable_job_settings())["HOROVOD_FUSION_THRESHOLD"] = "lots";
  ASSERT_TRUE(bad.send(f0).isOk());
  auto f = bad.recv();
  ASSERT_TRUE(f.isOk()) << f.status().toString() << c.agentLog(0);
  EXPECT_EQ(f->welcome().message(),
            "job tuned: HOROVOD_FUSION_THRESHOLD=lots in the trainer's environment: expected an "
            "integer from 0 to 1073741824");
  // Rank 0 sets 64 KiB; rank 1 of the same job another value: refused.
  RawConn r0(c.socket()), r1(c.socket());
  ASSERT_TRUE(r0.ok() && r1.ok());
  ipc::ClientFrame h0 = hello("tuned", 0, 2, 2);
  (*h0.mutable_hello()->mutable_job_settings())["HOROVOD_FUSION_THRESHOLD"] = "65536";
  ASSERT_TRUE(r0.send(h0).isOk());
  f = r0.recv();
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  EXPECT_EQ(f->welcome().code(), 0) << f->DebugString();
  ipc::ClientFrame h1 = hello("tuned", 1, 2, 2);
  (*h1.mutable_hello()->mutable_job_settings())["HOROVOD_FUSION_THRESHOLD"] = "1048576";
  ASSERT_TRUE(r1.send(h1).isOk());
  f = r1.recv();
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  EXPECT_EQ(f->welcome().message(),
            "job tuned runs with per-job settings (fusion threshold 65536 bytes) from its first "
            "trainer on this agent, but this trainer's environment gives (fusion threshold 1048576 "
            "bytes): every rank of a job must set the same KOLO_*/HOROVOD_* tuning variables");
  EXPECT_NE(c.agentLog(0).find("job tuned: per-job settings from the trainers' environment: "
                               "fusion threshold 65536 bytes"),
            std::string::npos)
      << c.agentLog(0);
  expectHonestJobFinishes(c, "honest");
}

TEST(HostileClient, HugeLocalSizeHelloIsRefusedNamingTheLimit) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  RawConn a(c.socket());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a.send(hello("greedy", 0, 2147483647, 2147483647)).isOk());
  auto f = a.recv();
  ASSERT_TRUE(f.isOk()) << f.status().toString() << c.agentLog(0);
  ASSERT_TRUE(f->has_welcome()) << f->DebugString();
  EXPECT_EQ(f->welcome().code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_EQ(
      f->welcome().message(),
      "Hello: local_size 2147483647 is out of range [1, 256] (limit set by --max-local-size)");
  // A huge arena is refused too, instead of clamped into an allocation.
  ipc::ClientFrame big = hello("greedy", 0, 1, 1);
  big.mutable_hello()->set_arena_bytes(1ull << 50);
  ASSERT_TRUE(a.send(big).isOk());
  f = a.recv();
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  EXPECT_EQ(f->welcome().message(),
            "Hello: arena_bytes 1125899906842624 is out of range [0, 68719476736] (limit set by "
            "--max-arena-mb)");
  expectHonestJobFinishes(c, "honest");
  expectAgentUpAndStatusWorks(c);
}

TEST(HostileClient, FramesBeforeHelloAreRefusedAndTouchNoFile) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string target = c.dir() + "/victim.json";
  RawConn a(c.socket());
  ASSERT_TRUE(a.ok());
  ipc::ClientFrame tl;
  tl.mutable_timeline()->set_start(true);
  tl.mutable_timeline()->set_path(target);
  ASSERT_TRUE(a.send(tl).isOk());
  auto f = a.recv();
  ASSERT_TRUE(f.isOk()) << f.status().toString() << c.agentLog(0);
  ASSERT_TRUE(f->has_refused()) << f->DebugString();
  EXPECT_EQ(f->refused().code(), static_cast<int>(Code::kPermissionDenied));
  EXPECT_EQ(f->refused().frame(), "TimelineControl");
  EXPECT_EQ(f->refused().message(),
            "a TimelineControl frame before admission: the kolo agent takes only Hello until the "
            "trainer is "
            "admitted to a job");
  EXPECT_TRUE(a.closedByAgent(std::chrono::seconds(5)));
  EXPECT_FALSE(std::filesystem::exists(target)) << "the agent wrote the file a stranger named";

  // Admitted, a trainer may switch the timeline only while its job is the
  // only one on the agent: with a second job here it is refused.
  RawTrainer t1(c.socket()), t2(c.socket());
  ASSERT_TRUE(t1.admit("mine", 0, 1).isOk()) << c.agentLog(0);
  ASSERT_TRUE(t2.admit("other", 0, 1).isOk()) << c.agentLog(0);
  ASSERT_TRUE(t1.conn.send(tl).isOk());
  bool refused = false;
  for (auto deadline = Clock::now() + std::chrono::seconds(10);
       Clock::now() < deadline && !refused;) {
    auto r = t1.conn.recv(std::chrono::seconds(1));
    if (r.isOk() && r->has_refused()) {
      refused = true;
      EXPECT_EQ(r->refused().message(),
                "TimelineControl from job mine refused: this agent serves 1 other job(s) and its "
                "timeline would "
                "record theirs; use `kolo timeline` on the agent");
    }
  }
  EXPECT_TRUE(refused) << c.agentLog(0);
  EXPECT_FALSE(std::filesystem::exists(target));
  expectHonestJobFinishes(c, "honest");
  expectAgentUpAndStatusWorks(c);
}

TEST(HostileClient, NameFloodPastTheQuotaIsRefusedAndStatusStaysBounded) {
  Cluster c(1, {{"KOLO_MAX_NAMES_IN_FLIGHT", "64"}, {"KOLO_STATUS_MAX_IN_FLIGHT", "10"}});
  ASSERT_TRUE(c.ok()) << c.error();
  // Rank 0 of a two-rank job whose rank 1 never comes: every name it
  // submits waits in the table.
  RawTrainer t(c.socket());
  ASSERT_TRUE(t.admit("flood", 0, 2).isOk()) << c.agentLog(0);
  // The job forms once the coordinator seals it (bounded wait, probing).
  uint64_t handle = 1;
  for (auto deadline = Clock::now() + std::chrono::seconds(20);;) {
    ASSERT_LT(Clock::now(), deadline) << "the job never formed\n" << c.agentLog(0);
    ASSERT_TRUE(t.submitAllreduce("probe", handle));
    auto done = t.nextCompletion(std::chrono::milliseconds(500));
    if (!done) break;  // pending: the job has formed and the probe waits for rank 1
    ASSERT_NE(std::string(done->msg, done->msg_len).find("has not formed yet"), std::string::npos)
        << std::string(done->msg, done->msg_len);
    ++handle;
  }
  const int kExtra = 200;
  int refused = 0;
  std::string text;
  for (int i = 0; i < 63 + kExtra; ++i) {  // the probe holds one of the 64
    while (!t.submitAllreduce("flood." + std::to_string(i), ++handle)) {
      auto done = t.nextCompletion(std::chrono::seconds(5));
      ASSERT_TRUE(done) << "the agent stopped draining the ring\n" << c.agentLog(0);
      ++refused;
      text = std::string(done->msg, done->msg_len);
    }
  }
  while (refused < kExtra) {
    auto done = t.nextCompletion(std::chrono::seconds(10));
    ASSERT_TRUE(done) << refused << " refusals\n" << c.agentLog(0);
    ++refused;
    text = std::string(done->msg, done->msg_len);
    EXPECT_EQ(done->code, static_cast<int32_t>(Code::kUnavailable));
  }
  EXPECT_EQ(text,
            "rank 0 of job flood has 64 collectives in flight on this agent (limit 64, "
            "--max-names-in-flight): wait "
            "for some to complete before submitting more");
  EXPECT_FALSE(t.nextCompletion(std::chrono::milliseconds(200)))
      << "more than the quota was refused";

  expectHonestJobFinishes(c, "honest");
  expectAgentUpAndStatusWorks(c);
  int rc = -1;
  std::string job = runKolo(c, {"job", "flood"}, &rc);
  EXPECT_EQ(rc, 0) << job;
  EXPECT_NE(job.find("64 collective(s) in flight, the oldest 10 listed (54 left out)"),
            std::string::npos)
      << job;
  // The agent's log says it once per burst, not once per refusal.
  EXPECT_LT(count(c.agentLog(0), "--max-names-in-flight"), 50u) << c.agentLog(0);
}

TEST(HostileClient, IdleConnectionsAreCappedPerUidAndClosedAfterTheHandshakeTimeout) {
  Cluster c(1, {{"KOLO_MAX_CONNECTIONS_PER_UID", "40"}, {"KOLO_HANDSHAKE_TIMEOUT_S", "1"}});
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 60; ++i) {
    idle.push_back(std::make_unique<RawConn>(c.socket()));
    ASSERT_TRUE(idle.back()->ok()) << i;
  }
  // Over the limit: a Refusal naming it, then the connection is closed; the
  // first 40 are closed after the handshake timeout with their own text.
  int over = 0, late = 0;
  for (auto& conn : idle) {
    auto f = conn->recv(std::chrono::seconds(10));
    ASSERT_TRUE(f.isOk()) << f.status().toString() << c.agentLog(0);
    ASSERT_TRUE(f->has_refused()) << f->DebugString();
    const std::string& m = f->refused().message();
    if (m.find("--max-connections-per-uid") != std::string::npos) {
      ++over;
      EXPECT_TRUE(std::regex_search(
          m, std::regex("^uid [0-9]+ has 40 connections open to the kolo agent \\(limit 40, "
                        "--max-connections-per-uid\\); close idle ones$")))
          << m;
    } else {
      ++late;
      EXPECT_EQ(m,
                "no admitted Hello within 1 s of connecting (--handshake-timeout-s): the kolo "
                "agent closes the "
                "connection");
      EXPECT_EQ(f->refused().frame(), "handshake");
    }
    EXPECT_TRUE(conn->closedByAgent(std::chrono::seconds(5)));
  }
  EXPECT_EQ(over, 20);
  EXPECT_EQ(late, 40);
  expectHonestJobFinishes(c, "honest");
  expectAgentUpAndStatusWorks(c);
}

// One job of local size 256 per connection, rank 0 only (its names wait
// for the other 255 for ever), `per_conn` names each, as the user this
// process runs as. Returns "accepted N refused M" and the last refusal.
std::string floodTable(const std::string& socket, int conns, int per_conn) {
  std::vector<std::unique_ptr<RawTrainer>> ts;
  int accepted = 0, refused = 0;
  std::string text;
  uint64_t handle = 1;
  for (int k = 0; k < conns; ++k) {
    ts.push_back(std::make_unique<RawTrainer>(socket));
    RawTrainer& t = *ts.back();
    Status st = t.admit("table" + std::to_string(k), 0, 256);
    if (!st.isOk()) return "admit: " + st.toString();
    for (auto deadline = Clock::now() + std::chrono::seconds(20);;) {  // until the job forms
      if (Clock::now() > deadline) return "the job never formed";
      if (!t.submitAllreduce("probe", ++handle)) return "ring full while probing";
      auto done = t.nextCompletion(std::chrono::milliseconds(500));
      if (!done) break;  // pending: the job formed
      std::string m(done->msg, done->msg_len);
      if (m.find("has not formed yet") == std::string::npos) {  // refused: the quota
        ++refused;
        text = m;
        break;
      }
    }
    ++accepted;
    for (int i = 1; i < per_conn; ++i) {
      auto deadline = Clock::now() + std::chrono::seconds(5);
      while (!t.submitAllreduce("n" + std::to_string(i), ++handle)) {  // the agent drains the ring
        if (Clock::now() > deadline) return "the agent stopped draining the ring";
        if (auto done = t.nextCompletion(std::chrono::milliseconds(1))) {
          ++refused;
          text = std::string(done->msg, done->msg_len);
        }
      }
      ++accepted;
    }
    // What was refused among the last pushes.
    while (auto done = t.nextCompletion(std::chrono::milliseconds(300))) {
      ++refused;
      text = std::string(done->msg, done->msg_len);
    }
  }
  std::string out = "accepted " + std::to_string(accepted - refused) + " refused " +
                    std::to_string(refused) + "\n" + text;
  return out;
}

uint64_t rssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// The tensor table's memory is a quota per user id over all its
// connections and jobs (--max-table-mb-per-uid), measured against the
// agent's RSS: a user of the socket group with four connections, each a
// job of local size 256 (the most a Hello may ask), fills its share and is
// refused naming the knob; the agent grows by no more than the share (plus
// the connections' own arenas' pages); another user's job runs meanwhile.
TEST(HostileClient, NameTableMemoryIsBoundedPerUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the attacker runs as another user";
  Cluster c(1, {{"KOLO_MAX_TABLE_MB_PER_UID", "32"}});
  ASSERT_TRUE(c.ok()) << c.error();
  ASSERT_EQ(::chmod(c.dir().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(c.socket().c_str(), 0666), 0);
  expectHonestJobFinishes(c, "warm");  // the agent's steady state before measuring
  const uint64_t before = rssKiB(c.agent(0).pid);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0) {
      out = "cannot become uid 65534";
    } else {
      out = floodTable(c.socket(), 4, 1200);
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::close(fds[1]);
    // Hold the connections (and their names) until the parent measured.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  const uint64_t after = rssKiB(c.agent(0).pid);
  // 32 MiB at 1 KiB + 64 B x 256 per name: 1927 names of the 4 x 1200 asked.
  EXPECT_EQ(out.substr(0, out.find('\n')), "accepted 1927 refused 2873") << out << c.agentLog(0);
  EXPECT_TRUE(std::regex_search(
      out, std::regex("uid 65534 holds [0-9]+ KiB of the agent's tensor table in "
                      "collectives in flight \\(limit 32 MiB over all its connections, "
                      "--max-table-mb-per-uid\\): wait for some to complete")))
      << out;
  std::printf(
      "agent RSS %llu -> %llu KiB with 1927 names of local size 256 in flight (%.1f KiB per "
      "name)\n",
      static_cast<unsigned long long>(before), static_cast<unsigned long long>(after),
      (static_cast<double>(after) - static_cast<double>(before)) / 1927.0);
  EXPECT_LT(after, before + 32 * 1024 + 4 * 1024) << "the agent grew past its quota";
  expectHonestJobFinishes(c, "honest");  // root's own share is untouched
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  expectAgentUpAndStatusWorks(c);
}

// The agent runs with few descriptors; a connection storm makes accept()
// fail with EMFILE. It must neither spin nor flood its log, refuse what it
// cannot take with a reason, and serve again once the storm is gone.
TEST(HostileClient, ATrainerThatNeverReadsItsCompletionsCostsTheAgentABoundedBacklog) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  RawTrainer t(c.socket());
  ASSERT_TRUE(t.admit("lazy", 0, 2).isOk()) << c.agentLog(0);
  // Descriptors the agent refuses at once (no name): each one queues a
  // completion that this trainer never reads. Push until the submission
  // ring stays full: the agent has stopped taking submissions.
  SubmitDesc bad{};
  uint64_t pushed = 0;
  auto ring = [&] {
    uint64_t one = 1;
    return ::write(t.doorbell.get(), &one, sizeof one) == sizeof one;
  };
  for (auto deadline = Clock::now() + std::chrono::seconds(60);;) {
    ASSERT_LT(Clock::now(), deadline) << pushed << " pushed\n" << c.agentLog(0);
    bad.handle = pushed + 1;
    if (t.submit.tryPush(bad)) {
      ++pushed;
      if (pushed % 256 == 0) {
        ASSERT_TRUE(ring());
      }
      continue;
    }
    ASSERT_TRUE(ring());
    // Full: wait (bounded) for the agent to take more; it must stop for good
    // once the ring of completions (1024) and the backlog (8192) are full.
    bool moved = false;
    for (auto until = Clock::now() + std::chrono::seconds(1); Clock::now() < until;) {
      if (t.submit.tryPush(bad)) {
        moved = true;
        ++pushed;
        break;
      }
      std::this_thread::yield();
    }
    if (!moved) break;
  }
  const uint64_t bound = kCompletionRingCapacity + 8192 + kSubmitRingCapacity;
  EXPECT_EQ(pushed, bound) << c.agentLog(0);
  EXPECT_FALSE(waitProcess(c.agent(0), std::chrono::milliseconds(0))) << "the agent died\n"
                                                                      << c.agentLog(0);
  EXPECT_NE(c.agentLog(0).find("completions unread; taking no more of its submissions"),
            std::string::npos)
      << c.agentLog(0);
  // Once it reads them, the agent goes on: every submission gets its refusal.
  for (uint64_t got = 0; got < pushed; ++got) {
    auto done = t.nextCompletion(std::chrono::seconds(20));
    ASSERT_TRUE(done) << got << " of " << pushed << " completions\n" << c.agentLog(0);
    ASSERT_EQ(done->handle, got + 1);
    ASSERT_EQ(std::string(done->msg, done->msg_len), "malformed descriptor: name length 0");
  }
  expectHonestJobFinishes(c, "honest");
  expectAgentUpAndStatusWorks(c);
}

TEST(HostileClient, OutOfDescriptorsAcceptBacksOffWithBoundedLogs) {
  ClusterOptions o;
  o.agent_env = {{"KOLO_HANDSHAKE_TIMEOUT_S", "30"}};
  o.agent_prefix = {{"/usr/bin/prlimit", "--nofile=64:64", "--"}};
  if (::access("/usr/bin/prlimit", X_OK) != 0)
    GTEST_SKIP() << "prlimit (util-linux) is not installed";
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<std::unique_ptr<RawConn>> storm;
  for (int i = 0; i < 400; ++i) {
    auto conn = std::make_unique<RawConn>(c.socket(), true);
    if (!conn->ok()) break;  // the backlog is full while the agent pauses accepting
    storm.push_back(std::move(conn));
  }
  // Some were refused for want of descriptors, with that reason.
  bool out_of_fds = false;
  for (auto deadline = Clock::now() + std::chrono::seconds(10);
       Clock::now() < deadline && !out_of_fds;) {
    for (auto& conn : storm) {
      auto f = conn->recv(std::chrono::milliseconds(1));
      if (f.isOk() && f->has_refused() &&
          f->refused().message().find("out of file descriptors") != std::string::npos) {
        out_of_fds = true;
        break;
      }
    }
  }
  EXPECT_TRUE(out_of_fds) << c.agentLog(0);
  std::string log = c.agentLog(0);
  EXPECT_NE(log.find("accept failed: Too many open files"), std::string::npos) << log;
  EXPECT_LT(count(log, "accept failed"), 20u) << log;
  EXPECT_FALSE(waitProcess(c.agent(0), std::chrono::milliseconds(0))) << "the agent died\n" << log;
  // An honest job started while the storm holds the descriptors (its ranks
  // wait in the listen queue, or are refused with retry_after_ms and connect
  // again: libkolo waits either way within KOLO_START_TIMEOUT) runs once
  // they are freed; the agent may not have seen every close yet.
  auto ranks = c.launchJob("honest", 2, {checkBin(), "loop", "20"});
  std::this_thread::sleep_for(std::chrono::seconds(1));
  storm.clear();
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << c.agentLog(0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << c.agentLog(0);
    EXPECT_NE(ranks[r].output().find("OK 20 loop allreduces"), std::string::npos)
        << ranks[r].output();
  }
  expectAgentUpAndStatusWorks(c);
}

}  // namespace
}  // namespace kolo::testing
