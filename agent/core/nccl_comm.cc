// One job generation's device-cross choice and NCCL communicator (nccl_comm.h).
#include "agent/core/nccl_comm.h"

#include <optional>
#include <vector>

#include "agent/backends/nccl/factory.h"
#include "agent/core/job.h"
#include "agent/ipc/client_conn.h"
#include "common/log.h"

namespace kolo {

namespace {

using Clock = std::chrono::steady_clock;

// Every agent's record by cross rank; nullopt for one not published by the
// deadline (or unreadable: logged).
std::vector<std::optional<gpu::DeviceCrossCapability>> readCapabilities(
    const DeviceCrossRequest& req, KvStore& kv) {
  const auto deadline = Clock::now() + req.timeout;
  std::vector<std::optional<gpu::DeviceCrossCapability>> caps(req.cross_size);
  for (int r = 0; r < req.cross_size; ++r) {
    if (r == req.cross_rank) {
      caps[r] = req.mine;
      continue;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto v = kv.get(gpu::deviceCapabilityKey(req.generation, r),
                    std::max(left, std::chrono::milliseconds(1)));
    if (!v.isOk()) continue;
    auto c = gpu::decodeCapability(*v);
    if (c.isOk()) {
      caps[r] = *c;
    } else {
      log::get("agent.nccl")
          ->warn("job {} generation {}: agent {}'s device capability: {}", req.job, req.generation,
                 r, c.status().message());
    }
  }
  return caps;
}

}  // namespace

StatusOr<DeviceCrossSetup> setUpDeviceCross(const DeviceCrossRequest& req, KvStore& kv) {
  if (req.cross_size < 1 || req.cross_rank < 0 || req.cross_rank >= req.cross_size)
    return invalidArgument("device cross: agent " + std::to_string(req.cross_rank) + " of " +
                           std::to_string(req.cross_size));
  auto log = log::get("agent.nccl");
  RETURN_IF_ERROR(kv.put(gpu::deviceCapabilityKey(req.generation, req.cross_rank),
                         gpu::encodeCapability(req.mine)));
  DeviceCrossSetup out;
  if (req.publish_only) {
    out.choice.kind = gpu::DeviceCrossChoiceKind::kStaged;
    out.choice.why = "no local trainer of the job has a device arena here";
    log->debug("job {} generation {}: {}", req.job, req.generation, out.choice.why);
    return out;
  }
  out.choice = gpu::chooseDeviceCross(req.mode, readCapabilities(req, kv));
  if (out.choice.kind == gpu::DeviceCrossChoiceKind::kNccl) {
    BackendOptions o;
    o.rank = req.cross_rank;
    o.size = req.cross_size;
    o.timeout = req.timeout;
    o.key_prefix = gpu::ncclKeyPrefix(req.generation);
    o.name = "nccl/" + req.job + "/g" + std::to_string(req.generation);
    auto b = createNcclBackend(o, kv, req.mine.gpu);
    if (b.isOk()) {
      out.nccl = std::move(b).value();
    } else {
      out.choice.kind = gpu::DeviceCrossChoiceKind::kFail;
      out.choice.why = "NCCL communicator of job " + req.job + " generation " +
                       std::to_string(req.generation) + " not created: " + b.status().toString();
    }
  }
  // Once per job and generation, on every agent, with the same words.
  log->info("job {} generation {}: {}", req.job, req.generation, out.choice.why);
  return out;
}

DeviceCrossRequest deviceCrossRequestFor(const Job& job, gpu::DeviceCrossMode mode,
                                         std::chrono::milliseconds timeout) {
  DeviceCrossRequest req;
  req.job = job.id();
  req.generation = job.world().generation;
  req.cross_rank = job.world().cross_rank;
  req.cross_size = job.world().cross_size;
  req.mode = mode;
  req.timeout = timeout;
  std::vector<int> gpus;
  std::string why;
  for (int r = 0; r < job.localSize(); ++r) {
    const ClientConn* c = job.client(r);
    if (c == nullptr) continue;
    if (c->device) {
      gpus.push_back(c->device->device());
    } else if (why.empty() && !c->device_error.empty()) {
      why = c->device_error;
    }
  }
  req.publish_only = gpus.empty();
  req.mine = gpu::localDeviceCapability(ncclBackendCompiled(), gpus, why);
  if (req.mine.nccl) {
    // Built with NCCL, but it may not load here (or the emulation says so).
    Status usable = ncclUsable();
    if (!usable.isOk()) {
      req.mine.nccl = false;
      req.mine.lacks = usable.message() + (req.mine.lacks.empty() ? "" : "; " + req.mine.lacks);
    }
  }
  return req;
}

}  // namespace kolo
