// Join (kolo_join, Horovod semantics) on the agent loop.
//
// A rank that joins takes no further part: the tensor table treats it as
// having submitted every name (allreduce: it contributes zeros; anything
// else, allgather included as in Horovod, fails with a message naming the joined ranks).
// Its kolo_join completes, on every rank, once every rank of the job has
// joined, with the global rank that joined last.
//
// One agent: the last local rank to join is the last rank. Several agents:
// once all local ranks of an agent have joined, the agent (1) tells its
// negotiation thread to stand in for them (CrossJob::submitJoin: it answers
// every name the other agents negotiate with zeros) and (2) submits
// "__kolo.join.<n>", an int64[size] Sum allreduce in which each rank's entry
// is the time it joined (system clock, microseconds). Its result names the
// last rank to join on every agent alike (the latest time; ties go to the
// higher rank).
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "agent/agent.h"
#include "common/log.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {
auto joinLog() { return log::get("agent.ops"); }

int64_t nowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void Agent::onJoinOnLoop(Job& job, ClientConn& c, const SubmitDesc& d) {
  const int lr = c.local_rank;
  const int k = job.localSize();
  if (job.join_handles.size() != static_cast<size_t>(k)) {
    job.join_handles.assign(k, 0);
    job.join_time_us.assign(k, 0);
  }
  if (job.table().joined(lr)) {
    return completeOnLoop(c, d.handle,
                          invalidArgument("kolo_join: rank " + std::to_string(job.globalRank(lr)) +
                                          " has already joined; it may join again once every rank has joined"));
  }
  job.join_handles[lr] = d.handle;
  job.join_time_us[lr] = nowMicros();
  job.last_joined_local = lr;
  joinLog()->debug("job {}: rank {} joined ({} of {} local ranks)", job.id(), job.globalRank(lr),
                   job.table().joinedCount() + 1, k);
  // Names the others already submitted may be ready now.
  for (ReadyOp& op : job.table().join(lr, std::chrono::steady_clock::now())) {
    stalls_.recordDone(job.id(), op.name);
    timeline_->negotiateEnd(op.name);
    dispatchReadyOnLoop(job, std::move(op));
    if (job.state() == JobState::kFailed) return;
  }
  if (job.table().joinedCount() < k) return;
  if (job.world().cross_size == 1) {
    finishJoinOnLoop(job, okStatus(), job.globalRank(job.last_joined_local));
    return;
  }
  // Every local rank joined: stand in for them and agree on the last rank.
  const int world = job.worldSize();
  const std::string name = "__kolo.join." + std::to_string(job.joins_done + 1);
  const uint64_t bytes = static_cast<uint64_t>(world) * sizeof(int64_t);
  Job::CrossPending p;
  p.dtype = DataType::kInt64;
  p.count = static_cast<size_t>(world);
  p.bytes = bytes;
  p.collective = CollectiveType::kJoin;
  p.report_dtype = DataType::kInt64;
  p.started = std::chrono::steady_clock::now();
  p.staging = staging::acquire(bytes);
  std::memset(p.staging.get(), 0, bytes);
  auto* times = reinterpret_cast<int64_t*>(p.staging.get());
  for (int r = 0; r < k; ++r) times[job.globalRank(r)] = job.join_time_us[r];

  CrossWork w;
  w.req.name = name;
  SubmitDesc& pd = w.req.params;
  pd = SubmitDesc{};
  pd.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
  pd.dtype = static_cast<uint8_t>(DataType::kInt64);
  pd.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  pd.ndim = 1;
  pd.shape[0] = world;
  pd.prescale = pd.postscale = 1.0;
  pd.root = -1;
  pd.data_bytes = bytes;
  pd.name_len = static_cast<uint32_t>(name.size());
  std::memcpy(pd.name, name.data(), name.size());
  w.req.first_rank = job.globalRank(0);
  w.staging = p.staging.get();
  w.count = static_cast<size_t>(world);
  w.dtype = DataType::kInt64;
  w.op = ReduceOp::kSum;
  w.collective = CollectiveType::kAllreduce;
  p.in_flight = job.beginExecuting();
  job.cross_pending.insert_or_assign(name, std::move(p));
  timeline_->opStart(name, CollectiveType::kJoin);
  timeline_->activityStart(name, "NEGOTIATE_ACROSS_AGENTS");
  job.cross->submitJoin(std::move(w));
}

void Agent::onCrossJoinDoneOnLoop(Job& job, const Job::CrossPending& p, const Status& st) {
  if (!st.isOk()) {
    finishJoinOnLoop(job, st, -1);
    return;
  }
  const auto* times = reinterpret_cast<const int64_t*>(p.staging.get());
  int last = -1;
  for (int r = 0; r < static_cast<int>(p.count); ++r) {
    if (last < 0 || times[r] >= times[last]) last = r;
  }
  finishJoinOnLoop(job, okStatus(), last);
}

void Agent::finishJoinOnLoop(Job& job, const Status& st, int64_t last_joined_rank) {
  bool any = false;
  for (size_t r = 0; r < job.join_handles.size(); ++r) {
    uint64_t h = job.join_handles[r];
    if (h == 0) continue;
    any = true;
    job.join_handles[r] = 0;
    ClientConn* c = job.client(static_cast<int>(r));
    if (c == nullptr) continue;
    c->complete(h, st, st.isOk() ? last_joined_rank : -1);
    c->flushCompletions();
    c->signalClient();
  }
  if (!any) return;
  job.table().resetJoined();
  job.last_joined_local = -1;
  if (st.isOk()) {
    ++job.joins_done;
    const int dti = static_cast<int>(DataType::kInt64);
    op_metrics_.ok[static_cast<int>(CollectiveType::kJoin)][dti]->inc();
    joinLog()->info("job {}: every rank joined; the last was rank {}", job.id(), last_joined_rank);
  }
}

}  // namespace kolo
