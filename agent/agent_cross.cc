// Jobs that span several agents: backend set-up, and the cross-agent leg of
// an allreduce or broadcast (local reduce into a staging buffer or in place,
// agent/ops/cross_plan.h; negotiated collective among agents); when it comes
// back, failures here and the copy into the slots by the op type
// (CollectiveOp::finishCrossOnLoop).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>

#include "agent/agent.h"
#include "agent/backends/backend_choice.h"
#include "agent/coord/coord_kv_store.h"
#include "agent/core/nccl_comm.h"
#include "agent/ops/cross_plan.h"
#include "agent/ops/op.h"
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
  bo.name = job.id() + "/g" + std::to_string(w.generation);
  std::string job_id = job.id(), token = job.token(), setting = opts_.backend_name;
  uint64_t gen = w.generation;
  job.cross_backend.clear();
  job.cross_backend_reason.clear();
  crossLog()->info("job {}: connecting to {} other agents (backend {})", job_id, w.cross_size - 1,
                   setting);
  // How its device tensors cross agents: chosen by every agent alike, with
  // the NCCL communicator made here when chosen (agent/core/nccl_comm.h).
  DeviceCrossRequest dreq = deviceCrossRequestFor(job, opts_.device_cross, bo.timeout);
  setup_pool_.submit([this, job_id, token, bo, gen, setting, dreq]() mutable {
    CoordKvStore kv(*coord_, job_id, token);
    // Every agent states its setting and what its node offers; all take the
    // same backend before the first connection (backend_choice.h).
    const std::string gen_prefix = "g" + std::to_string(gen);
    const std::vector<std::string> compiled = compiledBackends();
    const bool ucx = std::find(compiled.begin(), compiled.end(), "ucx") != compiled.end();
    auto choice = std::make_shared<StatusOr<BackendChoice>>(
        agreeBackendOverKv(kv, gen_prefix + "/backend-offer", bo.rank, bo.size,
                           localBackendOffer(setting, ucx), bo.timeout));
    auto made = std::make_shared<StatusOr<std::unique_ptr<Backend>>>(
        choice->isOk() ? StatusOr<std::unique_ptr<Backend>>(unavailable("not tried"))
                       : StatusOr<std::unique_ptr<Backend>>(choice->status()));
    if (choice->isOk()) {
      bo.key_prefix = gen_prefix + "/" + choice->value().backend;
      crossLog()->info("job {}: backend {} ({})", job_id, choice->value().backend,
                       choice->value().reason);
      *made = createBackend(choice->value().backend, bo, kv);
    }
    auto device = std::make_shared<StatusOr<DeviceCrossSetup>>(unavailable("not tried"));
    if (made->isOk()) *device = setUpDeviceCross(dreq, kv);
    loop_.post([this, job_id, gen, made, choice, device] {
      auto it = jobs_.find(job_id);
      if (it == jobs_.end() || it->second->cross_generation != gen) return;
      Job& job = *it->second;
      if (choice->isOk()) {
        job.cross_backend = choice->value().backend;
        job.cross_backend_reason = choice->value().reason;
      }
      if (!made->isOk()) {
        Status st = made->status().withContext("job " + job_id + ": cannot connect the agents");
        if (job.elastic.enabled())
          return suspendOnLoop(job, st);  // the next generation may do better
        failJobOnLoop(job, st, true);
        return;
      }
      if (job.state() == JobState::kFailed) return;
      CrossJobOptions co;
      // The job's own settings (its trainers' environment) over the agent's.
      const JobSettings& js = job.settings;
      co.cache_capacity = js.cache_capacity.value_or(opts_.cache_capacity);
      co.idle_cycle = std::chrono::milliseconds(opts_.idle_cycle_ms);
      co.spin = std::chrono::microseconds(opts_.spin_us);
      co.collective_timeout = opts_.backend.timeout;
      co.fusion_threshold_bytes = js.fusion_threshold_bytes.value_or(opts_.fusion_threshold_bytes);
      co.small_message_bytes = opts_.backend.small_message_bytes;
      co.fusion_chunk_bytes = opts_.fusion_chunk_bytes;
      co.fusion_max_tensor_bytes = opts_.fusion_max_tensor_bytes;
      co.inline_bytes = opts_.cross_inline_bytes;
      co.pipeline_bytes = opts_.cross_pipeline_bytes;
      if (js.autotune.value_or(opts_.autotune)) {
        co.autotune = autotuneOptionsFor(opts_, job_id);
        if (js.fusion_threshold_bytes && co.autotune->fixed_fusion_threshold_mb) {
          co.autotune->fixed_fusion_threshold_mb = static_cast<double>(*js.fusion_threshold_bytes) / (1 << 20);
        }
      }
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
      if (device->isOk()) {
        job.cross->setDeviceCross(std::move(device->value().choice),
                                  std::move(device->value().nccl));
      } else {  // the KV store failed: every device op of the job says so
        job.cross->setDeviceCross(
            {gpu::DeviceCrossChoiceKind::kFail,
             "the device-cross choice failed: " + device->status().toString()},
            nullptr);
      }
      crossLog()->info("job {}: agents connected; {} local ranks may start", job_id, job.localSize());
      maybeSendWorldOnLoop(job);
    });
  });
}

void Agent::executeCrossOnLoop(Job& job, ReadyOp op, LocalReduce r, std::vector<uint64_t> handles) {
  runCrossLegOnLoop(*this, job, std::move(op), std::move(r), std::move(handles));
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
  p->in_flight.end();
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
    if (p->device_finish) (void)p->device_finish(false);  // out_ready after what was enqueued
    timeline_->opEnd(name, p->dtype, {});
    finishOnLoop(job_id, p->handles, 0, job.state() == JobState::kFailed ? job.failure() : st, p->report_dtype, {},
                 p->collective);
    return;
  }
  if (p->device_finish) {  // device tensors over NCCL: the result is in slot 0 on the GPU
    Status fs = p->device_finish(true);
    timeline_->opEnd(name, p->dtype, {});
    finishOnLoop(job_id, p->handles, fs.isOk() ? p->bytes : 0, fs, p->report_dtype, p->started,
                 p->collective);
    return;
  }
  // The result into the ranks' slots, as the op type does it (agent/ops/).
  const CollectiveOp* kind = collectiveOp(p->collective);
  (kind != nullptr ? *kind : allreduceOp()).finishCrossOnLoop(*this, job, name, p, result);
}

}  // namespace kolo
