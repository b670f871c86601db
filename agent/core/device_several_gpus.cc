#include "agent/core/device_several_gpus.h"

#include <string>
#include <vector>

#include "agent/core/device_grant.h"

namespace kolo {

namespace {
SeamGrant* seam(DeviceGrant* g) { return static_cast<SeamGrant*>(g); }
}  // namespace

struct SeveralGpus::Group {
  int gpu = -1;
  void* s = nullptr;         // the GPU's agent stream
  std::vector<void*> slots;  // the group's ranks' slots
  std::vector<int> ranks;
  void* src = nullptr;  // where the group's result is after the step across GPUs
};

StatusOr<gpu::DevEvent*> SeveralGpus::link(gpu::DeviceApi& api, int gpu) {
  auto& e = links_[gpu];
  if (!e) {
    RETURN_IF_ERROR(api.setDevice(gpu));
    ASSIGN_OR_RETURN(e, api.createEvent(false));
  }
  return e.get();
}

// The other GPUs copied from `source`'s slot on their streams: its stream
// waits for those copies, so its ranks' out_ready (recorded after) does not
// let a trainer reuse the slot while a peer still reads it.
Status SeveralGpus::leaderWaitsForCopies(gpu::DeviceApi& api, std::vector<Group>& groups,
                                         int source) {
  for (size_t i = 0; i < groups.size(); ++i) {
    if (static_cast<int>(i) == source) continue;
    ASSIGN_OR_RETURN(gpu::DevEvent * e, link(api, groups[i].gpu));
    RETURN_IF_ERROR(api.setDevice(groups[i].gpu));
    RETURN_IF_ERROR(e->record(groups[i].s));
    RETURN_IF_ERROR(e->streamWait(groups[source].s));
  }
  return okStatus();
}

Status SeveralGpus::enqueue(gpu::DeviceApi& api, const DeviceLocalOp& op,
                            const gpu::GpuGroupPlan& plan, nccl::NodeComm* comm) {
  const size_t k = op.grants.size();
  if (k == 0 || op.offsets.size() != k || op.events.size() != k)
    return internalError("device op without ranks");
  if (op.collective != CollectiveType::kAllreduce) {
    return invalidArgument(std::string(collectiveName(op.collective)) + " of device tensor '" +
                           op.name +
                           "': device tensors of this collective are wired for ranks on one GPU "
                           "only so far (these are on " +
                           std::to_string(plan.groups.size()) + " GPUs)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Group> groups;
  Status st;
  for (const gpu::GpuGroup& pg : plan.groups) {
    if (pg.ranks.size() > static_cast<size_t>(gpu::kMaxDeviceSources)) {
      st = invalidArgument("device tensors of " + std::to_string(pg.ranks.size()) +
                           " ranks on one GPU: at most " + std::to_string(gpu::kMaxDeviceSources) +
                           " are wired");
      break;
    }
    Group g;
    g.gpu = pg.gpu;
    g.ranks = pg.ranks;
    for (int r : pg.ranks) {
      SeamGrant* gr = seam(op.grants[r]);
      if (gr->ctx_->device != pg.gpu)
        return internalError("a rank's grant is not on its group's GPU");
      g.s = gr->ctx_->s();
      g.slots.push_back(gr->slot(op.offsets[r]));
    }
    groups.push_back(std::move(g));
  }
  // Every rank's in_ready on its GPU's stream.
  for (Group& g : groups) {
    if (!st.isOk()) break;
    st = api.setDevice(g.gpu);
    for (size_t j = 0; j < g.ranks.size() && st.isOk(); ++j)
      st = seam(op.grants[g.ranks[j]])->in_.at(op.events[g.ranks[j]])->streamWait(g.s);
  }
  if (st.isOk() && op.count > 0)
    st =
        op.broadcast ? broadcast(api, op, plan, groups, comm) : reduce(api, op, plan, groups, comm);
  // Every slot from its group's result, then every out_ready: after whatever was
  // enqueued, even after a failed step (a client's copy-out stays behind it).
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  for (Group& g : groups) {
    Status dev = api.setDevice(g.gpu);
    if (!dev.isOk() && st.isOk()) st = dev;
    for (size_t j = 0; j < g.slots.size() && st.isOk() && bytes > 0; ++j) {
      if (g.slots[j] != g.src) st = api.copyAsync(g.slots[j], g.src, bytes, g.s);
    }
    for (int r : g.ranks) {
      Status rec = seam(op.grants[r])->out_.at(op.events[r])->record(g.s);
      if (!rec.isOk() && st.isOk()) st = rec;
    }
  }
  return st;
}

Status SeveralGpus::reduce(gpu::DeviceApi& api, const DeviceLocalOp& op,
                           const gpu::GpuGroupPlan& plan, std::vector<Group>& groups,
                           nccl::NodeComm* comm) {
  // Each GPU's ranks into its first slot, with the prescale.
  for (Group& g : groups) {
    g.src = g.slots[0];
    if (g.slots.size() == 1 && op.prescale == 1.0) continue;
    RETURN_IF_ERROR(api.setDevice(g.gpu));
    RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, g.slots.data(),
                                     static_cast<int>(g.slots.size()), &g.slots[0], 1, op.count,
                                     op.prescale, 1.0, g.s));
  }
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  if (plan.route == gpu::NodeRoute::kPeerKernel) {
    Group& lead = groups[0];
    std::vector<const void*> srcs;
    for (Group& g : groups) srcs.push_back(g.slots[0]);
    for (size_t i = 1; i < groups.size(); ++i) {
      ASSIGN_OR_RETURN(gpu::DevEvent * e, link(api, groups[i].gpu));
      RETURN_IF_ERROR(api.setDevice(groups[i].gpu));
      RETURN_IF_ERROR(e->record(groups[i].s));
      RETURN_IF_ERROR(e->streamWait(lead.s));
    }
    RETURN_IF_ERROR(api.setDevice(lead.gpu));
    void* out = lead.slots[0];
    RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, srcs.data(), static_cast<int>(srcs.size()),
                                     &out, 1, op.count, 1.0, op.postscale, lead.s));
    ASSIGN_OR_RETURN(gpu::DevEvent * done, link(api, lead.gpu));
    RETURN_IF_ERROR(done->record(lead.s));
    for (size_t i = 1; i < groups.size(); ++i) {
      RETURN_IF_ERROR(api.setDevice(groups[i].gpu));
      RETURN_IF_ERROR(done->streamWait(groups[i].s));
      RETURN_IF_ERROR(api.copyAsync(groups[i].slots[0], out, bytes, groups[i].s));  // P2P
    }
    return leaderWaitsForCopies(api, groups, 0);
  }
  if (comm == nullptr) return internalError("several GPUs without peer access and no communicator");
  std::vector<void*> bufs, streams;
  for (Group& g : groups) {
    bufs.push_back(g.slots[0]);
    streams.push_back(g.s);
  }
  RETURN_IF_ERROR(comm->allreduce(bufs, streams, op.count, op.dtype, op.op));
  if (op.postscale == 1.0) return okStatus();
  for (Group& g : groups) {
    RETURN_IF_ERROR(api.setDevice(g.gpu));
    RETURN_IF_ERROR(api.launchReduce(op.dtype, op.op, &g.src, 1, &g.slots[0], 1, op.count, 1.0,
                                     op.postscale, g.s));
  }
  return okStatus();
}

Status SeveralGpus::broadcast(gpu::DeviceApi& api, const DeviceLocalOp& op,
                              const gpu::GpuGroupPlan& plan, std::vector<Group>& groups,
                              nccl::NodeComm* comm) {
  const int root_group = plan.groupOf(op.broadcast_root);
  if (root_group < 0) return internalError("broadcast root is not a local rank");
  Group& rg = groups[root_group];
  void* root_slot = nullptr;
  for (size_t j = 0; j < rg.ranks.size(); ++j) {
    if (rg.ranks[j] == op.broadcast_root) root_slot = rg.slots[j];
  }
  for (Group& g : groups) g.src = &g == &rg ? root_slot : g.slots[0];
  const size_t bytes = op.count * dataTypeSize(op.dtype);
  if (plan.route == gpu::NodeRoute::kPeerKernel) {
    ASSIGN_OR_RETURN(gpu::DevEvent * e, link(api, rg.gpu));
    RETURN_IF_ERROR(api.setDevice(rg.gpu));
    RETURN_IF_ERROR(e->record(rg.s));
    for (Group& g : groups) {
      if (&g == &rg) continue;
      RETURN_IF_ERROR(api.setDevice(g.gpu));
      RETURN_IF_ERROR(e->streamWait(g.s));
      RETURN_IF_ERROR(api.copyAsync(g.src, root_slot, bytes, g.s));  // P2P
    }
    return leaderWaitsForCopies(api, groups, root_group);
  }
  if (comm == nullptr) return internalError("several GPUs without peer access and no communicator");
  std::vector<void*> bufs, streams;
  for (Group& g : groups) {
    bufs.push_back(g.src);
    streams.push_back(g.s);
  }
  return comm->broadcast(bufs, streams, bytes, root_group);
}

}  // namespace kolo
