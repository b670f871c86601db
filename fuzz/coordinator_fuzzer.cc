// Fuzzes the coordinator's state machine: a sequence of RegisterAgent,
// Heartbeat, JoinJob, LeaveJob, KvPut, WatchJob and clock steps built from
// the input is fed to coordinator::Core (Membership + KvStore + WatchHub)
// with a manual clock, as the loop thread would.
//
// Agents present the secret their registration returned (or a wrong one);
// a heartbeat is accepted exactly with the right secret, and an agent that
// registers again without its previous secret (a restart) is in no active
// job afterwards.
//
// After every step: each job is consistent (a FORMING job has generation 0
// and at most world_size ranks; a sealed one has its agents in (hostname,
// agent_id) order, cross ranks 0..n-1 and cumulative rank offsets summing to
// world_size; a RUNNING job's remaining agents are registered), and the
// journal records replayed through their text form equal the live state.
// At the end a Core restored from that state lists the same jobs.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "common/event_loop.h"
#include "common/log.h"
#include "coordinator/core.h"
#include "coordinator/membership/secrets.h"
#include "coordinator/persist/record_sink.h"
#include "fuzz/fuzz_util.h"

namespace kolo::coordinator {
namespace {

class FuzzClock final : public Clock {
 public:
  int64_t steadyMs() const override { return steady_; }
  int64_t wallMs() const override { return 1'700'000'000'000 + steady_; }
  void advance(int64_t ms) { steady_ += ms; }

 private:
  int64_t steady_ = 1000;
};

constexpr int64_t kLeaseMs = 1000;
constexpr int64_t kRetentionMs = 5000;

EventLoop* loop() {
  static EventLoop* l = new EventLoop("fuzz-loop");  // never started: this thread is the loop
  return l;
}

// Small id spaces so requests collide; sometimes arbitrary bytes.
std::string pick(FuzzedDataProvider& in, const char* prefix, int n) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) return in.ConsumeRandomLengthString(12);
  return prefix + std::to_string(in.ConsumeIntegralInRange<int>(0, n - 1));
}

void checkJob(const Job& job, const Membership& m) {
  FUZZ_CHECK(!job.id.empty());
  FUZZ_CHECK(job.world_size > 0);
  std::set<std::string> ids;
  for (const JobMember& member : job.members) {
    FUZZ_CHECK(ids.insert(member.agent_id).second);  // one entry per agent
    FUZZ_CHECK(member.local_size > 0);
  }
  if (job.generation == 0) {
    FUZZ_CHECK(job.state == coord::FORMING || job.state == coord::FAILED);
    FUZZ_CHECK(job.slots.empty());
    FUZZ_CHECK(job.joinedRanks() <= job.world_size);
    if (job.state == coord::FORMING) FUZZ_CHECK(!job.members.empty());
  } else {
    FUZZ_CHECK(job.generation == 1);
    FUZZ_CHECK(job.state != coord::FORMING);
    FUZZ_CHECK(job.slots.size() == job.members.size());
    int64_t offset = 0;
    for (size_t i = 0; i < job.slots.size(); ++i) {
      const coord::AgentSlot& s = job.slots[i];
      FUZZ_CHECK(s.cross_rank() == static_cast<int32_t>(i));
      FUZZ_CHECK(s.rank_offset() == offset);
      FUZZ_CHECK(s.local_size() > 0);
      FUZZ_CHECK(job.findMember(s.agent().agent_id()) != nullptr);
      if (i > 0) {
        const coord::AgentInfo& a = job.slots[i - 1].agent();
        const coord::AgentInfo& b = s.agent();
        FUZZ_CHECK(std::tie(a.hostname(), a.agent_id()) < std::tie(b.hostname(), b.agent_id()));
      }
      offset += s.local_size();
    }
    FUZZ_CHECK(offset == job.world_size);
  }
  if (job.state == coord::RUNNING) {
    for (const JobMember& member : job.members) {
      if (!member.left) FUZZ_CHECK(m.agents().find(member.agent_id) != nullptr);
    }
  }
  if (job.ended()) FUZZ_CHECK(job.ended_steady_ms >= 0);
}

}  // namespace
}  // namespace kolo::coordinator

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kolo::fuzz::quietInit();
  kolo::coordinator::loop();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kolo::coordinator;
  using kolo::coord::World;
  FuzzedDataProvider in(data, size);
  FuzzClock clock;
  persist::MemorySink sink;
  MembershipOptions options{kLeaseMs, kLeaseMs / 4, kRetentionMs};
  Core core(loop(), options, &clock, &sink);
  std::vector<std::shared_ptr<WatchQueue>> watches;
  std::map<std::string, std::string> secrets;  // agent id -> the secret its registration got
  auto secretOf = [&](const std::string& agent) {
    auto it = secrets.find(agent);
    return it == secrets.end() ? std::string() : it->second;
  };
  auto maybeWrong = [&](const std::string& secret) {
    return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? secret + "x" : secret;
  };

  for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: {
        kolo::coord::RegisterAgentRequest req;
        req.mutable_agent()->set_agent_id(pick(in, "agent-", 5));
        req.mutable_agent()->set_hostname(pick(in, "host-", 3));
        req.mutable_agent()->set_data_address(in.ConsumeRandomLengthString(8));
        const std::string& id = req.agent().agent_id();
        const AgentRecord* before = core.membership().agents().find(id);
        bool same = in.ConsumeBool();  // the same process again, or a restart
        if (same) req.set_previous_secret(secretOf(id));
        bool by_operator = in.ConsumeBool();
        bool restarted =
            before != nullptr && !before->secret.empty() && (!same || secretOf(id).empty());
        // Issue 47: a live agent's id needs its secret or the operator.
        bool live = before != nullptr && clock.steadyMs() - before->last_heartbeat_ms < kLeaseMs;
        bool takeover_refused = restarted && live && !by_operator;
        std::string secret_before = before != nullptr ? before->secret : std::string();
        kolo::coord::RegisterAgentReply reply;
        grpc::Status st = core.registerAgentOnLoop(req, &reply, by_operator);
        FUZZ_CHECK(st.ok() == (!id.empty() && !takeover_refused));
        if (takeover_refused) {
          FUZZ_CHECK(st.error_code() == grpc::StatusCode::ALREADY_EXISTS);
          const AgentRecord* after = core.membership().agents().find(id);
          FUZZ_CHECK(after != nullptr && after->secret == secret_before);
          FUZZ_CHECK(reply.agent_secret().empty());
        }
        if (!st.ok()) break;
        FUZZ_CHECK(reply.agent_secret().size() == 32);
        if (restarted) {
          FUZZ_CHECK(reply.agent_secret() != secretOf(id));
          for (const auto& [job_id, job] : core.membership().jobs()) {
            const JobMember* m = job.findMember(id);
            FUZZ_CHECK(!job.active() || m == nullptr || m->left);
            for (const JobMember& w : job.waiting) FUZZ_CHECK(w.agent_id != id);
          }
        }
        secrets[id] = reply.agent_secret();
        break;
      }
      case 1: {
        kolo::coord::HeartbeatRequest req;
        req.set_agent_id(pick(in, "agent-", 5));
        req.set_agent_secret(maybeWrong(secretOf(req.agent_id())));
        const AgentRecord* agent = core.membership().agents().find(req.agent_id());
        kolo::coord::HeartbeatReply reply;
        grpc::Status st = core.heartbeatOnLoop(req, &reply);
        if (agent == nullptr || agent->secret.empty()) {
          FUZZ_CHECK(st.ok() && !reply.known());
        } else {
          bool right = matchesStored(req.agent_secret(), agent->secret);
          FUZZ_CHECK(st.ok() == right);
          FUZZ_CHECK(!st.ok() || reply.known());
        }
        break;
      }
      case 2: {
        kolo::coord::JoinJobRequest req;
        req.set_job_id(pick(in, "job-", 3));
        req.set_token(in.ConsumeBool() ? "tok" : "other");
        req.set_agent_id(pick(in, "agent-", 5));
        req.set_agent_secret(maybeWrong(secretOf(req.agent_id())));
        req.set_local_size(in.ConsumeIntegralInRange<int32_t>(-1, 4));
        req.set_world_size(in.ConsumeIntegralInRange<int32_t>(-1, 8));
        const AgentRecord* agent = core.membership().agents().find(req.agent_id());
        bool wrong_secret = !req.job_id().empty() && agent != nullptr && !agent->secret.empty() &&
                            !matchesStored(req.agent_secret(), agent->secret);
        grpc::Status st = core.joinJobOnLoop(req);
        if (wrong_secret) FUZZ_CHECK(st.error_code() == grpc::StatusCode::PERMISSION_DENIED);
        break;
      }
      case 3: {
        kolo::coord::LeaveJobRequest req;
        req.set_job_id(pick(in, "job-", 3));
        req.set_token(in.ConsumeBool() ? "tok" : "other");
        req.set_agent_id(pick(in, "agent-", 5));
        req.set_agent_secret(maybeWrong(secretOf(req.agent_id())));
        req.set_failed(in.ConsumeBool());
        req.set_reason(in.ConsumeRandomLengthString(8));
        const Job* job = core.membership().findJob(req.job_id());
        const AgentRecord* agent = core.membership().agents().find(req.agent_id());
        bool refused = job != nullptr && (!matchesStored(req.token(), job->token) ||
                                          (agent != nullptr && !agent->secret.empty() &&
                                           !matchesStored(req.agent_secret(), agent->secret)));
        std::string before = job != nullptr
                                 ? summaryOf(*job, core.membership().agents()).SerializeAsString()
                                 : std::string();
        grpc::Status st = core.leaveJobOnLoop(req);
        if (refused) {
          // A caller without the job's token or the agent's secret changes nothing.
          FUZZ_CHECK(st.error_code() == grpc::StatusCode::PERMISSION_DENIED);
          const Job* after = core.membership().findJob(req.job_id());
          FUZZ_CHECK(after != nullptr);
          FUZZ_CHECK(summaryOf(*after, core.membership().agents()).SerializeAsString() == before);
        }
        break;
      }
      case 4: {
        kolo::coord::KvPutRequest req;
        req.set_job_id(pick(in, "job-", 3));
        req.set_token(in.ConsumeBool() ? "tok" : "other");
        req.set_key(pick(in, "key-", 3));
        req.set_value(in.ConsumeRandomLengthString(16));
        grpc::Status st = core.kvPutOnLoop(req);
        if (st.ok()) {
          kolo::coord::KvGetRequest get;
          get.set_job_id(req.job_id());
          get.set_token(req.token());
          get.set_key(req.key());
          std::optional<std::string> value;
          FUZZ_CHECK(core.kvGetOnLoop(get, [&](std::optional<std::string> v) { value = v; }).ok());
          FUZZ_CHECK(value == req.value());
        }
        break;
      }
      case 5: {
        kolo::coord::WatchJobRequest req;
        req.set_job_id(pick(in, "job-", 3));
        req.set_token(in.ConsumeBool() ? "tok" : "other");
        auto queue = std::make_shared<WatchQueue>();
        if (core.watchOnLoop(req, queue).ok()) {
          World w;
          FUZZ_CHECK(queue->next(&w, std::chrono::milliseconds(0)) == WatchQueue::Next::kWorld);
          const Job* job = core.membership().findJob(req.job_id());
          FUZZ_CHECK(job != nullptr);
          FUZZ_CHECK(w.generation() == job->generation && w.state() == job->state);
          watches.push_back(std::move(queue));
        }
        break;
      }
      case 8: {
        // A WatchJob stream cancelled at any point: the reactor's OnDone
        // unwatches, maybe after the job is gone, maybe twice (a late
        // subscription and the stream's end).
        if (watches.empty()) break;
        size_t i = in.ConsumeIntegralInRange<size_t>(0, watches.size() - 1);
        core.unwatchOnLoop(pick(in, "job-", 3), watches[i].get());
        if (in.ConsumeBool()) core.unwatchOnLoop(pick(in, "job-", 3), watches[i].get());
        watches.erase(watches.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      case 9: {
        // A member agent's stream (its secret, maybe wrong), from some peer.
        kolo::coord::WatchJobRequest req;
        req.set_job_id(pick(in, "job-", 3));
        req.set_token(in.ConsumeBool() ? "tok" : "other");
        req.set_agent_id(pick(in, "agent-", 5));
        req.set_agent_secret(maybeWrong(secretOf(req.agent_id())));
        auto queue = std::make_shared<WatchQueue>();
        grpc::Status st = core.watchOnLoop(req, queue, pick(in, "ipv4:10.0.0.", 3) + ":1");
        if (st.ok()) watches.push_back(std::move(queue));
        break;
      }
      case 6:
      case 7: {
        clock.advance(in.ConsumeIntegralInRange<int64_t>(0, 3 * kLeaseMs));
        core.expireLeasesOnLoop();
        core.collectEndedJobsOnLoop();
        break;
      }
    }
    for (const auto& [id, job] : core.membership().jobs()) {
      FUZZ_CHECK(id == job.id);
      checkJob(job, core.membership());
    }
    FUZZ_CHECK(sink.errors().empty());
    FUZZ_CHECK(sink.state() == core.persistedStateOnLoop());
  }
  // Streams ended in any order leave no quota counted.
  FUZZ_CHECK(core.watchAccounting().others() <= watches.size());
  for (const auto& q : watches) core.unwatchOnLoop("", q.get());
  FUZZ_CHECK(core.watchAccounting().others() == 0 && core.watchAccounting().open() == 0);
  // Every World a watcher got is a real generation of its job, in order.
  for (const auto& q : watches) {
    World w;
    uint64_t last = 0;
    while (q->next(&w, std::chrono::milliseconds(0)) == WatchQueue::Next::kWorld) {
      FUZZ_CHECK(w.generation() >= last);
      last = w.generation();
    }
  }
  // Recovery: a Core restored from the records lists the same jobs.
  Core restored(loop(), options, &clock);
  restored.restoreOnLoop(sink.state());
  FUZZ_CHECK(restored.listJobsOnLoop().SerializeAsString() ==
             core.listJobsOnLoop().SerializeAsString());
  return 0;
}
