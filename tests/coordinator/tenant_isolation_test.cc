// The coordinator's Core with an injected clock (no threads, no sleeps):
// the watch-stream limits, and a restarted agent's jobs reconciled at its
// new registration, journaled and pushed to the job's watchers.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "common/event_loop.h"
#include "coordinator/core.h"
#include "coordinator/membership/secrets.h"
#include "coordinator/persist/record_sink.h"
#include "tests/coordinator/manual_clock.h"

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;

class TenantIsolationTest : public ::testing::Test {
 protected:
  TenantIsolationTest()
      : loop_("test-loop"),
        core_(&loop_, MembershipOptions{5000, 1000, 60 * 1000}, &clock_, &sink_,
              WatchLimits{/*total=*/5, /*per_job=*/3}) {
    Quotas q;
    q.reserved_watch_streams = 0;  // these streams are not an agent's: no reserve (issue 47)
    core_.setQuotas(q);
  }

  // Registers `id` as a new process (no previous secret) or as the same one.
  void registerAgent(const std::string& id, bool same_process = true) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname("host-" + id);
    if (same_process) req.set_previous_secret(secrets_[id]);
    coord::RegisterAgentReply reply;
    // A new process under a live id needs the operator (issue 47).
    ASSERT_TRUE(core_.registerAgentOnLoop(req, &reply, /*by_operator=*/!same_process).ok());
    secrets_[id] = reply.agent_secret();
  }
  grpc::Status join(const std::string& job, const std::string& agent, int world) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token("tok-" + job);
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_local_size(1);
    req.set_world_size(world);
    return core_.joinJobOnLoop(req);
  }
  grpc::Status watch(const std::string& job, std::shared_ptr<WatchQueue>* out = nullptr) {
    coord::WatchJobRequest req;
    req.set_job_id(job);
    req.set_token("tok-" + job);
    auto queue = std::make_shared<WatchQueue>();
    grpc::Status st = core_.watchOnLoop(req, queue);
    if (st.ok()) queues_.push_back(queue);
    if (out != nullptr) *out = queue;
    return st;
  }

  ManualClock clock_;
  persist::MemorySink sink_;
  EventLoop loop_;  // never started: the test is the loop thread
  Core core_;
  std::map<std::string, std::string> secrets_;
  std::vector<std::shared_ptr<WatchQueue>> queues_;
};

TEST_F(TenantIsolationTest, WatchStreamsAreBoundedPerJobAndInTotal) {
  registerAgent("a");
  ASSERT_TRUE(join("j1", "a", 2).ok());
  ASSERT_TRUE(join("j2", "a", 2).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(watch("j1").ok()) << i;
  grpc::Status st = watch("j1");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "WatchJob of job j1 refused: the job already has 3 watch streams "
            "(--max-watch-streams-per-job 3)");
  ASSERT_TRUE(watch("j2").ok());
  ASSERT_TRUE(watch("j2").ok());
  st = watch("j2");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "WatchJob of job j2 refused: the coordinator already serves 5 watch streams "
            "(--max-watch-streams 5)");
  // A wrong token is still refused as such, not counted.
  coord::WatchJobRequest bad;
  bad.set_job_id("j2");
  bad.set_token("guess");
  EXPECT_EQ(core_.watchOnLoop(bad, std::make_shared<WatchQueue>()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A stream that ends frees its place.
  core_.unwatchOnLoop("j1", queues_[0].get());
  EXPECT_TRUE(watch("j2").ok());
}

TEST_F(TenantIsolationTest, ARestartedAgentsJobFailsAtOnceJournaledAndPushed) {
  registerAgent("a");
  registerAgent("b");
  ASSERT_TRUE(join("run", "a", 2).ok());
  ASSERT_TRUE(join("run", "b", 2).ok());
  std::shared_ptr<WatchQueue> q;
  ASSERT_TRUE(watch("run", &q).ok());
  coord::World w;
  ASSERT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kWorld);
  EXPECT_EQ(w.state(), coord::RUNNING);

  clock_.advance(10);  // far less than the 5000 ms lease
  registerAgent("b", /*same_process=*/false);
  ASSERT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kWorld);
  EXPECT_EQ(w.state(), coord::FAILED);
  EXPECT_EQ(w.reason(),
            "agent b (host host-b) restarted: it registered again as a new incarnation");
  EXPECT_TRUE(sink_.errors().empty()) << sink_.errors();
  EXPECT_TRUE(sink_.state() == core_.persistedStateOnLoop());
  EXPECT_EQ(sink_.state().jobs.at("run").state, coord::FAILED);
  // Journaled as its hash only (issue 47).
  EXPECT_EQ(sink_.state().agent_secrets.at("b"), hashSecret(secrets_["b"]));
}

}  // namespace
}  // namespace kolo::coordinator

namespace kolo::coordinator {
namespace {

// Issue 47: non-member streams are bounded per peer address (port aside),
// members' streams are not counted there, and an ended stream frees its
// place in every count.
TEST(WatchQuotaTest, PerPeerBoundCountsNonMembersOnlyAndEndedStreamsFreeTheirPlace) {
  ManualClock clock;
  EventLoop loop("unused");
  Core core(&loop, MembershipOptions{5000, 1000, 60 * 1000}, &clock, nullptr,
            WatchLimits{/*total=*/100, /*per_job=*/100});
  Quotas q;
  q.reserved_watch_streams = 10;
  q.watch_streams_per_peer = 3;
  q.watch_streams_per_token = 50;
  core.setQuotas(q);
  coord::RegisterAgentRequest reg;
  reg.mutable_agent()->set_agent_id("a");
  coord::RegisterAgentReply reply;
  ASSERT_TRUE(core.registerAgentOnLoop(reg, &reply).ok());
  coord::JoinJobRequest join;
  join.set_job_id("j");
  join.set_token("t");
  join.set_agent_id("a");
  join.set_agent_secret(reply.agent_secret());
  join.set_local_size(1);
  join.set_world_size(2);
  ASSERT_TRUE(core.joinJobOnLoop(join).ok());
  std::vector<std::shared_ptr<WatchQueue>> open;
  auto watch = [&](const std::string& peer, bool member) {
    coord::WatchJobRequest req;
    req.set_job_id("j");
    req.set_token("t");
    req.set_agent_id("a");
    if (member) req.set_agent_secret(reply.agent_secret());
    auto queue = std::make_shared<WatchQueue>();
    grpc::Status st = core.watchOnLoop(req, queue, peer);
    if (st.ok()) open.push_back(queue);
    return st;
  };
  for (int port = 1; port <= 3; ++port) {
    ASSERT_TRUE(watch("ipv4:10.0.0.7:" + std::to_string(port), false).ok());
  }
  grpc::Status st = watch("ipv4:10.0.0.7:4", false);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "WatchJob of job j refused: peer ipv4:10.0.0.7 already has 3 watch streams (not as a "
            "job's agent) (--max-watch-streams-per-peer 3)");
  EXPECT_TRUE(watch("ipv4:10.0.0.8:1", false).ok()) << "another peer";
  EXPECT_TRUE(watch("ipv4:10.0.0.7:5", true).ok()) << "the job's own agent, from the same peer";
  EXPECT_EQ(core.watchAccounting().others(), 4u);
  core.unwatchOnLoop("j", open[0].get());
  core.unwatchOnLoop("j", open[0].get());  // a second end counts once
  EXPECT_EQ(core.watchAccounting().others(), 3u);
  EXPECT_TRUE(watch("ipv4:10.0.0.7:6", false).ok()) << "the ended stream's place is free";
}

}  // namespace
}  // namespace kolo::coordinator
