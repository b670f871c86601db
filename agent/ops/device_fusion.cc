// Device Tensor Fusion on one agent (device_fusion.h).
#include "agent/ops/device_fusion.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "agent/fusion/fusion_planner.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"

namespace kolo {

namespace {

auto fusionLog() { return log::get("agent.device.fusion"); }

// The queued ops per (agent, job). Loop thread only; the lock only keeps
// two agents of one process (in-process tests) apart.
struct Pending {
  std::mutex mu;
  std::map<std::pair<OpHost*, std::string>, std::vector<DeviceFusionItem>> items;
};
Pending& pending() {
  static Pending* p = new Pending;  // used until exit
  return *p;
}

std::vector<int64_t> shapeOf(const SubmitDesc& d) {
  return std::vector<int64_t>(d.shape, d.shape + std::min<int>(d.ndim, kMaxDims));
}

fusion::FusionEntry entryOf(const DeviceFusionItem& it) {
  fusion::FusionEntry e;
  e.name = it.op.name;
  e.collective = CollectiveType::kAllreduce;
  e.dtype = it.dop.dtype;
  e.reduce_op = it.dop.op;  // Average is Sum here, its 1/size in the postscale
  e.prescale = it.dop.prescale;
  e.postscale = it.dop.postscale;
  e.device = it.dop.grants.empty() ? -1 : it.dop.grants[0]->device();
  e.bytes = it.dop.count * dataTypeSize(it.dop.dtype);
  return e;
}

std::string offsetsText(const std::vector<DeviceFusionItem*>& items,
                        const std::vector<uint64_t>& offsets) {
  std::string s;
  for (size_t j = 0; j < items.size(); ++j) {
    if (j > 0) s += ' ';
    s += items[j]->op.name + "@" + std::to_string(offsets[j]);
  }
  return s;
}

// One fused cycle: the timeline (DEVICE_FUSED_ALLREDUCE on every member,
// with the group's size and the member's offset), the enqueue, the
// completions.
void runFusedOnLoop(OpHost& host, Job& job, std::vector<DeviceFusionItem*> items,
                    const fusion::FusedGroup& g) {
  timeline::Timeline& tl = host.opTimeline();
  std::vector<DeviceLocalOp> ops;
  std::vector<uint64_t> offsets;
  for (size_t j = 0; j < items.size(); ++j) {
    ops.push_back(items[j]->dop);
    offsets.push_back(g.slots[j].offset);
    tl.opStart(items[j]->op.name, CollectiveType::kAllreduce);
    tl.activityStart(items[j]->op.name, "DEVICE_FUSED_ALLREDUCE",
                     {{"fused", std::to_string(items.size())},
                      {"offset", std::to_string(g.slots[j].offset)},
                      {"buffer_bytes", std::to_string(g.buffer_bytes)}});
  }
  auto n = deviceRuntime().enqueueFused(ops, offsets, g.buffer_bytes);
  const Status st = n.status();
  if (st.isOk()) {
    fusionLog()->debug(
        "device fusion: job {}: {} allreduces of {} fused, {} bytes per rank, {} ranks: {} "
        "reduce launch, {} batched copy launches; offsets {}",
        job.id(), items.size(), dataTypeName(ops[0].dtype), g.buffer_bytes, ops[0].grants.size(),
        n->reduce, n->batched_copy, offsetsText(items, offsets));
  } else {
    log::get("agent.ops")
        ->warn("job {}: fused device allreduce of {} tensors ('{}' first): {}", job.id(),
               items.size(), items[0]->op.name, st.message());
  }
  for (DeviceFusionItem* it : items) {
    tl.activityEnd(it->op.name);
    tl.opEnd(it->op.name, it->dop.dtype, shapeOf(it->op.descs[0]));
  }
  const std::string job_id = job.id();
  for (DeviceFusionItem* it : items) {
    host.finishOpOnLoop(job_id, it->handles, it->op.descs[0].data_bytes, st, it->dop.dtype,
                        it->op.first_arrival, CollectiveType::kAllreduce);
  }
}

void flushOnLoop(OpHost& host, const std::string& job_id) {
  std::vector<DeviceFusionItem> items;
  {
    Pending& p = pending();
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.items.find({&host, job_id});
    if (it == p.items.end()) return;
    items = std::move(it->second);
    p.items.erase(it);
  }
  Job* job = host.opJobOnLoop(job_id);
  if (job == nullptr) return;  // its clients are gone: nobody to complete
  std::vector<fusion::FusionEntry> entries;
  for (const DeviceFusionItem& it : items) entries.push_back(entryOf(it));
  fusion::FusionOptions fo;
  fo.threshold_bytes = job->settings.fusion_threshold_bytes.value_or(host.fusionThresholdBytes());
  const auto groups = fusion::planFusion(entries, fo);
  timeline::Timeline& tl = host.opTimeline();
  bool marked = false;
  for (const fusion::FusedGroup& g : groups) {
    // finishOpOnLoop may remove the job once nothing is left of it.
    job = host.opJobOnLoop(job_id);
    if (job == nullptr) return;
    if (!g.fused()) {
      const DeviceFusionItem& it = items[g.slots[0].index];
      runDeviceLocalOnLoop(host, *job, it.op, it.dop, it.handles);
      continue;
    }
    if (!marked && tl.markCycles()) tl.markCycleStart();
    marked = true;
    std::vector<DeviceFusionItem*> members;
    for (const fusion::FusedSlot& s : g.slots) members.push_back(&items[s.index]);
    runFusedOnLoop(host, *job, std::move(members), g);
  }
}

}  // namespace

void queueDeviceFusionOnLoop(OpHost& host, Job& job, DeviceFusionItem item) {
  bool first = false;
  {
    Pending& p = pending();
    std::lock_guard<std::mutex> lock(p.mu);
    auto& q = p.items[{&host, job.id()}];
    first = q.empty();
    q.push_back(std::move(item));
  }
  if (!first) return;
  OpHost* h = &host;
  host.postOnLoop([h, job_id = job.id()] { flushOnLoop(*h, job_id); });
}

void runDeviceLocalOnLoop(OpHost& host, Job& job, const ReadyOp& op, const DeviceLocalOp& dop,
                          const std::vector<uint64_t>& handles) {
  const SubmitDesc& d0 = op.descs[0];
  const auto coll = static_cast<CollectiveType>(d0.collective);
  host.opTimeline().opStart(op.name, coll);
  Status st = deviceRuntime().enqueueLocal(dop);
  host.opTimeline().opEnd(op.name, dop.dtype, shapeOf(d0));
  if (!st.isOk())
    log::get("agent.ops")->warn("job {}: device op '{}': {}", job.id(), op.name, st.message());
  host.finishOpOnLoop(job.id(), handles, d0.data_bytes, st, dop.dtype, op.first_arrival, coll);
}

}  // namespace kolo
