// A trainer that rewrites the shared memory it shares with kolo-agent while
// its ops are in flight (docs/security.md, "Shared memory the trainer can
// write"), through the real kolo-coordinator and kolo-agent. The hostile
// trainers are written here, on the raw protocol (a Hello frame, the arena
// memfd, the rings and eventfds), so that they can write what libkolo never
// would; an honest job runs on the same agent at the same time, with one of
// its ops in flight across the attack. Each test shows that the attacker
// gets a clear refusal (or only its own job fails), that the honest job's
// results are correct, and that the agent is still up.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/fd.h"
#include "common/frame.h"
#include "common/ipc_layout.h"
#include "common/shm.h"
#include "harness.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWait = std::chrono::seconds(30);
constexpr uint64_t kArenaBytes = 16ull << 20;  // the agent's minimum
constexpr int64_t kCols = 4;                   // float32 rows of 4
constexpr uint64_t kRow = kCols * sizeof(float);

// One trainer process's side of the protocol, without libkolo.
class RawRank {
 public:
  // Connects, says Hello and maps the arena from the Welcome. Empty on
  // failure (*err says why).
  static std::unique_ptr<RawRank> join(const std::string& socket, const std::string& job,
                                       int local_rank, int local_size, std::string* err) {
    auto r = std::unique_ptr<RawRank>(new RawRank());
    r->sock_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, socket.c_str(), sizeof(a.sun_path) - 1);
    if (::connect(r->sock_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      *err = "connect " + socket + ": " + std::strerror(errno);
      return nullptr;
    }
    ::fcntl(r->sock_.get(), F_SETFL, ::fcntl(r->sock_.get(), F_GETFL) | O_NONBLOCK);
    ipc::ClientFrame f;
    ipc::Hello* h = f.mutable_hello();
    h->set_protocol_version(kIpcProtocolVersion);
    h->set_job_id(job);
    h->set_token("secret-" + job);
    h->set_local_rank(local_rank);
    h->set_local_size(local_size);
    h->set_world_size(local_size);
    h->set_pid(::getpid());
    h->set_arena_bytes(kArenaBytes);
    Status st = sendFrame(r->sock_.get(), f);
    ipc::AgentFrame reply;
    if (st.isOk()) st = r->recv(&reply, Clock::now() + kWait);
    if (!st.isOk() || !reply.has_welcome() || reply.welcome().code() != 0 || r->fds_.size() < 3) {
      *err = "no Welcome: " + (st.isOk() ? reply.welcome().message() : st.message());
      return nullptr;
    }
    auto region = SharedRegion::attach(std::move(r->fds_[0]), reply.welcome().arena_bytes());
    if (!region.isOk()) {
      *err = region.status().message();
      return nullptr;
    }
    r->arena_ = std::make_unique<SharedRegion>(std::move(region).value());
    r->doorbell_ = std::move(r->fds_[1]);
    r->completion_ = std::move(r->fds_[2]);
    r->fds_.clear();
    r->hdr_ = reinterpret_cast<ArenaHeader*>(r->arena_->data());
    r->submit_ = SubmitRing(r->arena_->data() + r->hdr_->submit_ring_offset);
    r->done_ = CompletionRing(r->arena_->data() + r->hdr_->completion_ring_offset);
    r->next_ = r->hdr_->data_offset;
    return r;
  }

  // Waits for the job's WorldInfo.
  Status waitWorld() {
    auto deadline = Clock::now() + kWait;
    for (;;) {
      ipc::AgentFrame f;
      RETURN_IF_ERROR(recv(&f, deadline));
      if (f.has_world()) {
        generation_ = f.world().generation();
        return okStatus();
      }
      if (f.has_job_failed()) return internalError("job failed: " + f.job_failed().message());
    }
  }

  // The JobFailed message the agent sends, reading up to EOF; "" if none
  // came before the socket closed or the deadline.
  std::string waitJobFailed() {
    auto deadline = Clock::now() + kWait;
    for (;;) {
      ipc::AgentFrame f;
      if (!recv(&f, deadline).isOk()) return "";
      if (f.has_job_failed()) return f.job_failed().message();
    }
  }
  // True once the agent closed the socket (bounded).
  bool waitClosed() {
    auto deadline = Clock::now() + kWait;
    for (;;) {
      ipc::AgentFrame f;
      Status st = recv(&f, deadline);
      if (st.code() == Code::kUnavailable) return true;
      if (st.code() == Code::kTimedOut) return false;
    }
  }

  // Room for `bytes` in the data region (bump allocation, 64-byte aligned).
  uint64_t alloc(uint64_t bytes) {
    uint64_t off = next_;
    next_ += (bytes + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
    return off;
  }
  uint64_t dataEnd() const { return hdr_->data_offset + hdr_->data_bytes; }
  char* at(uint64_t off) const { return arena_->data() + off; }
  float* floats(uint64_t off) const { return reinterpret_cast<float*>(at(off)); }
  int64_t* ints(uint64_t off) const { return reinterpret_cast<int64_t*>(at(off)); }
  RingHeader* submitHeader() const {
    return reinterpret_cast<RingHeader*>(at(hdr_->submit_ring_offset));
  }
  RingHeader* completionHeader() const {
    return reinterpret_cast<RingHeader*>(at(hdr_->completion_ring_offset));
  }

  // A float32 [rows, kCols] op on `in`, its output region [out, +out_bytes).
  SubmitDesc desc(CollectiveType coll, const std::string& name, int64_t rows, uint64_t in,
                  uint64_t out, uint64_t out_bytes) {
    SubmitDesc d{};
    d.handle = ++handles_;
    d.collective = static_cast<uint8_t>(coll);
    d.dtype = static_cast<uint8_t>(DataType::kFloat32);
    d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    d.ndim = 2;
    d.shape[0] = rows;
    d.shape[1] = kCols;
    d.prescale = d.postscale = 1.0;
    d.name_len = static_cast<uint32_t>(name.size());
    std::memcpy(d.name, name.data(), name.size());
    d.data_offset = in;
    d.data_bytes = static_cast<uint64_t>(rows) * kRow;
    d.out_offset = out;
    d.out_bytes = out_bytes;
    d.generation = generation_;
    return d;
  }
  // Submits a descriptor the agent refuses at once, and waits for that:
  // the agent takes a trainer's submissions in order, so everything
  // submitted before has been read and checked by then (no sleeping).
  bool fence() {
    SubmitDesc d{};
    d.handle = ++handles_;  // name_len 0: malformed
    if (!submit(d)) return false;
    auto c = waitCompletion(d.handle);
    return c.has_value() && c->code == static_cast<int>(Code::kInvalidArgument);
  }
  bool submit(const SubmitDesc& d) {
    if (!submit_.tryPush(d)) return false;
    ringDoorbell();
    return true;
  }
  void ringDoorbell() const {
    uint64_t one = 1;
    (void)!::write(doorbell_.get(), &one, sizeof one);
  }
  // The completion of `handle` (bounded wait on the completion eventfd,
  // which the agent writes only while client_waiting says we sleep:
  // common/ipc_layout.h).
  std::optional<CompletionDesc> waitCompletion(uint64_t handle) {
    auto deadline = Clock::now() + kWait;
    for (;;) {
      CompletionDesc c;
      while (done_.tryPop(&c)) got_[c.handle] = c;
      if (auto it = got_.find(handle); it != got_.end()) return it->second;
      auto now = Clock::now();
      if (now >= deadline) return std::nullopt;
      hdr_->client_waiting.store(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (!done_.empty()) {
        hdr_->client_waiting.store(0, std::memory_order_relaxed);
        continue;
      }
      pollfd p{completion_.get(), POLLIN, 0};
      (void)::poll(
          &p, 1,
          static_cast<int>(
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) +
              1);
      hdr_->client_waiting.store(0, std::memory_order_relaxed);
      uint64_t v;
      (void)!::read(completion_.get(), &v, sizeof v);
    }
  }

 private:
  RawRank() = default;
  Status recv(ipc::AgentFrame* f, Clock::time_point deadline) {
    std::string payload;
    RETURN_IF_ERROR(recvFrame(sock_.get(), deadline, &decoder_, &fds_, &payload));
    if (!f->ParseFromString(payload)) return internalError("undecodable frame from the agent");
    return okStatus();
  }

  UniqueFd sock_, doorbell_, completion_;
  FrameDecoder decoder_;
  std::deque<UniqueFd> fds_;
  std::unique_ptr<SharedRegion> arena_;
  ArenaHeader* hdr_ = nullptr;
  SubmitRing submit_;
  CompletionRing done_;
  uint64_t next_ = 0;
  uint64_t handles_ = 0;
  uint64_t generation_ = 0;
  std::map<uint64_t, CompletionDesc> got_;
};

std::string completionText(const std::optional<CompletionDesc>& c) {
  if (!c) return "(no completion)";
  return std::string(codeName(static_cast<Code>(c->code))) + ": " + std::string(c->msg, c->msg_len);
}

// Both ranks of a 2-rank job on agent 0, admitted and told their World.
std::vector<std::unique_ptr<RawRank>> joinJob(Cluster& c, const std::string& job) {
  std::vector<std::unique_ptr<RawRank>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::string err;
    ranks.push_back(RawRank::join(c.socket(), job, r, 2, &err));
    EXPECT_NE(ranks.back(), nullptr) << "job " << job << " rank " << r << ": " << err;
    if (ranks.back() == nullptr) return {};
  }
  for (auto& r : ranks) {
    Status st = r->waitWorld();
    EXPECT_TRUE(st.isOk()) << job << ": " << st.message() << "\n" << c.agentLog(0);
    if (!st.isOk()) return {};
  }
  return ranks;
}

// The honest job: an alltoall of 2 ranks in flight across the attack.
// Rank s's row i holds 100 * s + i in every column; splits {1, 2}, {3, 1}.
class HonestAlltoall {
 public:
  explicit HonestAlltoall(std::vector<std::unique_ptr<RawRank>> ranks) : r_(std::move(ranks)) {
    const int64_t splits[2][2] = {{1, 2}, {3, 1}};
    const uint64_t prefix = alltoallSplitsBytes(2);
    for (int s = 0; s < 2; ++s) {
      const int64_t rows = splits[s][0] + splits[s][1];
      const int64_t recv_rows = splits[0][s] + splits[1][s];
      in_[s] = r_[s]->alloc(rows * kRow);
      out_[s] = r_[s]->alloc(prefix + recv_rows * kRow);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < kCols; ++j)
          r_[s]->floats(in_[s])[i * kCols + j] = static_cast<float>(100 * s + i);
      }
      std::memcpy(r_[s]->ints(out_[s]), splits, sizeof splits);
      d_[s] = r_[s]->desc(CollectiveType::kAlltoall, "honest", rows, in_[s], out_[s],
                          prefix + recv_rows * kRow);
    }
  }
  bool submit(int rank) { return r_[rank]->submit(d_[rank]); }
  // Every rank's completion is OK and its output is what it must receive.
  void expectCorrect() {
    // Rank 0 receives rank 0's row 0, then rank 1's rows 0-2; rank 1
    // receives rank 0's rows 1-2, then rank 1's row 3.
    const std::vector<std::vector<float>> want = {{0, 100, 101, 102}, {1, 2, 103}};
    for (int s = 0; s < 2; ++s) {
      auto c = r_[s]->waitCompletion(d_[s].handle);
      ASSERT_TRUE(c && c->code == 0) << "honest rank " << s << ": " << completionText(c);
      const float* got = r_[s]->floats(out_[s] + alltoallSplitsBytes(2));
      for (size_t i = 0; i < want[s].size(); ++i) {
        for (int64_t j = 0; j < kCols; ++j)
          ASSERT_EQ(got[i * kCols + j], want[s][i]) << "rank " << s << " row " << i;
      }
    }
  }

 private:
  std::vector<std::unique_ptr<RawRank>> r_;
  uint64_t in_[2] = {}, out_[2] = {};
  SubmitDesc d_[2] = {};
};

void expectAgentUp(Cluster& c) {
  EXPECT_FALSE(waitProcess(c.agent(0), std::chrono::milliseconds(0))) << "the agent exited:\n"
                                                                      << c.agentLog(0);
}

TEST(ShmAttack, AlltoallSplitMatrixRewrittenAfterSubmitIsNotUsed) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto honest_ranks = joinJob(c, "honest");
  auto evil = joinJob(c, "evil");
  ASSERT_EQ(honest_ranks.size(), 2u);
  ASSERT_EQ(evil.size(), 2u);
  HonestAlltoall honest(std::move(honest_ranks));
  ASSERT_TRUE(honest.submit(0));  // in flight until rank 1 submits, after the attack

  // Each evil rank sends one row to each: a valid matrix {{1, 1}, {1, 1}}.
  const uint64_t prefix = alltoallSplitsBytes(2);
  SubmitDesc d[2];
  for (int s = 0; s < 2; ++s) {
    uint64_t in = evil[s]->alloc(2 * kRow), out = evil[s]->alloc(prefix + 2 * kRow);
    const int64_t valid[4] = {1, 1, 1, 1};
    std::memcpy(evil[s]->ints(out), valid, sizeof valid);
    d[s] = evil[s]->desc(CollectiveType::kAlltoall, "x", 2, in, out, prefix + 2 * kRow);
  }
  ASSERT_TRUE(evil[0]->submit(d[0]));
  ASSERT_TRUE(evil[0]->fence());
  // Once rank 0's matrix was checked, both ranks switch to one in which rank
  // 0 sends 2^40 rows to itself: rank 1's own row and column still add up,
  // so its check passes; executing it would copy 16 TiB.
  const int64_t hostile[4] = {int64_t{1} << 40, 1, 1, 1};
  std::memcpy(evil[0]->ints(d[0].out_offset), hostile, sizeof hostile);
  std::memcpy(evil[1]->ints(d[1].out_offset), hostile, sizeof hostile);
  ASSERT_TRUE(evil[1]->submit(d[1]));
  for (int s = 0; s < 2; ++s) {
    auto done = evil[s]->waitCompletion(d[s].handle);
    ASSERT_TRUE(done.has_value()) << "evil rank " << s << " got no completion\n" << c.agentLog(0);
    EXPECT_EQ(done->code, static_cast<int>(Code::kInvalidArgument)) << completionText(done);
    EXPECT_EQ(std::string(done->msg, done->msg_len),
              "alltoall of tensor 'x': ranks 0 and 1 hold different split matrices");
  }
  ASSERT_TRUE(honest.submit(1));
  honest.expectCorrect();
  expectAgentUp(c);
}

// A streamed copy-in (kSubmitFlagStreamed) is for jobs across agents: in a
// job on one agent the agent refuses it with its text, whatever the count
// of bytes copied says, and the job goes on.
TEST(ShmAttack, AStreamedAllreduceInAJobOnOneAgentIsRefused) {
  Cluster c(1, {{"KOLO_CROSS_PIPELINE_KB", "64"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto evil = joinJob(c, "evil");
  ASSERT_EQ(evil.size(), 2u);
  const int64_t rows = (64 << 10) / kRow;
  SubmitDesc d[2];
  for (int s = 0; s < 2; ++s) {
    const uint64_t count = evil[s]->alloc(kStreamedHeaderBytes);
    const uint64_t in = evil[s]->alloc(rows * kRow);
    ASSERT_EQ(count + kStreamedHeaderBytes, in);
    *reinterpret_cast<uint64_t*>(evil[s]->at(count)) = 1;  // "1 byte copied", never more
    d[s] = evil[s]->desc(CollectiveType::kAllreduce, "x", rows, in, 0, 0);
    d[s].flags = kSubmitFlagStreamed;
  }
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(evil[s]->submit(d[s]));
  for (int s = 0; s < 2; ++s) {
    auto done = evil[s]->waitCompletion(d[s].handle);
    ASSERT_TRUE(done.has_value()) << "rank " << s << " got no completion\n" << c.agentLog(0);
    EXPECT_EQ(done->code, static_cast<int>(Code::kInvalidArgument)) << completionText(done);
    EXPECT_EQ(std::string(done->msg, done->msg_len),
              "allreduce of tensor 'x' was streamed into the arena in a job on one agent");
  }
  // The same allreduce without the flag: exact.
  for (int s = 0; s < 2; ++s) {
    d[s] = evil[s]->desc(CollectiveType::kAllreduce, "y", rows, d[s].data_offset, 0, 0);
    for (int64_t i = 0; i < rows * kCols; ++i)
      evil[s]->floats(d[s].data_offset)[i] = static_cast<float>(s + 1);
    ASSERT_TRUE(evil[s]->submit(d[s]));
  }
  for (int s = 0; s < 2; ++s) {
    auto done = evil[s]->waitCompletion(d[s].handle);
    ASSERT_TRUE(done && done->code == 0) << completionText(done);
    EXPECT_EQ(evil[s]->floats(d[s].data_offset)[rows * kCols - 1], 3.0f);
  }
  expectAgentUp(c);
}

TEST(ShmAttack, AllgatherSizesRewrittenAfterSubmitAreNotUsed) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto honest_ranks = joinJob(c, "honest");
  auto evil = joinJob(c, "evil");
  ASSERT_EQ(honest_ranks.size(), 2u);
  ASSERT_EQ(evil.size(), 2u);
  HonestAlltoall honest(std::move(honest_ranks));
  ASSERT_TRUE(honest.submit(1));

  // Two rows each; rank 0's output region ends where its arena ends.
  const uint64_t prefix = allgatherSizesBytes(2);
  const int64_t valid[2] = {2, 2};
  uint64_t in0 = evil[0]->alloc(2 * kRow);
  uint64_t out0 = evil[0]->dataEnd() - (prefix + 4 * kRow);
  std::memcpy(evil[0]->ints(out0), valid, sizeof valid);
  SubmitDesc d0 = evil[0]->desc(CollectiveType::kAllgather, "g", 2, in0, out0, prefix + 4 * kRow);
  ASSERT_TRUE(evil[0]->submit(d0));
  ASSERT_TRUE(evil[0]->fence());
  // Checked; now rank 0 lists itself with 1000 rows, and rank 1 (whose own
  // entry and output region agree with that list) submits the same list:
  // executing it would copy 1000 rows into rank 0's 4-row output, past the
  // end of its arena.
  const int64_t hostile[2] = {1000, 2};
  std::memcpy(evil[0]->ints(out0), hostile, sizeof hostile);
  uint64_t in1 = evil[1]->alloc(2 * kRow), out1 = evil[1]->alloc(prefix + 1002 * kRow);
  std::memcpy(evil[1]->ints(out1), hostile, sizeof hostile);
  SubmitDesc d1 =
      evil[1]->desc(CollectiveType::kAllgather, "g", 2, in1, out1, prefix + 1002 * kRow);
  ASSERT_TRUE(evil[1]->submit(d1));
  for (int s = 0; s < 2; ++s) {
    auto done = evil[s]->waitCompletion(s == 0 ? d0.handle : d1.handle);
    ASSERT_TRUE(done.has_value()) << "evil rank " << s << " got no completion\n" << c.agentLog(0);
    EXPECT_EQ(done->code, static_cast<int>(Code::kInvalidArgument)) << completionText(done);
    EXPECT_EQ(std::string(done->msg, done->msg_len),
              "allgather of tensor 'g': ranks 0 and 1 list different first dimensions for the "
              "other ranks");
  }
  ASSERT_TRUE(honest.submit(0));
  honest.expectCorrect();
  expectAgentUp(c);
}

TEST(ShmAttack, RewrittenRingCapacityIsIgnoredAndABrokenSubmissionRingFailsOnlyItsJob) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto honest_ranks = joinJob(c, "honest");
  auto evil = joinJob(c, "evil");
  ASSERT_EQ(honest_ranks.size(), 2u);
  ASSERT_EQ(evil.size(), 2u);
  HonestAlltoall honest(std::move(honest_ranks));
  ASSERT_TRUE(honest.submit(0));

  // Capacities rewritten (the agent would index and bound with them): the
  // agent keeps its own, and an allreduce still comes out right.
  evil[0]->submitHeader()->capacity = uint64_t{1} << 40;
  evil[0]->completionHeader()->capacity = 3;
  SubmitDesc d[2];
  for (int s = 0; s < 2; ++s) {
    uint64_t in = evil[s]->alloc(kRow);
    for (int j = 0; j < kCols; ++j) evil[s]->floats(in)[j] = static_cast<float>(s + 1);
    d[s] = evil[s]->desc(CollectiveType::kAllreduce, "sum", 1, in, 0, 0);
    ASSERT_TRUE(evil[s]->submit(d[s]));
  }
  for (int s = 0; s < 2; ++s) {
    auto done = evil[s]->waitCompletion(d[s].handle);
    ASSERT_TRUE(done && done->code == 0) << completionText(done) << "\n" << c.agentLog(0);
    EXPECT_EQ(evil[s]->floats(d[s].data_offset)[0], 3.0f);
  }

  // The producer's tail moved 5000 entries past the agent's head: refused,
  // the connection closed, the job failed; the other jobs go on.
  RingHeader* sr = evil[0]->submitHeader();
  sr->tail.store(sr->head.load() + 5000);
  evil[0]->ringDoorbell();
  const std::string mine = evil[0]->waitJobFailed();
  EXPECT_EQ(mine,
            "the kolo agent closed this connection: this process broke its submission ring (the "
            "producer moved the "
            "tail: tail 5001, head 1: 5000 entries in a ring of 1024) in the shared arena")
      << c.agentLog(0);
  EXPECT_TRUE(evil[0]->waitClosed());
  const std::string other = evil[1]->waitJobFailed();
  EXPECT_NE(other.find("broke its submission ring (the producer moved the tail: tail 5001, head 1: "
                       "5000 entries in "
                       "a ring of 1024); the agent closed its connection"),
            std::string::npos)
      << other;
  ASSERT_TRUE(honest.submit(1));
  honest.expectCorrect();
  expectAgentUp(c);
  EXPECT_NE(c.agentLog(0).find("it broke its submission ring"), std::string::npos) << c.agentLog(0);
}

TEST(ShmAttack, AHeadMovedPastTheCompletionTailFailsOnlyItsJob) {
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  auto honest_ranks = joinJob(c, "honest");
  auto evil = joinJob(c, "evil");
  ASSERT_EQ(honest_ranks.size(), 2u);
  ASSERT_EQ(evil.size(), 2u);
  HonestAlltoall honest(std::move(honest_ranks));
  ASSERT_TRUE(honest.submit(0));

  // The consumer claims to have read 7 completions the agent never wrote:
  // the agent's next completion to it finds the head past its tail.
  evil[0]->completionHeader()->head.store(7);
  SubmitDesc d[2];
  for (int s = 0; s < 2; ++s) {
    uint64_t in = evil[s]->alloc(kRow);
    d[s] = evil[s]->desc(CollectiveType::kAllreduce, "sum", 1, in, 0, 0);
    ASSERT_TRUE(evil[s]->submit(d[s]));
  }
  EXPECT_EQ(evil[0]->waitJobFailed(),
            "the kolo agent closed this connection: this process broke its completion ring (the "
            "consumer moved the "
            "head: tail 0, head 7: -7 entries in a ring of 1024) in the shared arena")
      << c.agentLog(0);
  EXPECT_TRUE(evil[0]->waitClosed());
  EXPECT_NE(evil[1]->waitJobFailed().find("broke its completion ring"), std::string::npos)
      << c.agentLog(0);
  ASSERT_TRUE(honest.submit(1));
  honest.expectCorrect();
  expectAgentUp(c);
}

}  // namespace
}  // namespace kolo::testing
