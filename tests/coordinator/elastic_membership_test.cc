// Elastic jobs in the membership logic (injected clock, no threads): a lost
// agent seals the next generation while min_size is met, the job waits up
// to its elastic timeout below it, a new agent is admitted up to max_size,
// a member's reset seals the next generation, and the journal keeps it all.
#include <gtest/gtest.h>

#include <map>

#include "coordinator/membership/membership.h"
#include "coordinator/persist/state_codec.h"
#include "tests/coordinator/manual_clock.h"

namespace kolo::coordinator {
namespace {

class ElasticMembershipTest : public ::testing::Test {
 protected:
  ElasticMembershipTest() : m_(MembershipOptions{5000, 1000, 300 * 1000}, &clock_) {}

  void registerAgent(const std::string& id, const std::string& host) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname(host);
    coord::RegisterAgentReply reply;
    ASSERT_TRUE(m_.registerAgent(req, &reply, &changes_).ok());
    secrets_[id] = reply.agent_secret();
  }
  grpc::Status join(const std::string& agent, int local, int world, int min = 2, int max = 6,
                    int64_t timeout_ms = 10000, bool reset = false) {
    coord::JoinJobRequest req;
    req.set_job_id("job");
    req.set_token("secret");
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_local_size(local);
    req.set_world_size(world);
    req.set_min_size(min);
    req.set_max_size(max);
    req.set_elastic_timeout_ms(timeout_ms);
    req.set_reset(reset);
    if (reset) req.set_reason("local rank 0 restarted");
    return m_.joinJob(req, &changes_);
  }
  void beat(std::initializer_list<const char*> agents) {
    for (const char* a : agents) {
      coord::HeartbeatRequest req;
      req.set_agent_id(a);
      req.set_agent_secret(secrets_[a]);
      coord::HeartbeatReply reply;
      ASSERT_TRUE(m_.heartbeat(req, &reply).ok()) << a;
      ASSERT_TRUE(reply.known()) << a;
    }
  }
  Changes takeChanges() { return std::exchange(changes_, Changes{}); }
  // "agent:offset" per slot, in order.
  static std::string layout(const coord::World& w) {
    std::string s;
    for (const auto& slot : w.agents()) {
      if (!s.empty()) s += ",";
      s += slot.agent().agent_id() + ":" + std::to_string(slot.rank_offset()) + "/" +
           std::to_string(slot.cross_rank());
    }
    return s;
  }
  // Three agents a (2 ranks), b (1), c (1): a RUNNING job at generation 1.
  void startThree(int min = 2, int max = 6) {
    registerAgent("a", "host-a");
    registerAgent("b", "host-b");
    registerAgent("c", "host-c");
    ASSERT_TRUE(join("a", 2, 4, min, max).ok());
    ASSERT_TRUE(join("b", 1, 4, min, max).ok());
    ASSERT_TRUE(join("c", 1, 4, min, max).ok());
    Changes c = takeChanges();
    ASSERT_EQ(c.worlds.size(), 1u);
    ASSERT_EQ(c.worlds[0].generation(), 1u);
    ASSERT_EQ(c.worlds[0].min_size(), min);
  }

  ManualClock clock_;
  Membership m_;
  Changes changes_;
  std::map<std::string, std::string> secrets_;  // agent id -> its registration's secret
};

TEST_F(ElasticMembershipTest, LostAgentSealsTheNextGenerationOverTheRest) {
  startThree();
  clock_.advance(5000);
  beat({"a", "c"});
  m_.expireLeases(&changes_);
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  const coord::World& w = c.worlds[0];
  EXPECT_EQ(w.state(), coord::RUNNING);
  EXPECT_EQ(w.generation(), 2u);
  EXPECT_EQ(w.world_size(), 3);
  EXPECT_EQ(layout(w), "a:0/0,c:2/1");
  EXPECT_EQ(w.change(), "agent b (host host-b) lost: no heartbeat for 5000 ms");
  EXPECT_EQ(c.lost_agents, std::vector<std::string>{"b"});
  EXPECT_FALSE(c.touched_jobs.empty());
  EXPECT_EQ(m_.findJob("job")->world_size, 3);

  // The agent that reports its ranks gone (failed leave) is dropped the same way.
  coord::LeaveJobRequest leave;
  leave.set_job_id("job");
  leave.set_token("secret");
  leave.set_agent_id("c");
  leave.set_agent_secret(secrets_["c"]);
  leave.set_failed(true);
  leave.set_reason("every local rank exited");
  ASSERT_TRUE(m_.leaveJob(leave, &changes_).ok());
  c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].generation(), 3u);
  EXPECT_EQ(layout(c.worlds[0]), "a:0/0");
  EXPECT_EQ(c.worlds[0].world_size(), 2);
  EXPECT_EQ(c.worlds[0].change(), "agent c left: every local rank exited");
}

TEST_F(ElasticMembershipTest, BelowMinWaitsForTheTimeoutThenFailsWithTheReason) {
  startThree(/*min=*/3);
  clock_.advance(5000);
  beat({"a", "c"});
  m_.expireLeases(&changes_);
  ASSERT_EQ(takeChanges().worlds.size(), 1u);  // 3 ranks left: generation 2
  clock_.advance(5000);
  beat({"a"});
  m_.expireLeases(&changes_);
  m_.checkElasticTimeouts(&changes_);
  Changes c = takeChanges();
  EXPECT_TRUE(c.worlds.empty()) << "2 ranks < min 3: no generation, no failure yet";
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);
  EXPECT_EQ(m_.findJob("job")->generation, 2u);

  clock_.advance(9999);
  beat({"a"});
  m_.checkElasticTimeouts(&changes_);
  EXPECT_TRUE(takeChanges().worlds.empty()) << "9.999 s < the 10 s timeout";
  clock_.advance(1);
  m_.checkElasticTimeouts(&changes_);
  c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].state(), coord::FAILED);
  EXPECT_EQ(c.worlds[0].reason(), "job job: 2 ranks left, below --min-np 3, for 10 s");
}

TEST_F(ElasticMembershipTest, AnAgentThatJoinsInTimeRescuesTheJob) {
  startThree(/*min=*/4);
  clock_.advance(5000);
  beat({"a", "c"});
  m_.expireLeases(&changes_);
  EXPECT_TRUE(takeChanges().worlds.empty()) << "3 ranks < min 4";
  clock_.advance(4000);
  beat({"a", "c"});
  registerAgent("d", "host-d");
  ASSERT_TRUE(join("d", 1, 1, 4).ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].generation(), 2u);
  EXPECT_EQ(layout(c.worlds[0]), "a:0/0,c:2/1,d:3/2");
  EXPECT_EQ(c.worlds[0].change(), "agent d (host host-d) joined with 1 ranks");
  clock_.advance(20000);
  beat({"a", "c", "d"});
  m_.checkElasticTimeouts(&changes_);
  EXPECT_TRUE(takeChanges().worlds.empty()) << "the wait ended when d joined";
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);
}

TEST_F(ElasticMembershipTest, NewAgentsWaitForTheNextCommitUpToMaxSize) {
  startThree(/*min=*/2, /*max=*/5);
  registerAgent("d", "host-0");  // sorts first: the ranks move
  ASSERT_TRUE(join("d", 1, 4, 2, 5).ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u) << "the agents learn that d waits";
  EXPECT_EQ(c.worlds[0].generation(), 1u);
  ASSERT_EQ(c.worlds[0].waiting_agent_ids_size(), 1);
  EXPECT_EQ(c.worlds[0].waiting_agent_ids(0), "d");
  EXPECT_EQ(layout(c.worlds[0]), "a:0/0,b:2/1,c:3/2");
  // A retried join of the waiting agent changes nothing; e would pass --max-np.
  ASSERT_TRUE(join("d", 1, 4, 2, 5).ok());
  EXPECT_TRUE(takeChanges().worlds.empty());
  registerAgent("e", "host-e");
  grpc::Status st = join("e", 1, 4, 2, 5);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(st.error_message(),
            "job job: agent e with 1 ranks would bring the elastic job to 6 ranks, more than its "
            "--max-np 5");

  // A member reaches a commit: d is admitted as generation 2.
  coord::JoinJobRequest commit;
  commit.set_job_id("job");
  commit.set_token("secret");
  commit.set_agent_id("b");
  commit.set_agent_secret(secrets_["b"]);
  commit.set_local_size(1);
  commit.set_world_size(4);
  commit.set_admit(true);
  ASSERT_TRUE(m_.joinJob(commit, &changes_).ok());
  c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].generation(), 2u);
  EXPECT_EQ(c.worlds[0].world_size(), 5);
  EXPECT_EQ(c.worlds[0].waiting_agent_ids_size(), 0);
  EXPECT_EQ(layout(c.worlds[0]), "d:0/0,a:1/1,b:3/2,c:4/3");
  EXPECT_EQ(c.worlds[0].change(), "agent d (host host-0) joined with 1 ranks (at a commit)");
  // The other agents' reports of the same commit change nothing.
  commit.set_agent_id("c");
  commit.set_agent_secret(secrets_["c"]);
  ASSERT_TRUE(m_.joinJob(commit, &changes_).ok());
  EXPECT_TRUE(takeChanges().worlds.empty());
}

TEST_F(ElasticMembershipTest, AWaitingAgentIsAdmittedWithoutACommitAfterTenSeconds) {
  startThree(/*min=*/2, /*max=*/8);
  registerAgent("d", "host-d");
  ASSERT_TRUE(join("d", 1, 4).ok());
  takeChanges();
  clock_.advance(kAdmitWithoutCommitMs - 1);
  beat({"a", "b", "c", "d"});
  m_.checkElasticTimeouts(&changes_);
  EXPECT_TRUE(takeChanges().worlds.empty());
  clock_.advance(1);
  m_.checkElasticTimeouts(&changes_);
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].generation(), 2u);
  EXPECT_EQ(c.worlds[0].change(), "no commit within 10 s; agent d (host host-d) joined with 1 ranks");

  // A waiting agent that is lost is forgotten; one waiting when a member is
  // lost joins with that generation.
  registerAgent("e", "host-e");
  registerAgent("f", "host-f");
  ASSERT_TRUE(join("e", 1, 4).ok());
  ASSERT_TRUE(join("f", 1, 4).ok());
  takeChanges();
  clock_.advance(5000);
  beat({"a", "b", "c", "f"});
  m_.expireLeases(&changes_);  // d and e are lost
  c = takeChanges();
  ASSERT_FALSE(c.worlds.empty());
  const coord::World& last = c.worlds.back();
  EXPECT_EQ(last.waiting_agent_ids_size(), 0);
  EXPECT_EQ(layout(last), "a:0/0,b:2/1,c:3/2,f:4/3") << "f joined; d and e are gone";
  EXPECT_EQ(m_.findJob("job")->waiting.size(), 0u);
}

TEST_F(ElasticMembershipTest, ResetSealsTheSameMembersAgain) {
  startThree();
  ASSERT_TRUE(join("b", 1, 4, 2, 6, 10000, /*reset=*/true).ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].generation(), 2u);
  EXPECT_EQ(layout(c.worlds[0]), "a:0/0,b:2/1,c:3/2");
  EXPECT_EQ(c.worlds[0].change(), "agent b (host host-b): local rank 0 restarted");

  registerAgent("x", "host-x");
  EXPECT_EQ(join("x", 1, 4, 2, 6, 10000, true).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ElasticMembershipTest, AFormingElasticJobTakesInAnAgentThatExpectsMore) {
  registerAgent("a", "host-a");
  registerAgent("b", "host-b");
  registerAgent("c", "host-c");
  ASSERT_TRUE(join("a", 1, 3, 2, 4).ok());
  // b was added while the job formed: its trainers were told 4 ranks.
  ASSERT_TRUE(join("b", 2, 4, 2, 4).ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].generation(), 1u);
  EXPECT_EQ(c.worlds[0].world_size(), 3);
  EXPECT_EQ(layout(c.worlds[0]), "a:0/0,b:1/1");
  // Past --max-np it is refused.
  ASSERT_TRUE(join("c", 2, 5, 2, 4).error_code() == grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ElasticMembershipTest, FixedSizeJobsStillFailAndBadBoundsAreRefused) {
  registerAgent("a", "host-a");
  EXPECT_EQ(join("a", 1, 2, /*min=*/3).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(join("a", 1, 4, 2, /*max=*/3).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(m_.findJob("job"), nullptr);
}

TEST_F(ElasticMembershipTest, TheJournalKeepsTheElasticStateAndTheWait) {
  startThree(/*min=*/4);
  clock_.advance(5000);
  beat({"a", "c"});
  m_.expireLeases(&changes_);
  takeChanges();
  const Job& job = *m_.findJob("job");
  ASSERT_GE(job.below_min_wall_ms, 0);

  persist::PersistedState got;
  auto decoded = persist::decodeRecord(persist::encodeRecord(persist::Record::jobState(job)));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().message();
  ASSERT_TRUE(persist::applyRecord(*decoded, &got).isOk());
  const Job& back = got.jobs.at("job");
  EXPECT_EQ(back.min_size, 4);
  EXPECT_EQ(back.max_size, 6);
  EXPECT_EQ(back.elastic_timeout_ms, 10000);
  EXPECT_EQ(back.below_min_wall_ms, job.below_min_wall_ms);
  EXPECT_EQ(back.members.size(), 2u);

  // A restarted coordinator keeps counting the wait from when it began.
  ManualClock clock2;  // its wall clock is 4 s after the wait began
  clock2.advance(clock_.wallMs() + 4000 - clock2.wallMs());
  Membership m2(MembershipOptions{5000, 1000, 300 * 1000}, &clock2);
  m2.restoreJob(back);
  Changes c;
  clock2.advance(5999);
  m2.checkElasticTimeouts(&c);
  EXPECT_TRUE(c.worlds.empty());
  clock2.advance(1);
  m2.checkElasticTimeouts(&c);
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].reason(), "job job: 3 ranks left, below --min-np 4, for 10 s");
}

}  // namespace
}  // namespace kolo::coordinator
