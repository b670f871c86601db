// Grouped collectives (allreduce, allgather, reducescatter) on the agent
// loop. A rank's n-th grouped call
// submits its members with group_id n, the member count and a hash of the
// names (the tensor table checks all three across ranks). A node-ready
// member waits here until every member of its group is node-ready; then
// they are executed together (on several agents, CrossJob holds the
// negotiated members back the same way until the whole group is agreed,
// and posts them next to each other so they fuse). A member that fails
// (mismatch, membership) fails its whole group: the members held here, the
// members still pending in the table, and any that arrive later.
#include "agent/agent.h"
#include "common/log.h"

namespace kolo {

namespace {
constexpr size_t kFailedGroupsKept = 256;
}  // namespace

void Agent::dispatchReadyOnLoop(Job& job, ReadyOp op) {
  const SubmitDesc& d0 = op.descs[0];
  const uint64_t gid = d0.group_id;
  if (gid == 0 || (d0.group_size <= 1 && op.error.isOk())) {
    executeOnLoop(job, std::move(op));
    return;
  }
  auto f = job.failed_groups.find(gid);
  if (f != job.failed_groups.end()) {
    if (op.error.isOk()) op.error = f->second;
    executeOnLoop(job, std::move(op));
    return;
  }
  if (!op.error.isOk()) {
    Status why = op.error;
    const auto coll = static_cast<CollectiveType>(d0.collective);
    executeOnLoop(job, std::move(op));
    failGroupOnLoop(job, gid, coll, why);
    return;
  }
  auto& held = job.held_groups[gid];
  held.push_back(std::move(op));
  if (held.size() < d0.group_size) return;
  std::vector<ReadyOp> members = std::move(held);
  job.held_groups.erase(gid);
  for (ReadyOp& m : members) executeOnLoop(job, std::move(m));
}

void Agent::failGroupOnLoop(Job& job, uint64_t gid, CollectiveType coll, const Status& why) {
  if (job.failed_groups.count(gid)) return;
  Status st = invalidArgument("grouped " + std::string(collectiveName(coll)) + " #" + std::to_string(gid) +
                              " failed because another of its tensors failed: " + why.message());
  job.failed_groups[gid] = st;
  while (job.failed_groups.size() > kFailedGroupsKept) job.failed_groups.erase(job.failed_groups.begin());
  std::vector<ReadyOp> members;
  auto h = job.held_groups.find(gid);
  if (h != job.held_groups.end()) {
    members = std::move(h->second);
    job.held_groups.erase(h);
  }
  for (ReadyOp& op : job.table().takeGroup(gid, std::chrono::steady_clock::now())) {
    stalls_.recordDone(job.id(), op.name);
    members.push_back(std::move(op));
  }
  for (ReadyOp& op : members) {
    op.error = st;
    executeOnLoop(job, std::move(op));
  }
}

}  // namespace kolo
