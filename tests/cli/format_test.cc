// The kolo CLI's tables and JSON documents.
#include <gtest/gtest.h>

#include "cli/status_format.h"
#include "cli/table.h"

namespace kolo::cli {
namespace {

TEST(Format, Durations) {
  EXPECT_EQ(formatDuration(0), "0 ms");
  EXPECT_EQ(formatDuration(850), "850 ms");
  EXPECT_EQ(formatDuration(3200), "3.2 s");
  EXPECT_EQ(formatDuration(245'000), "4m 05s");
  EXPECT_EQ(formatDuration(7'380'000), "2h 03m");
  EXPECT_EQ(formatDuration(90'000'000), "1d 01h");
  EXPECT_EQ(formatDuration(-5), "0 ms");
}

TEST(Format, Bytes) {
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(1536), "1.5 KiB");
  EXPECT_EQ(formatBytes(64ull << 20), "64.0 MiB");
  EXPECT_EQ(formatBytes(3ull << 40), "3.0 TiB");
}

TEST(Format, RankRanges) {
  EXPECT_EQ(formatRanks({}), "-");
  EXPECT_EQ(formatRanks({3}), "3");
  EXPECT_EQ(formatRanks({5, 0, 1, 2, 3, 7, 8}), "0-3,5,7-8");
}

TEST(Format, TableAlignsColumns) {
  Table t({"NAME", "X", "LAST"});
  t.add({"a", "long value", "z"});
  t.add({"longer name", "b", ""});
  EXPECT_EQ(t.render(),
            "NAME         X           LAST\n"
            "a            long value  z\n"
            "longer name  b\n");
}

agentrpc::JobInfo sampleJob() {
  agentrpc::JobInfo j;
  j.set_job_id("job-0123456789ab");
  j.set_state("RUNNING");
  j.set_generation(2);
  j.set_rank_offset(4);
  j.set_local_size(4);
  j.set_world_size(8);
  j.set_connected_clients(4);
  j.mutable_counters()->set_ops_done(10);
  j.mutable_counters()->set_bytes_done(3ull << 20);
  auto* f = j.add_in_flight();
  f->set_name("grad/layer1.weight");
  f->set_op("allreduce");
  f->set_dtype("float32");
  f->add_shape(1024);
  f->add_shape(3);
  for (int r : {4, 5}) f->add_submitted_ranks(r);
  for (int r : {6, 7}) f->add_waiting_ranks(r);
  f->set_age_ms(61'000);
  return j;
}

TEST(Format, AgentJobShowsWhatEachCollectiveWaitsFor) {
  std::string text = renderAgentJob(sampleJob());
  EXPECT_NE(text.find("job-0123456789ab"), std::string::npos) << text;
  EXPECT_NE(text.find("RUNNING (generation 2)"), std::string::npos) << text;
  EXPECT_NE(text.find("4-7 of 8"), std::string::npos) << text;
  EXPECT_NE(text.find("10 done (3.0 MiB), 0 failed"), std::string::npos) << text;
  EXPECT_NE(text.find("WAITING FOR"), std::string::npos) << text;
  // The in-flight row: name, op, dtype, shape, age, waiting, submitted.
  EXPECT_NE(text.find("grad/layer1.weight  allreduce  float32  [1024,3]  1m 01s  6-7          4-5"),
            std::string::npos)
      << text;
  agentrpc::JobInfo idle = sampleJob();
  idle.clear_in_flight();
  EXPECT_NE(renderAgentJob(idle).find("no collective in flight"), std::string::npos);
  // A one-agent job has no backend line; a job across agents names the agreed one.
  EXPECT_EQ(text.find("backend"), std::string::npos) << text;
  agentrpc::JobInfo across = sampleJob();
  across.set_backend("tcp");
  across.set_backend_reason("auto: agent rank 1 offers tcp (no RDMA device)");
  std::string t2 = renderAgentJob(across);
  EXPECT_NE(t2.find("tcp (auto: agent rank 1 offers tcp (no RDMA device))"), std::string::npos)
      << t2;
  EXPECT_EQ(toJson(across)["backend"], "tcp");
  EXPECT_EQ(toJson(across)["backend_reason"], "auto: agent rank 1 offers tcp (no RDMA device)");
}

TEST(Format, AgentJobJson) {
  nlohmann::json j = toJson(sampleJob());
  EXPECT_EQ(j["job_id"], "job-0123456789ab");
  EXPECT_EQ(j["generation"], 2);
  EXPECT_EQ(j["counters"]["bytes_done"], 3ull << 20);
  ASSERT_EQ(j["in_flight"].size(), 1u);
  EXPECT_EQ(j["in_flight"][0]["waiting_ranks"], nlohmann::json::array({6, 7}));
  EXPECT_EQ(j["in_flight"][0]["shape"], nlohmann::json::array({1024, 3}));
  EXPECT_EQ(j["in_flight"][0]["age_ms"], 61'000);
}

TEST(Format, AgentStatus) {
  agentrpc::AgentStatus s;
  s.set_agent_id("node0");
  s.set_hostname("gpu-17");
  s.set_version("0.1.0");
  s.set_socket_path("/run/kolo/agent.sock");
  s.set_coordinator("10.0.0.1:7470");
  s.set_uptime_ms(3'600'000 + 120'000);
  auto* c = s.add_clients();
  c->set_job_id("job-0123456789ab");
  c->set_rank(5);
  c->set_local_rank(1);
  c->set_pid(4242);
  c->set_uid(1000);
  c->set_arena_bytes(64ull << 20);
  *s.add_jobs() = sampleJob();
  std::string text = renderAgentStatus(s);
  EXPECT_NE(text.find("agent        node0 (kolo 0.1.0)"), std::string::npos) << text;
  EXPECT_NE(text.find("uptime       1h 02m"), std::string::npos) << text;
  EXPECT_NE(text.find("4242"), std::string::npos) << text;
  EXPECT_NE(text.find("64.0 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("job-0123456789ab  RUNNING"), std::string::npos) << text;

  nlohmann::json j = toJson(s);
  EXPECT_EQ(j["agent_id"], "node0");
  EXPECT_EQ(j["uptime_ms"], 3'720'000);
  EXPECT_EQ(j["clients"][0]["pid"], 4242);
  EXPECT_EQ(j["jobs"][0]["job_id"], "job-0123456789ab");

  agentrpc::AgentStatus empty;
  std::string none = renderAgentStatus(empty);
  EXPECT_NE(none.find("no jobs"), std::string::npos);
  EXPECT_NE(none.find("no clients connected"), std::string::npos);
}

// CUDA MPS per GPU (docs/cli.md, "CUDA MPS"): the rows a GPU agent sends,
// which this CI's agents (no GPU) cannot.
TEST(Format, AgentStatusMpsPerGpu) {
  agentrpc::AgentStatus s;
  s.mutable_mps()->set_state("up");
  s.mutable_mps()->set_pipe_dir("/run/kolo-mps");
  auto* g0 = s.add_gpus();
  g0->set_index(0);
  *g0->mutable_mps() = s.mps();
  g0->set_mps_client("yes");
  auto* g1 = s.add_gpus();
  g1->set_index(1);
  *g1->mutable_mps() = s.mps();
  g1->set_mps_client("no");
  std::string text = renderAgentStatus(s);
  EXPECT_NE(text.find("\nGPU 0: MPS up (pipe /run/kolo-mps)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nGPU 1: MPS up (pipe /run/kolo-mps); the agent's own CUDA contexts are not "
                      "MPS clients"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("no GPU"), std::string::npos) << text;
  nlohmann::json j = toJson(s);
  EXPECT_EQ(j["gpus"][1]["index"], 1);
  EXPECT_EQ(j["gpus"][1]["mps"]["state"], "up");
  EXPECT_EQ(j["gpus"][1]["mps_client"], "no");

  agentrpc::AgentStatus down;
  auto* g = down.add_gpus();
  g->set_index(0);
  g->mutable_mps()->set_state("down");
  g->mutable_mps()->set_reason("no control socket in /run/kolo-mps");
  EXPECT_NE(renderAgentStatus(down).find("GPU 0: MPS down: no control socket in /run/kolo-mps\n"),
            std::string::npos)
      << renderAgentStatus(down);

  agentrpc::AgentStatus none;
  none.set_no_gpu("built without CUDA");
  none.mutable_mps()->set_state("down");
  none.mutable_mps()->set_reason("no pipe directory /tmp/nvidia-mps");
  EXPECT_NE(
      renderAgentStatus(none).find("no GPU (built without CUDA); node MPS down: no pipe directory "
                                   "/tmp/nvidia-mps\n"),
      std::string::npos)
      << renderAgentStatus(none);

  // An agent too old to report MPS: no line at all.
  EXPECT_EQ(renderAgentStatus(agentrpc::AgentStatus()).find("MPS"), std::string::npos);
}

TEST(Format, CoordinatorJobsAndAgents) {
  coord::ListJobsReply r;
  auto* j = r.add_jobs();
  j->set_job_id("job-aaaaaaaaaaaa");
  j->set_state(coord::FORMING);
  j->set_generation(0);
  j->set_world_size(4);
  j->set_joined_ranks(2);
  j->set_created_unix_ms(1'000'000);
  auto* slot = j->add_agents();
  slot->mutable_agent()->set_agent_id("node0");
  slot->set_local_size(2);
  std::string text = renderCoordinatorJobs(r, 1'005'000);
  EXPECT_NE(text.find("job-aaaaaaaaaaaa  FORMING  0    2/4    node0:2  5.0 s  -"), std::string::npos) << text;
  nlohmann::json js = toJson(r, 1'005'000);
  EXPECT_EQ(js["jobs"][0]["state"], "FORMING");
  EXPECT_EQ(js["jobs"][0]["age_ms"], 5000);
  EXPECT_EQ(js["jobs"][0]["agents"][0]["agent_id"], "node0");
  EXPECT_EQ(renderCoordinatorJobs(coord::ListJobsReply(), 0), "no jobs\n");
  // A reply cut at the coordinator's size limit says so.
  coord::ListJobsReply cut = r;
  cut.set_truncated(true);
  cut.set_total(5000);
  EXPECT_NE(renderCoordinatorJobs(cut, 1'005'000)
                .find("(" + std::to_string(r.jobs_size()) +
                      " of 5000 jobs listed: the reply stops at the coordinator's "
                      "--max-list-reply-bytes)"),
            std::string::npos);

  coord::ListAgentsReply a;
  auto* s = a.add_agents();
  s->mutable_agent()->set_agent_id("node1");
  s->mutable_agent()->set_hostname("h");
  s->mutable_agent()->set_rpc_address("127.0.0.1:9");
  s->set_last_heartbeat_age_ms(300);
  s->add_job_ids("job-aaaaaaaaaaaa");
  std::string at = renderCoordinatorAgents(a);
  EXPECT_NE(at.find("node1  h     127.0.0.1:9     300 ms ago      job-aaaaaaaaaaaa"), std::string::npos) << at;
  EXPECT_EQ(toJson(a)["agents"][0]["last_heartbeat_age_ms"], 300);
}

}  // namespace
}  // namespace kolo::cli
