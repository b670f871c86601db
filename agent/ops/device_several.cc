#include "agent/ops/device_several.h"

#include <algorithm>
#include <string>

#include "agent/core/job.h"
#include "agent/gpu/device_api.h"
#include "agent/gpu/gpu_groups.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"

namespace kolo {

namespace {
constexpr int64_t kNodeCommTimeoutMs = 60'000;  // NCCL's initialisation, at most
}

void runSeveralGpusOnLoop(OpHost& host, Job& job, ReadyOp op, DeviceLocalOp dop,
                          std::vector<std::shared_ptr<DeviceGrant>> hold,
                          std::vector<uint64_t> handles) {
  const SubmitDesc& d0 = op.descs[0];
  const auto coll = static_cast<CollectiveType>(d0.collective);
  std::vector<int> gpus;
  for (DeviceGrant* g : dop.grants) gpus.push_back(g->device());
  DeviceRuntime& rt = deviceRuntime();
  auto plan = gpu::planGpuGroups(
      op.name, gpus, [&rt](int a, int b) { return rt.canAccessPeer(a, b); }, rt.nodeNcclBuilt(),
      gpu::kMaxDeviceSources);
  auto logged = [&](const Status& st) {
    if (!st.isOk())
      log::get("agent.ops")->warn("job {}: device op '{}': {}", job.id(), op.name, st.message());
  };
  if (!plan.isOk()) {
    logged(plan.status());
    return host.finishOpOnLoop(job.id(), handles, 0, plan.status(), dop.dtype, op.first_arrival,
                               coll);
  }
  if (plan->route == gpu::NodeRoute::kPeerKernel) {
    host.opTimeline().opStart(op.name, coll);
    Status st = rt.enqueueSeveralGpus(dop, *plan, "", 0);
    host.opTimeline().opEnd(
        op.name, dop.dtype,
        std::vector<int64_t>(d0.shape, d0.shape + std::min<int>(d0.ndim, kMaxDims)));
    logged(st);
    return host.finishOpOnLoop(job.id(), handles, d0.data_bytes, st, dop.dtype, op.first_arrival,
                               coll);
  }
  // Node-local NCCL: its communicator may have to be created (blocking).
  const std::string key = job.id() + "\n" + std::to_string(job.world().generation) + "\n";
  const int64_t timeout = std::min(host.deviceStaging().timeout_ms, kNodeCommTimeoutMs);
  InFlight in_flight = job.beginExecuting();
  OpHost* h = &host;
  auto shared_plan = std::make_shared<gpu::GpuGroupPlan>(std::move(*plan));
  host.stageDeviceThenOnLoop(
      [dop, shared_plan, key, timeout, hold]() {
        return deviceRuntime().enqueueSeveralGpus(dop, *shared_plan, key, timeout);
      },
      [h, in_flight, job_id = job.id(), name = op.name, handles, bytes = d0.data_bytes,
       dtype = dop.dtype, started = op.first_arrival, coll, hold](Status st) mutable {
        in_flight.end();
        if (!st.isOk())
          log::get("agent.ops")->warn("job {}: device op '{}': {}", job_id, name, st.message());
        h->finishOpOnLoop(job_id, handles, bytes, st, dtype, started, coll);
      });
}

}  // namespace kolo
