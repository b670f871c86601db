// Device memory (docs/gpu.md): the reduction kernel over the ranks' device
// slots on one GPU, enqueued behind their in_ready events (allreduces fused
// with the others ready in the same pass: device_fusion.h); the completion
// goes out at once (the clients' streams wait on out_ready). Across agents
// it goes over the generation's NCCL communicator when the agents chose it
// (device_cross_nccl.cc), else it is staged through host memory and crosses
// as an allreduce or a broadcast on the host path (runCrossLegOnLoop). An op the device path
// refuses (or that failed before it ran) is announced as on the host path.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "agent/core/device_runtime.h"
#include "agent/core/shm_meta.h"
#include "agent/cross/cross_job.h"
#include "agent/gpu/device_ipc.h"
#include "agent/ipc/client_conn.h"
#include "agent/ops/device_cross_nccl.h"
#include "agent/ops/device_fusion.h"
#include "agent/ops/device_several.h"
#include "agent/ops/memory.h"
#include "agent/ops/op.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"

namespace kolo {

namespace {

bool isLayoutCollective(CollectiveType c) {
  return c == CollectiveType::kAllgather || c == CollectiveType::kReducescatter ||
         c == CollectiveType::kAlltoall;
}

// Allgather, reducescatter, alltoall (docs/gpu.md): every rank of the job
// on this agent and GPU; the output regions after the host path's header
// room, and the host copy of the header every local rank's validation took
// (the first local rank's; the op types check they agree).
Status describeLayoutOp(const Job& job, const ReadyOp& op, gpu::DeviceRoute route,
                        DeviceLocalOp* dop) {
  const SubmitDesc& d0 = op.descs[0];
  const auto coll = static_cast<CollectiveType>(d0.collective);
  const std::string what =
      std::string(collectiveName(coll)) + " of device tensor '" + op.name + "'";
  const int world = job.worldSize();
  // Across agents: over the generation's NCCL communicator
  // (device_cross_nccl.cc); staged through host memory, not yet.
  // Several GPUs of one agent: runSeveralGpusOnLoop refuses these
  // collectives with its own text (naming the GPUs).
  const bool nccl_cross = route == gpu::DeviceRoute::kNcclCross;
  const bool one_agent =
      route == gpu::DeviceRoute::kLocalKernel || route == gpu::DeviceRoute::kSeveralGpus;
  if (!nccl_cross && (!one_agent || world != job.localSize())) {
    return invalidArgument(what +
                           ": device tensors of this collective are wired for the ranks of " +
                           "one agent only so far (this job has " + std::to_string(world) +
                           " ranks, " + std::to_string(job.localSize()) + " of them here)" +
                           "; across agents they go over NCCL only (--device-cross=auto or "
                           "nccl, every agent with NCCL), else copy the tensor to the host");
  }
  dop->collective = coll;
  dop->name = op.name;
  dop->dim0 = d0.ndim >= 1 ? d0.shape[0] : 0;
  dop->row_bytes = rowBytesOf(d0);
  const uint64_t prefix = coll == CollectiveType::kAllgather  ? allgatherSizesBytes(world)
                          : coll == CollectiveType::kAlltoall ? alltoallSplitsBytes(world)
                                                              : 0;
  for (size_t i = 0; i < op.descs.size(); ++i) {
    const SubmitDesc& d = op.descs[i];
    if (d.out_bytes < prefix) return internalError(what + ": an output region without its header");
    dop->out_offsets.push_back(d.out_offset + prefix);
    if (i > 0 && std::memcmp(d.shape + 1, d0.shape + 1, sizeof(int64_t) * (kMaxDims - 1)) != 0 &&
        coll != CollectiveType::kReducescatter) {
      return invalidArgument(what + ": the ranks' tensors differ beyond the first dimension");
    }
  }
  if (coll != CollectiveType::kReducescatter) {
    if (op.metas.empty()) return internalError(what + ": no header copy");
    dop->meta = op.metas[0];
    for (size_t i = 1; i < op.metas.size(); ++i) {
      if (op.metas[i] != dop->meta) {
        return invalidArgument(
            what + ": local ranks 0 and " + std::to_string(i) + " list different " +
            (coll == CollectiveType::kAllgather ? "first dimensions" : "split matrices"));
      }
    }
  }
  return okStatus();
}

class DeviceMemory final : public OpMemory {
 public:
  const char* name() const override { return "device"; }
  void runOnLoop(OpHost& host, Job& job, const CollectiveOp* kind, ReadyOp op,
                 std::vector<uint64_t> handles) const override;

 private:
  // Staged through host memory: on a worker (it waits for the trainers'
  // copies), the k slots are reduced into slot 0 and copied to a host
  // buffer; then the host path across agents; then, before the
  // completions, the result goes back into every slot with out_ready.
  static void stageCrossOnLoop(OpHost& host, Job& job, ReadyOp op, const DeviceLocalOp& dop,
                               std::vector<std::shared_ptr<DeviceGrant>> hold,
                               std::vector<uint64_t> handles);
};

void DeviceMemory::runOnLoop(OpHost& host, Job& job, const CollectiveOp* kind, ReadyOp op,
                             std::vector<uint64_t> handles) const {
  if (!op.error.isOk())
    return hostMemory().runOnLoop(host, job, kind, std::move(op), std::move(handles));
  std::vector<bool> flags;
  std::vector<int> gpus;
  gpu::DevicePlan plan;
  if (op.anyAbsent()) {
    plan.why =
        "tensor '" + op.name + "': device tensors with joined ranks (kolo_join) are not wired yet";
  } else {
    for (size_t i = 0; i < op.descs.size(); ++i) {
      ClientConn* c = job.client(static_cast<int>(i));
      flags.push_back(gpu::isDevice(op.descs[i]));
      gpus.push_back(c != nullptr && c->device ? c->device->device() : -1);
    }
    plan = gpu::planDeviceOp(op.name, flags, gpus, job.world().cross_size);
  }
  if (plan.route == gpu::DeviceRoute::kStagedCross && job.cross) {
    // The generation's device-cross choice (agent/core/nccl_comm.h).
    const gpu::DeviceCrossChoice& c = job.cross->deviceCross();
    if (c.kind == gpu::DeviceCrossChoiceKind::kNccl) plan.route = gpu::DeviceRoute::kNcclCross;
    if (c.kind == gpu::DeviceCrossChoiceKind::kFail) {
      op.error = unavailable("device tensor '" + op.name + "': " + c.why);
      return hostMemory().runOnLoop(host, job, kind, std::move(op), std::move(handles));
    }
  }
  if (plan.route == gpu::DeviceRoute::kRefuse) {
    op.error = invalidArgument(plan.why);  // and the other agents learn of it on the host path
    return hostMemory().runOnLoop(host, job, kind, std::move(op), std::move(handles));
  }
  const SubmitDesc& d0 = op.descs[0];
  const auto coll = static_cast<CollectiveType>(d0.collective);
  DeviceLocalOp dop;
  dop.dtype = static_cast<DataType>(d0.dtype);
  auto rop = static_cast<ReduceOp>(d0.reduce_op);
  dop.op = rop == ReduceOp::kAverage ? ReduceOp::kSum : rop;
  dop.count = d0.data_bytes / dataTypeSize(dop.dtype);
  dop.prescale = d0.prescale;
  dop.postscale =
      (rop == ReduceOp::kAverage ? d0.postscale / job.world().world_size : d0.postscale);
  if (coll == CollectiveType::kBroadcast) {
    dop.broadcast = true;
    dop.broadcast_root = d0.root - job.world().rank_offset;
    if (dop.broadcast_root < 0 || dop.broadcast_root >= job.localSize())
      dop.broadcast_root = -1;  // elsewhere
  }
  std::vector<std::shared_ptr<DeviceGrant>> hold;
  for (size_t i = 0; i < op.descs.size(); ++i) {
    ClientConn* c = job.client(static_cast<int>(i));
    hold.push_back(c->device);
    dop.grants.push_back(c->device.get());
    dop.offsets.push_back(op.descs[i].data_offset);
    dop.events.push_back(op.descs[i].device_event);
  }
  if (isLayoutCollective(coll)) {
    Status ready = describeLayoutOp(job, op, plan.route, &dop);
    if (!ready.isOk()) {
      op.error = ready;  // and the other agents learn of it on the host path
      return hostMemory().runOnLoop(host, job, kind, std::move(op), std::move(handles));
    }
  }
  if (plan.route == gpu::DeviceRoute::kSeveralGpus) {
    return runSeveralGpusOnLoop(host, job, std::move(op), std::move(dop), std::move(hold),
                                std::move(handles));
  }
  if (plan.route == gpu::DeviceRoute::kNcclCross) {
    return runNcclCrossOnLoop(host, job, std::move(op), dop, std::move(hold), std::move(handles));
  }
  if (plan.route == gpu::DeviceRoute::kStagedCross) {
    return stageCrossOnLoop(host, job, std::move(op), dop, std::move(hold), std::move(handles));
  }
  if (coll == CollectiveType::kAllreduce) {  // fused with the others of this pass, if any
    return queueDeviceFusionOnLoop(
        host, job, DeviceFusionItem{std::move(op), dop, std::move(hold), std::move(handles)});
  }
  runDeviceLocalOnLoop(host, job, op, dop, handles);
}

void DeviceMemory::stageCrossOnLoop(OpHost& host, Job& job, ReadyOp op, const DeviceLocalOp& dop,
                                    std::vector<std::shared_ptr<DeviceGrant>> hold,
                                    std::vector<uint64_t> handles) {
  const uint64_t bytes = op.descs[0].data_bytes;
  auto sop = std::make_shared<ReadyOp>(std::move(op));
  InFlight in_flight = job.beginExecuting();
  std::string job_id = job.id();
  const int k = job.localSize();
  OpHost* h = &host;
  // Filled on the staging thread: pinned, so the copy out of the GPU is
  // asynchronous and its deadline fires (device_staging.h).
  auto staged = std::make_shared<std::shared_ptr<char>>();
  const OpHost::DeviceStaging limits = host.deviceStaging();
  host.stageDeviceThenOnLoop(
      [dop, staged, hold, bytes, limits]() -> Status {
        ASSIGN_OR_RETURN(*staged, deviceRuntime().stagingBuffer(dop, bytes));
        return deviceRuntime().stageToHost(dop, staged->get(), limits.timeout_ms, limits.cancel);
      },
      [h, in_flight, dop, staged_at = staged, hold, sop, handles, job_id, k,
       bytes](Status st) mutable {
        std::shared_ptr<char> staged = std::move(*staged_at);
        Job* j = h->opJobOnLoop(job_id);
        if (j == nullptr) return;
        in_flight.end();
        if (j->state() == JobState::kFailed || !j->cross) {
          h->finishOpOnLoop(job_id, handles, 0,
                            j->failure().isOk() ? aborted("the job ended") : j->failure(),
                            DataType::kFloat32, {}, CollectiveType::kAllreduce);
          return;
        }
        if (!st.isOk()) {
          sop->error = st.withContext("device tensor '" + sop->name + "' staged to the host");
          // The agents' exchange still runs and fails with this error on
          // every rank; without a pinned buffer it gets a host one.
          if (staged == nullptr) {
            staged = std::shared_ptr<char>(new char[bytes + 64](), std::default_delete<char[]>());
          }
        }
        // Allreduce: one source (the GPU already reduced the k ranks), the
        // postscale after the agents' reduction. Broadcast: a byte copy (as
        // on the host path), slots indexed by local rank.
        const bool bcast = dop.broadcast;
        LocalReduce r;
        r.dtype = bcast ? DataType::kUint8 : dop.dtype;
        r.op = bcast ? ReduceOp::kSum : dop.op;
        r.count = bcast ? dop.count * dataTypeSize(dop.dtype) : dop.count;
        r.prescale = 1.0;  // applied on the GPU
        r.postscale = bcast ? 1.0 : dop.postscale;
        r.slots = bcast ? std::vector<void*>(static_cast<size_t>(k), staged.get())
                        : std::vector<void*>{staged.get()};
        r.scratch = staged;
        r.before_finish = [dop, staged, hold]() {
          return deviceRuntime().stageFromHost(dop, staged.get());
        };
        runCrossLegOnLoop(*h, *j, std::move(*sop), std::move(r), handles);
      });
}

}  // namespace

const OpMemory& deviceMemory() {
  static const DeviceMemory memory;
  return memory;
}

}  // namespace kolo
