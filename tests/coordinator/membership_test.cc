// Membership logic with an injected clock: no threads, no sleeps.
#include "coordinator/membership/membership.h"

#include <gtest/gtest.h>

#include <map>

#include "coordinator/membership/secrets.h"
#include "tests/coordinator/manual_clock.h"

namespace kolo::coordinator {
namespace {

class MembershipTest : public ::testing::Test {
 protected:
  MembershipTest() : m_(MembershipOptions{5000, 1000, 300 * 1000}, &clock_) {}

  void registerAgent(const std::string& id, const std::string& host, bool by_operator = false) {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(id);
    req.mutable_agent()->set_hostname(host);
    req.mutable_agent()->set_rpc_address(host + ":7471");
    req.set_previous_secret(secrets_[id]);
    coord::RegisterAgentReply reply;
    ASSERT_TRUE(m_.registerAgent(req, &reply, &changes_, by_operator).ok());
    EXPECT_EQ(reply.lease_ms(), 5000u);
    EXPECT_EQ(reply.heartbeat_interval_ms(), 1000u);
    EXPECT_EQ(reply.stream_heartbeat_interval_ms(), 1666u);  // lease / 3
    EXPECT_EQ(reply.agent_secret().size(), 32u);
    secrets_[id] = reply.agent_secret();
  }
  grpc::Status join(const std::string& job, const std::string& agent, int local, int world,
                    const std::string& token = "secret") {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_local_size(local);
    req.set_world_size(world);
    return m_.joinJob(req, &changes_);
  }
  grpc::Status leave(const std::string& job, const std::string& agent, bool failed = false,
                     const std::string& reason = "", const std::string& token = "secret") {
    coord::LeaveJobRequest req;
    req.set_job_id(job);
    req.set_token(token);
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    req.set_failed(failed);
    req.set_reason(reason);
    return m_.leaveJob(req, &changes_);
  }
  bool heartbeat(const std::string& agent) {
    coord::HeartbeatRequest req;
    req.set_agent_id(agent);
    req.set_agent_secret(secrets_[agent]);
    coord::HeartbeatReply reply;
    EXPECT_TRUE(m_.heartbeat(req, &reply).ok());
    return reply.known();
  }
  Changes takeChanges() { return std::exchange(changes_, Changes{}); }

  ManualClock clock_;
  Membership m_;
  Changes changes_;
  std::map<std::string, std::string> secrets_;  // agent id -> its registration's secret
};

TEST_F(MembershipTest, SealsWithDeterministicOrderAndOffsets) {
  registerAgent("a1", "node-b");
  registerAgent("a2", "node-a");
  registerAgent("a3", "node-a");
  ASSERT_TRUE(join("job", "a1", 2, 6).ok());
  ASSERT_TRUE(join("job", "a3", 3, 6).ok());
  EXPECT_TRUE(takeChanges().empty()) << "no World before the job is complete";
  EXPECT_EQ(m_.findJob("job")->state, coord::FORMING);
  EXPECT_EQ(m_.findJob("job")->joinedRanks(), 5);
  ASSERT_TRUE(join("job", "a2", 1, 6).ok());

  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  const coord::World& w = c.worlds[0];
  EXPECT_EQ(w.job_id(), "job");
  EXPECT_EQ(w.generation(), 1u);
  EXPECT_EQ(w.state(), coord::RUNNING);
  EXPECT_EQ(w.world_size(), 6);
  // Ordered by (hostname, agent_id): (node-a,a2) (node-a,a3) (node-b,a1).
  ASSERT_EQ(w.agents_size(), 3);
  EXPECT_EQ(w.agents(0).agent().agent_id(), "a2");
  EXPECT_EQ(w.agents(1).agent().agent_id(), "a3");
  EXPECT_EQ(w.agents(2).agent().agent_id(), "a1");
  EXPECT_EQ(w.agents(0).local_size(), 1);
  EXPECT_EQ(w.agents(1).local_size(), 3);
  EXPECT_EQ(w.agents(2).local_size(), 2);
  EXPECT_EQ(w.agents(0).rank_offset(), 0);
  EXPECT_EQ(w.agents(1).rank_offset(), 1);
  EXPECT_EQ(w.agents(2).rank_offset(), 4);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(w.agents(i).cross_rank(), i);
  EXPECT_EQ(w.agents(2).agent().hostname(), "node-b");
  EXPECT_EQ(w.agents(2).agent().rpc_address(), "node-b:7471");
}

TEST_F(MembershipTest, OrderDoesNotDependOnJoinOrder) {
  registerAgent("x", "h2");
  registerAgent("y", "h1");
  registerAgent("z", "h1");
  ASSERT_TRUE(join("j1", "x", 1, 3).ok());
  ASSERT_TRUE(join("j1", "y", 1, 3).ok());
  ASSERT_TRUE(join("j1", "z", 1, 3).ok());
  ASSERT_TRUE(join("j2", "z", 1, 3).ok());
  ASSERT_TRUE(join("j2", "x", 1, 3).ok());
  ASSERT_TRUE(join("j2", "y", 1, 3).ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 2u);
  for (const auto& w : c.worlds) {
    ASSERT_EQ(w.agents_size(), 3);
    EXPECT_EQ(w.agents(0).agent().agent_id(), "y");
    EXPECT_EQ(w.agents(1).agent().agent_id(), "z");
    EXPECT_EQ(w.agents(2).agent().agent_id(), "x");
  }
}

TEST_F(MembershipTest, JoinErrors) {
  registerAgent("a", "ha");
  registerAgent("b", "hb");

  grpc::Status st = join("job", "ghost", 1, 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("agent not registered"), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("ghost"), std::string::npos);

  st = join("job", "a", 0, 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  st = join("job", "a", 3, 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(join("job", "a", 1, 4, "good").ok());
  st = join("job", "b", 1, 4, "bad");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("wrong token for job job"), std::string::npos)
      << st.error_message();

  st = join("job", "b", 1, 8, "good");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("4"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("8"), std::string::npos) << st.error_message();

  st = join("job", "b", 4, 4, "good");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "1 + 4 > world_size 4";

  // The same agent joining again updates its local_size.
  ASSERT_TRUE(join("job", "a", 2, 4, "good").ok());
  EXPECT_EQ(m_.findJob("job")->joinedRanks(), 2);
  ASSERT_TRUE(join("job", "b", 2, 4, "good").ok());
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);

  // A sealed job cannot be joined (a retried join of a member is fine).
  registerAgent("c", "hc");
  st = join("job", "c", 1, 4, "good");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("RUNNING"), std::string::npos) << st.error_message();
  EXPECT_TRUE(join("job", "a", 2, 4, "good").ok());

  EXPECT_EQ(m_.checkAccess("job", "bad").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(m_.checkAccess("nope", "good").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(m_.checkAccess("job", "good").ok());
}

TEST_F(MembershipTest, LeaseExpiryFailsTheJobWithTheReason) {
  registerAgent("a", "host-a");
  registerAgent("b", "host-b");
  ASSERT_TRUE(join("job", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "b", 1, 2).ok());
  takeChanges();

  clock_.advance(3000);
  EXPECT_TRUE(heartbeat("a"));
  m_.expireLeases(&changes_);
  EXPECT_TRUE(takeChanges().empty());

  clock_.advance(1999);
  m_.expireLeases(&changes_);
  EXPECT_TRUE(takeChanges().empty()) << "b is silent for 4999 ms < lease 5000 ms";

  clock_.advance(1);
  m_.expireLeases(&changes_);
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].state(), coord::FAILED);
  EXPECT_EQ(c.worlds[0].generation(), 1u);
  EXPECT_EQ(c.worlds[0].reason(), "agent b (host host-b) lost: no heartbeat for 5000 ms");
  EXPECT_EQ(m_.findJob("job")->state, coord::FAILED);

  EXPECT_FALSE(heartbeat("b")) << "a lost agent must register again";
  EXPECT_TRUE(heartbeat("a"));
  auto agents = m_.listAgents();
  ASSERT_EQ(agents.agents_size(), 1);
  EXPECT_EQ(agents.agents(0).agent().agent_id(), "a");

  // Losing a forming job's agent fails it too; a later loss does not overwrite.
  registerAgent("c", "host-c");
  ASSERT_TRUE(join("forming", "a", 1, 3).ok());
  ASSERT_TRUE(join("forming", "c", 1, 3).ok());
  clock_.advance(5000);
  m_.expireLeases(&changes_);
  c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u) << "the FAILED job does not fail again";
  EXPECT_EQ(c.worlds[0].job_id(), "forming");
  EXPECT_EQ(c.worlds[0].state(), coord::FAILED);
  EXPECT_EQ(m_.findJob("job")->reason, "agent b (host host-b) lost: no heartbeat for 5000 ms");
}

TEST_F(MembershipTest, ReRegistrationRenewsTheLease) {
  registerAgent("a", "h");
  clock_.advance(4000);
  registerAgent("a", "h2");
  clock_.advance(4000);
  m_.expireLeases(&changes_);
  auto agents = m_.listAgents();
  ASSERT_EQ(agents.agents_size(), 1);
  EXPECT_EQ(agents.agents(0).agent().hostname(), "h2");
  EXPECT_EQ(agents.agents(0).last_heartbeat_age_ms(), 4000);
}

TEST_F(MembershipTest, LeaveJobNeedsTheJobTokenAndTheAgentSecret) {
  registerAgent("a", "ha");
  registerAgent("b", "hb");
  ASSERT_TRUE(join("job", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "b", 1, 2).ok());
  takeChanges();

  for (const char* token : {"", "wrong"}) {
    grpc::Status st = leave("job", "a", /*failed=*/true, "sabotage", token);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << token;
    EXPECT_EQ(st.error_message(),
              "LeaveJob refused: wrong token for job job (agent a); only the job's own agents "
              "may leave or fail it");
  }
  // The job token without the agent's secret does not speak for the agent.
  secrets_["a"] = "not-the-secret";
  grpc::Status st = leave("job", "a", /*failed=*/true, "sabotage");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(),
            "LeaveJob for agent a refused: the agent secret does not match its registration");
  EXPECT_TRUE(takeChanges().empty());
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);
  EXPECT_EQ(m_.findJob("job")->reason, "");

  ASSERT_TRUE(leave("job", "b", /*failed=*/true, "rank 1 exited").ok());
  EXPECT_EQ(m_.findJob("job")->state, coord::FAILED);
}

TEST_F(MembershipTest, JoinJobNeedsTheAgentSecret) {
  registerAgent("a", "ha");
  secrets_["a"] = "guess";
  grpc::Status st = join("job", "a", 1, 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(),
            "JoinJob for agent a refused: the agent secret does not match its registration");
  EXPECT_EQ(m_.findJob("job"), nullptr);
}

TEST_F(MembershipTest, AHeartbeatWithAnotherAgentsIdIsRefusedAndItsLeaseStillRunsOut) {
  registerAgent("a", "host-a");
  registerAgent("b", "host-b");
  ASSERT_TRUE(join("job", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "b", 1, 2).ok());
  takeChanges();
  // b stops; someone keeps sending heartbeats for it, without its secret.
  for (int i = 0; i < 5; ++i) {
    clock_.advance(1000);
    EXPECT_TRUE(heartbeat("a"));
    for (const char* secret : {"", "0123456789abcdef0123456789abcdef"}) {
      coord::HeartbeatRequest req;
      req.set_agent_id("b");
      req.set_agent_secret(secret);
      coord::HeartbeatReply reply;
      grpc::Status st = m_.heartbeat(req, &reply);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_EQ(st.error_message(),
                "Heartbeat for agent b refused: the agent secret does not match its "
                "registration; only the agent process that registered may renew its lease (a "
                "restarted agent calls RegisterAgent)");
    }
    m_.expireLeases(&changes_);
  }
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].state(), coord::FAILED);
  EXPECT_EQ(c.worlds[0].reason(), "agent b (host host-b) lost: no heartbeat for 5000 ms");
}

TEST_F(MembershipTest, ARestartedAgentsJobsFailAtOnceNamingIt) {
  registerAgent("a", "host-a");
  registerAgent("b", "host-b");
  ASSERT_TRUE(join("job", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "b", 1, 2).ok());
  ASSERT_TRUE(join("forming", "b", 1, 3).ok());
  takeChanges();
  std::string old_secret = secrets_["b"];

  // The same process registering again (its previous secret) keeps its jobs.
  clock_.advance(100);
  registerAgent("b", "host-b");
  EXPECT_EQ(secrets_["b"], old_secret);
  EXPECT_TRUE(takeChanges().worlds.empty());
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);

  // A registration in b's name without its secret (issue 47: another
  // process taking the id over) is refused while b's lease is live, and
  // changes nothing.
  clock_.advance(100);
  {
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id("b");
    req.mutable_agent()->set_hostname("evil");
    coord::RegisterAgentReply reply;
    grpc::Status st = m_.registerAgent(req, &reply, &changes_);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_NE(st.error_message().find("only that agent process, or an operator "
                                      "(--operator-token-file), may register the id again"),
              std::string::npos)
        << st.error_message();
    EXPECT_TRUE(reply.agent_secret().empty());
    EXPECT_TRUE(takeChanges().worlds.empty());
    EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);
    EXPECT_TRUE(heartbeat("b"));
  }

  // b is killed and starts again with the same id, and an operator says so
  // (no previous secret, the operator token). Its jobs fail now, not a
  // lease later.
  clock_.advance(100);
  secrets_["b"].clear();
  registerAgent("b", "host-b", /*by_operator=*/true);
  EXPECT_NE(secrets_["b"], old_secret);
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 2u);
  const std::string why =
      "agent b (host host-b) restarted: it registered again as a new incarnation";
  for (const coord::World& w : c.worlds) {
    EXPECT_EQ(w.state(), coord::FAILED) << w.job_id();
    EXPECT_EQ(w.reason(), why) << w.job_id();
  }
  EXPECT_EQ(m_.findJob("job")->state, coord::FAILED);
  EXPECT_EQ(m_.findJob("forming")->state, coord::FAILED);
  // The old incarnation's secret no longer renews anything.
  coord::HeartbeatRequest req;
  req.set_agent_id("b");
  req.set_agent_secret(old_secret);
  coord::HeartbeatReply reply;
  EXPECT_EQ(m_.heartbeat(req, &reply).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(heartbeat("b"));
  // The new incarnation can join new jobs.
  registerAgent("c", "host-c");
  ASSERT_TRUE(join("next", "b", 1, 2).ok());
  ASSERT_TRUE(join("next", "c", 1, 2).ok());
  EXPECT_EQ(m_.findJob("next")->state, coord::RUNNING);
}

TEST_F(MembershipTest, AnAgentRestoredWithoutASecretRegistersAgainAndKeepsItsJobs) {
  // As from a journal written before agent secrets: the agent is known, with
  // no secret; its heartbeat is told to register, which keeps its job.
  coord::AgentInfo info;
  info.set_agent_id("a");
  info.set_hostname("host-a");
  m_.restoreAgent(info, "");
  registerAgent("b", "host-b");
  Job job;
  job.id = "job";
  job.token = "secret";
  job.world_size = 2;
  job.members = {{"a", info, 1, false}, {"b", m_.agents().find("b")->info, 1, false}};
  job.state = coord::RUNNING;
  job.generation = 1;
  m_.restoreJob(job);
  EXPECT_FALSE(heartbeat("a"));
  EXPECT_EQ(join("job2", "a", 1, 1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  registerAgent("a", "host-a");  // it has no previous secret either
  EXPECT_TRUE(takeChanges().worlds.empty());
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);
  EXPECT_TRUE(heartbeat("a"));
}

// Issue 47: secrets and tokens are held (and journaled) as hashes; a state
// written before holds them in clear and still works after a restart.
TEST_F(MembershipTest, SecretsAndTokensAreHeldHashedAndAnOlderClearStateStillWorks) {
  registerAgent("b", "host-b");
  EXPECT_EQ(m_.agents().find("b")->secret, hashSecret(secrets_["b"]));
  ASSERT_TRUE(join("job", "b", 1, 1, "job-token").ok());
  EXPECT_EQ(m_.findJob("job")->token, hashSecret("job-token"));
  EXPECT_TRUE(m_.checkAccess("job", "job-token").ok());
  EXPECT_EQ(m_.checkAccess("job", hashSecret("job-token")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED)
      << "the stored hash is not a credential";
  // As restored from a state dir or etcd written before issue 47.
  coord::AgentInfo info;
  info.set_agent_id("old");
  info.set_hostname("host-old");
  m_.restoreAgent(info, "0123456789abcdef0123456789abcdef");
  secrets_["old"] = "0123456789abcdef0123456789abcdef";
  EXPECT_TRUE(heartbeat("old"));
  Job job;
  job.id = "old-job";
  job.token = "clear-token";
  job.world_size = 1;
  job.members = {{"old", info, 1, false}};
  job.state = coord::RUNNING;
  job.generation = 1;
  m_.restoreJob(job);
  EXPECT_EQ(m_.findJob("old-job")->token, hashSecret("clear-token"));
  EXPECT_TRUE(m_.checkAccess("old-job", "clear-token").ok());
}

TEST_F(MembershipTest, CleanLeaveFinishesAndRetentionForgets) {
  registerAgent("a", "ha");
  registerAgent("b", "hb");
  ASSERT_TRUE(join("job", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "b", 1, 2).ok());
  takeChanges();

  ASSERT_TRUE(leave("job", "a").ok());
  EXPECT_TRUE(takeChanges().empty());
  EXPECT_EQ(m_.findJob("job")->state, coord::RUNNING);
  ASSERT_TRUE(leave("job", "b").ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].state(), coord::FINISHED);
  EXPECT_EQ(c.worlds[0].generation(), 1u);

  EXPECT_EQ(leave("job", "zzz").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(leave("nope", "a").error_code(), grpc::StatusCode::NOT_FOUND);

  clock_.advance(299 * 1000);
  m_.collectEndedJobs(&changes_);
  EXPECT_TRUE(takeChanges().empty());
  EXPECT_EQ(m_.listJobs().jobs_size(), 1);
  clock_.advance(1000);
  m_.collectEndedJobs(&changes_);
  c = takeChanges();
  ASSERT_EQ(c.removed.size(), 1u);
  EXPECT_EQ(c.removed[0].job_id, "job");
  EXPECT_EQ(m_.findJob("job"), nullptr);
  // The id can be used again.
  EXPECT_TRUE(join("job", "a", 1, 2, "other").ok());
}

TEST_F(MembershipTest, FailedLeaveFailsTheJobFirstFailureWins) {
  registerAgent("a", "ha");
  registerAgent("b", "hb");
  ASSERT_TRUE(join("job", "a", 1, 2).ok());
  ASSERT_TRUE(join("job", "b", 1, 2).ok());
  takeChanges();
  ASSERT_TRUE(leave("job", "b", true, "rank 1 exited with code 3").ok());
  ASSERT_TRUE(leave("job", "a", true, "peer went away").ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.worlds.size(), 1u);
  EXPECT_EQ(c.worlds[0].state(), coord::FAILED);
  EXPECT_EQ(c.worlds[0].reason(), "rank 1 exited with code 3");
  EXPECT_EQ(m_.findJob("job")->reason, "rank 1 exited with code 3");
  EXPECT_EQ(join("job", "a", 1, 2).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(MembershipTest, FormingJobWhoseAgentsAllLeaveIsRemoved) {
  registerAgent("a", "ha");
  registerAgent("b", "hb");
  ASSERT_TRUE(join("job", "a", 1, 3).ok());
  ASSERT_TRUE(join("job", "b", 1, 3).ok());
  ASSERT_TRUE(leave("job", "a").ok());
  EXPECT_EQ(m_.findJob("job")->joinedRanks(), 1);
  EXPECT_TRUE(takeChanges().empty());
  ASSERT_TRUE(leave("job", "b").ok());
  Changes c = takeChanges();
  ASSERT_EQ(c.removed.size(), 1u);
  EXPECT_EQ(c.removed[0].job_id, "job");
  EXPECT_EQ(m_.findJob("job"), nullptr);
}

TEST_F(MembershipTest, Listings) {
  registerAgent("a", "ha");
  registerAgent("b", "hb");
  ASSERT_TRUE(join("job", "a", 2, 3).ok());
  clock_.advance(250);
  EXPECT_TRUE(heartbeat("a"));
  auto jobs = m_.listJobs();
  ASSERT_EQ(jobs.jobs_size(), 1);
  const auto& j = jobs.jobs(0);
  EXPECT_EQ(j.job_id(), "job");
  EXPECT_EQ(j.state(), coord::FORMING);
  EXPECT_EQ(j.generation(), 0u);
  EXPECT_EQ(j.world_size(), 3);
  EXPECT_EQ(j.joined_ranks(), 2);
  EXPECT_EQ(j.created_unix_ms(), clock_.wallMs() - 250);
  ASSERT_EQ(j.agents_size(), 1);
  EXPECT_EQ(j.agents(0).rank_offset(), -1) << "not assigned before sealing";

  auto agents = m_.listAgents();
  ASSERT_EQ(agents.agents_size(), 2);
  EXPECT_EQ(agents.agents(0).agent().agent_id(), "a");
  EXPECT_EQ(agents.agents(0).last_heartbeat_age_ms(), 0);
  ASSERT_EQ(agents.agents(0).job_ids_size(), 1);
  EXPECT_EQ(agents.agents(0).job_ids(0), "job");
  EXPECT_EQ(agents.agents(1).last_heartbeat_age_ms(), 250);
  EXPECT_EQ(agents.agents(1).job_ids_size(), 0);
}

}  // namespace
}  // namespace kolo::coordinator
