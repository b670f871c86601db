// The coordinator's Core with an injected clock (no threads, no sleeps):
// the watch-stream limits, and a restarted agent's jobs reconciled at its
// new registration, journaled and pushed to the job's watchers.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "common/event_loop.h"
#include "coordinator/membership/secrets.h"
#include "coordinator/core.h"
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
