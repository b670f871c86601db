// Jobs that span several agents: backend set-up, and the cross-agent leg of
// a collective (local reduce into a staging buffer, negotiated allreduce
// among agents, scaled copy back into every local rank's slot).
#include <cctype>
#include <cstdlib>
#include <regex>

#include "agent/agent.h"
#include "agent/coord/coord_kv_store.h"
#include "common/log.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {
auto crossLog() { return log::get("agent.cross"); }

// The autotuner's settings for one job (only the leader agent uses them).
autotune::AutotuneOptions autotuneOptionsFor(const AgentOptions& o, const std::string& job_id) {
  autotune::AutotuneOptions a;
  a.warmup_samples = o.autotune_warmup_samples;
  a.steps_per_sample = o.autotune_steps_per_sample;
  a.max_samples = o.autotune_max_samples;
  a.gp_noise = o.autotune_gp_noise;
  if (o.autotune_fixed_fusion) a.fixed_fusion_threshold_mb = static_cast<double>(o.fusion_threshold_bytes) / (1 << 20);
  if (o.autotune_fixed_switch) a.fixed_switch_point_bytes = o.backend.small_message_bytes;
  a.log_file = substitutePathToken(o.autotune_log_file, "%j", job_id);
  return a;
}
}  // namespace

void Agent::startCrossOnLoop(Job& job) {
  const JobWorld& w = job.world();
  if (job.cross_generation == w.generation) return;
  job.cross_generation = w.generation;
  job.cross.reset();
  BackendOptions bo = opts_.backend;
  bo.rank = w.cross_rank;
  bo.size = w.cross_size;
  bo.key_prefix = "g" + std::to_string(w.generation) + "/" + opts_.backend_name;
  bo.name = job.id() + "/g" + std::to_string(w.generation);
  std::string job_id = job.id(), token = job.token(), backend = opts_.backend_name;
  uint64_t gen = w.generation;
  crossLog()->info("job {}: connecting to {} other agents over {}", job_id, w.cross_size - 1, backend);
  setup_pool_.submit([this, job_id, token, bo, gen, backend] {
    CoordKvStore kv(*coord_, job_id, token);
    auto made = std::make_shared<StatusOr<std::unique_ptr<Backend>>>(createBackend(backend, bo, kv));
    loop_.post([this, job_id, gen, made] {
      auto it = jobs_.find(job_id);
      if (it == jobs_.end() || it->second->cross_generation != gen) return;
      Job& job = *it->second;
      if (!made->isOk()) {
        Status st = made->status().withContext("job " + job_id + ": cannot connect the agents");
        if (job.elastic.enabled()) return suspendOnLoop(job, st);  // the next generation may do better
        failJobOnLoop(job, st, true);
        return;
      }
      if (job.state() == JobState::kFailed) return;
      CrossJobOptions co;
      co.cache_capacity = opts_.cache_capacity;
      co.idle_cycle = std::chrono::milliseconds(opts_.idle_cycle_ms);
      co.collective_timeout = opts_.backend.timeout;
      co.fusion_threshold_bytes = opts_.fusion_threshold_bytes;
      co.small_message_bytes = opts_.backend.small_message_bytes;
      co.fusion_chunk_bytes = opts_.fusion_chunk_bytes;
      co.fusion_max_tensor_bytes = opts_.fusion_max_tensor_bytes;
      co.inline_bytes = opts_.cross_inline_bytes;
      co.pipeline_bytes = opts_.cross_pipeline_bytes;
      if (opts_.autotune) co.autotune = autotuneOptionsFor(opts_, job_id);
      co.timeline = timeline_.get();
      co.rank_offsets = job.world().rank_offsets;
      co.local_sizes = job.world().local_sizes;
      co.fusion_fill = &metrics_.gauge("kolo_fusion_fill_ratio",
                                       "Bytes in the last fused buffer over the fusion threshold");
      job.cross = std::make_unique<CrossJob>(
          job_id + "/g" + std::to_string(gen), std::move(made->value()), co, loop_,
          [this, job_id, gen](const std::string& name, Status st, const CrossResult& result) {
            onCrossDoneOnLoop(job_id, gen, name, st, result);
          });
      crossLog()->info("job {}: agents connected; {} local ranks may start", job_id, job.localSize());
      maybeSendWorldOnLoop(job);
    });
  });
}

void Agent::executeCrossOnLoop(Job& job, ReadyOp op, LocalReduce r, std::vector<uint64_t> handles) {
  const SubmitDesc& d0 = op.descs[0];
  Job::CrossPending p;
  p.handles = std::move(handles);
  // Where the results go (dsts: the output slots of out-of-place ranks, and
  // the joined ranks' zero source is not written back).
  p.slots = r.dsts.empty() ? r.slots : r.dsts;
  p.keepalive = r.keepalive;
  p.dtype = r.dtype;
  p.count = r.count;
  p.bytes = d0.data_bytes;
  p.postscale = r.postscale;
  p.started = op.first_arrival;
  p.collective = static_cast<CollectiveType>(d0.collective);
  // One local rank whose slot is host memory, with nothing to apply before
  // the agents reduce: the backend works on the slot itself. That saves a
  // copy of the whole tensor into a staging buffer and one back (half the
  // memory traffic around the ring). The slot is written only by the
  // backend, which is done with it before the op completes, whatever its
  // status (Backend's contract); a failed op leaves it undefined, as an
  // in-place MPI or NCCL allreduce does. Out of place (an output slot), the
  // backend works on the output slot, and the input is first copied into it
  // (`copy_in`: chunk by chunk ahead of the ring when pipelined).
  p.in_place = op.error.isOk() && r.count > 0 && r.slots.size() == 1 && r.dsts.size() <= 1 && !r.scratch &&
               !r.before_finish && r.prescale == 1.0 &&
               (p.collective == CollectiveType::kAllreduce ||
                (p.collective == CollectiveType::kBroadcast && r.dsts.empty()));
  const bool copy_in = p.in_place && r.slots[0] != p.slots[0];
  // A large allreduce is pipelined: the negotiation thread reduces it into
  // the staging buffer chunk by chunk as it posts the chunks, and the job's
  // drain thread writes each reduced chunk back into the slots (CrossWork::
  // fill, drain). Nothing is left to pipeline when the ring runs in place
  // and needs no scaling; the device path keeps its own staging.
  const bool pipelined = op.error.isOk() && p.collective == CollectiveType::kAllreduce && !r.before_finish &&
                         opts_.cross_pipeline_bytes > 0 && p.bytes >= opts_.cross_pipeline_bytes &&
                         (!(p.in_place && p.postscale == 1.0) || copy_in);
  if (pipelined && !p.in_place) {
    p.shared_staging = staging::acquireShared(p.bytes);  // pooled: see common/staging_pool.h
  } else if (!p.in_place) {
    p.staging = staging::acquire(p.bytes);
  }
  p.report_dtype = static_cast<DataType>(d0.dtype);
  p.scratch = r.scratch;
  p.before_finish = r.before_finish;

  CrossWork w;
  w.req.name = op.name;
  w.req.params = d0;
  w.req.params.handle = 0;
  w.req.params.data_offset = w.req.params.out_offset = 0;
  w.req.params.flags = 0;  // device tensors staged through host look like host ones to the other agents
  w.req.params.device_event = 0;
  w.req.first_rank = job.globalRank(0);
  if (!op.error.isOk()) w.req.error = op.error.message();
  w.staging = p.in_place ? p.slots[0] : p.stagingData();
  if (pipelined) {
    if (copy_in) w.input = r.slots[0];  // the backend reads the input (no copy) when it goes in chunks
    if (!p.in_place || copy_in) {
      auto in = std::make_shared<LocalReduce>(r);
      in->dsts = {w.staging};
      in->postscale = 1.0;  // applied after the agents' reduction
      // (`in` keeps the sources alive: the arenas, and a joined ranks' zero
      // source in `scratch`; the lambda keeps the staging buffer.)
      w.fill = [in, keep = p.shared_staging](size_t b, size_t e) { reduceRange(*in, b, e - b); };
    }
    if (!(p.in_place && p.postscale == 1.0)) {  // (else the result is where it belongs)
      auto out = std::make_shared<LocalReduce>();
      out->dtype = r.dtype;
      out->op = ReduceOp::kSum;
      out->count = r.count;
      out->postscale = p.postscale;
      out->slots = {w.staging};
      out->dsts = p.slots;
      out->keepalive = p.keepalive;
      out->scratch = p.shared_staging;  // (null when in place)
      w.drain = [out](size_t b, size_t e) { reduceRange(*out, b, e - b); };
    }
  }
  w.count = op.error.isOk() ? r.count : 0;
  w.dtype = r.dtype;
  w.op = r.op;
  w.collective = static_cast<CollectiveType>(d0.collective);
  // Broadcast: the agent that hosts the root fills the staging buffer with
  // the root's slot; the others receive into it.
  int bcast_root_local = -1;
  if (w.collective == CollectiveType::kBroadcast) {
    w.root = job.world().crossRankOf(d0.root);
    bcast_root_local = d0.root - job.world().rank_offset;
    if (bcast_root_local < 0 || bcast_root_local >= job.localSize()) bcast_root_local = -1;
    if (w.count > 0 && w.root < 0) {
      w.count = 0;
      w.req.error = "broadcast of tensor '" + op.name + "': root rank " + std::to_string(d0.root) +
                    " is on no agent of this job";
    }
  }

  std::string job_id = job.id();
  uint64_t gen = job.cross_generation;
  const bool in_place = p.in_place;
  job.cross_pending.insert_or_assign(op.name, std::move(p));
  ++job.executing;
  timeline_->opStart(op.name, w.collective);
  if (w.count == 0 || (in_place && !copy_in) || pipelined ||
      (w.collective == CollectiveType::kBroadcast && bcast_root_local < 0)) {
    timeline_->activityStart(op.name, "NEGOTIATE_ACROSS_AGENTS");
    job.cross->submit(std::move(w));
    return;
  }
  if (w.collective == CollectiveType::kBroadcast) r.slots = {r.slots[bcast_root_local]};
  r.dsts = {w.staging};
  r.postscale = 1.0;  // applied after the agents' reduction
  timeline_->activityStart(op.name, "LOCAL_REDUCE");
  executor_.reduceOnLoop(std::move(r), [this, job_id, gen, w]() mutable {
    handToNegotiationOnLoop(job_id, gen, std::move(w));
  });
}

void Agent::handToNegotiationOnLoop(const std::string& job_id, uint64_t gen, CrossWork w) {
  timeline_->activityEnd(w.req.name);
  timeline_->activityStart(w.req.name, "NEGOTIATE_ACROSS_AGENTS");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  if (job.cross && job.cross_generation == gen && job.state() != JobState::kFailed) {
    job.cross->submit(std::move(w));
  } else {
    onCrossDoneOnLoop(job_id, gen, w.req.name, job.failure().isOk() ? aborted("job ended") : job.failure());
  }
}

void Agent::onCrossDoneOnLoop(const std::string& job_id, uint64_t generation, const std::string& name,
                              Status st, const CrossResult& result) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  // An op of an ended generation (elastic): its buffers are free now. (The
  // job may have no cross-agent backend in the new generation, so the
  // generation alone does not tell.)
  if (!job.retired.empty() && retiredDoneOnLoop(job, generation, name)) return;
  auto pit = job.cross_pending.find(name);
  if (pit == job.cross_pending.end()) return;
  auto p = std::make_shared<Job::CrossPending>(std::move(pit->second));
  job.cross_pending.erase(pit);
  --job.executing;
  if (p->collective == CollectiveType::kJoin) {
    timeline_->activityEnd(name);
    timeline_->opEnd(name, p->dtype, {});
    if (!st.isOk() && (st.code() == Code::kPeerFailure || st.code() == Code::kTimedOut)) {
      if (job.elastic.enabled()) {
        suspendOnLoop(job, st);
      } else {
        failJobOnLoop(job, st, true);
      }
    }
    onCrossJoinDoneOnLoop(job, *p, job.state() == JobState::kFailed ? job.failure() : st);
    maybeRemoveJobOnLoop(job_id);
    return;
  }
  if (!st.isOk()) {
    if (st.code() == Code::kPeerFailure || st.code() == Code::kTimedOut) {
      // Name the node behind "agent rank R".
      std::smatch m;
      std::string msg = st.message();
      if (std::regex_search(msg, m, std::regex("agent rank ([0-9]+)"))) {
        size_t r = std::stoul(m[1]);
        if (r < job.world().agents.size()) msg = "lost node " + job.world().agents[r] + ": " + msg;
      }
      st = Status(Code::kPeerFailure, "job " + job_id + ": " + msg);
      if (job.elastic.enabled()) {
        suspendOnLoop(job, st);
        st = job.suspended;
      } else {
        failJobOnLoop(job, st, true);
      }
    }
    timeline_->opEnd(name, p->dtype, {});
    finishOnLoop(job_id, p->handles, 0, job.state() == JobState::kFailed ? job.failure() : st, p->report_dtype, {},
                 p->collective);
    return;
  }
  if (p->collective == CollectiveType::kAlltoall) {  // a rank may receive rows without sending any
    timeline_->activityStart(name, "MEMCPY_OUT_FUSION_BUFFER");
    std::vector<LocalReduce> copies;
    for (const auto& c : p->copy_out) {
      if (c.bytes == 0) continue;
      LocalReduce r;
      r.dtype = DataType::kUint8;
      r.op = ReduceOp::kSum;
      r.count = c.bytes;
      r.slots = {p->staging.get() + c.src_off};
      r.dsts = {static_cast<char*>(p->slots[c.local_rank]) + c.dst_off};
      r.keepalive = p->keepalive;
      copies.push_back(std::move(r));
    }
    ++job.executing;
    copyAllOnLoop(std::move(copies), [this, job_id, p, name] {
      timeline_->activityEnd(name);
      timeline_->opEnd(name, p->report_dtype, {});
      auto it = jobs_.find(job_id);
      if (it != jobs_.end()) --it->second->executing;
      finishOnLoop(job_id, p->handles, p->bytes, okStatus(), p->report_dtype, p->started, p->collective);
    });
    return;
  }
  if (p->bytes == 0) {
    timeline_->opEnd(name, p->dtype, {});
    finishOnLoop(job_id, p->handles, 0, okStatus(), p->report_dtype, {}, p->collective);
    return;
  }
  const bool fused = result.data != nullptr && p->collective == CollectiveType::kAllreduce;
  if (result.drained || (p->in_place && !fused && p->postscale == 1.0)) {  // the result is already in the slots
    timeline_->opEnd(name, p->dtype, {});
    finishOnLoop(job_id, p->handles, p->bytes, okStatus(), p->report_dtype, p->started, p->collective);
    return;
  }
  timeline_->activityStart(name, "MEMCPY_OUT_FUSION_BUFFER");
  if (!p->scatter.empty()) {
    // Reducescatter: each local rank's block, scaled, into its output slot.
    const size_t es = dataTypeSize(p->dtype);
    std::vector<LocalReduce> copies;
    for (size_t i = 0; i < p->scatter.size(); ++i) {
      if (p->scatter[i].second == 0) continue;
      LocalReduce c;
      c.dtype = p->dtype;
      c.op = ReduceOp::kSum;
      c.count = p->scatter[i].second;
      c.postscale = p->postscale;
      c.slots = {p->staging.get() + p->scatter[i].first * es};
      c.dsts = {p->slots[i]};
      c.keepalive = p->keepalive;
      copies.push_back(std::move(c));
    }
    ++job.executing;
    copyAllOnLoop(std::move(copies), [this, job_id, p, name] {
      timeline_->activityEnd(name);
      timeline_->opEnd(name, p->dtype, {});
      auto it = jobs_.find(job_id);
      if (it != jobs_.end()) --it->second->executing;
      finishOnLoop(job_id, p->handles, p->bytes, okStatus(), p->report_dtype, p->started, p->collective);
    });
    return;
  }
  LocalReduce r;
  r.dtype = p->dtype;
  r.op = ReduceOp::kSum;
  r.count = p->count;
  r.prescale = 1.0;
  r.postscale = p->postscale;
  r.slots = {p->in_place ? p->slots[0] : p->stagingData()};
  r.dsts = p->slots;
  r.keepalive = p->keepalive;
  if (fused) {
    // A fused allreduce: the result is read from the fused buffer itself
    // (no copy back into the staging buffer first).
    r.slots = {const_cast<void*>(result.data)};
    r.scratch = result.keep;
  }
  ++job.executing;
  executor_.reduceOnLoop(std::move(r), [this, job_id, p, name] {
    timeline_->activityEnd(name);
    timeline_->opEnd(name, p->dtype, {});
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) --it->second->executing;
    Status st = p->before_finish ? p->before_finish() : okStatus();
    finishOnLoop(job_id, p->handles, p->bytes, st, p->report_dtype, p->started, p->collective);
  });
}

}  // namespace kolo
