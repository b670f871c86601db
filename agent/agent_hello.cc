// Admission: a trainer's Hello, the job it creates or attaches to, its
// arenas and grants (device, direct user memory), the World and peer arenas
// it is sent; the job's removal once its last trainer is gone.
#include <sys/epoll.h>

#include <algorithm>
#include <cstring>

#include "agent/agent.h"
#include "agent/core/cross_memory.h"
#include "agent/core/device_runtime.h"
#include "agent/gpu/device_api.h"
#include "agent/ipc/limits.h"
#include "common/job_settings.h"
#include "common/log.h"

namespace kolo {

namespace {
auto ipcLog() { return log::get("agent.ipc"); }

// The device path (docs/gpu.md): a device arena and event pairs for a
// trainer that asked for them. Without one it is still admitted; its device
// tensors are refused with device_error.
void grantDeviceOnLoop(ClientConn& c, const ipc::Hello& h, ipc::Welcome* w, UniqueFd* fd) {
  // Bounded above by --max-device-arena-mb (checkHelloBounds).
  const uint64_t bytes = std::max<uint64_t>(h.device_arena_bytes(), 2ull << 20);
  auto g = deviceRuntime().grant(bytes, h.cuda_device(), h.gpu_uuid(), h.device_events());
  Status st = g.status();
  if (st.isOk()) {
    auto f = (*g)->exportFd();
    st = f.status();
    if (st.isOk()) {
      *fd = std::move(f).value();
      c.device = *g;
      w->set_device_arena_bytes(c.device->bytes());
      w->set_device_events(c.device->agentEvents());
      ipcLog()->info("pid {}: device arena of {} MiB on CUDA device {}", c.pid(),
                     c.device->bytes() >> 20, c.device->device());
      return;
    }
  }
  c.device_error = "the kolo agent could not grant a device arena: " + st.message();
  w->set_device_error(c.device_error);
  ipcLog()->warn("pid {}: {}", c.pid(), c.device_error);
}
// What a Hello must satisfy before anything is sized by it or a job is
// looked up: the per-job settings it carries, parsed.
StatusOr<JobSettings> admissibleHello(const ipc::Hello& h, const AgentLimits& limits,
                                      bool draining) {
  if (h.protocol_version() != kIpcProtocolVersion) {
    return invalidArgument("protocol version " + std::to_string(h.protocol_version()) +
                           " is not supported by this agent (speaks " +
                           std::to_string(kIpcProtocolVersion) + ")");
  }
  if (draining) return unavailable("the kolo agent is draining and admits no new trainers");
  // Every size in the Hello within its bound before anything is sized by it.
  RETURN_IF_ERROR(checkHelloBounds(h, limits));
  if (h.token().empty()) return permissionDenied("a job token is required (KOLO_JOB_TOKEN)");
  if (h.world_size() < h.local_size()) {
    return invalidArgument("world size " + std::to_string(h.world_size()) +
                           " is smaller than local size " + std::to_string(h.local_size()));
  }
  if (h.job_settings_size() > 64) {
    return invalidArgument("a Hello with " + std::to_string(h.job_settings_size()) +
                           " job settings (at most 64)");
  }
  auto settings = parseJobSettings({h.job_settings().begin(), h.job_settings().end()});
  if (!settings.isOk()) return settings.status().withContext("job " + h.job_id());
  return settings;
}

// What a trainer joining a job this agent already serves must agree on.
Status joinsJob(const Job& job, const ipc::Hello& h, const JobSettings& settings) {
  if (job.token() != h.token()) return permissionDenied("wrong token for job " + h.job_id());
  if (job.localSize() != h.local_size() ||
      (!job.elastic.enabled() && job.worldSize() != h.world_size())) {
    return invalidArgument(
        "job " + h.job_id() + " has local size " + std::to_string(job.localSize()) +
        " and world size " + std::to_string(job.worldSize()) +
        " on this agent, but this trainer says " + std::to_string(h.local_size()) + " and " +
        std::to_string(h.world_size()));
  }
  if (job.settings != settings) {
    return invalidArgument(
        "job " + h.job_id() + " runs with per-job settings (" + job.settings.describe() +
        ") from its first trainer on this agent, but this trainer's environment gives (" +
        settings.describe() +
        "): every rank of a job must set the same KOLO_*/HOROVOD_* tuning variables");
  }
  if (job.state() == JobState::kFailed || job.state() == JobState::kEnding) {
    return Status(job.failure().code(),
                  "job " + h.job_id() + " can no longer be joined: " + job.failure().message());
  }
  if (job.everConnected(h.local_rank()) &&
      (!job.elastic.enabled() || job.client(h.local_rank()) != nullptr)) {
    return invalidArgument("local rank " + std::to_string(h.local_rank()) + " of job " +
                           h.job_id() + " is already taken");
  }
  return okStatus();
}

}  // namespace

// The direct user-memory path (docs/architecture.md): the agent reads the
// trainer's probe through process_vm_readv; if the kernel lets it and the
// bytes match, the trainer's large host allreduces skip the arena. A read
// that fails (another user without CAP_SYS_PTRACE, a pid the agent's
// namespace cannot see, a non-dumpable trainer) leaves it on the arena.
void Agent::grantDirectOnLoop(ClientConn& c, const ipc::Hello& h, ipc::Welcome* w) {
  auto refuse = [&](const std::string& why) {
    w->set_direct_error(why);
    ipcLog()->info("pid {} (job {}): direct user-memory path off: {}", c.pid(), h.job_id(), why);
  };
  if (opts_.direct_min_bytes == 0) return refuse("the agent runs with --direct-min-kb 0");
  if (h.direct_probe().size() != 16) return refuse("a malformed probe");
  if (c.pid() <= 0) return refuse("the trainer's pid is not visible in the agent's pid namespace");
  // Bound to the process that connected (its pidfd from accept, its
  // credentials, its address space): agent/core/cross_memory.h.
  auto proc =
      TrainerProcess::bind(c.pid(), c.uid(), c.gid, h.direct_probe_addr(), c.peer_pidfd.release());
  if (!proc.isOk()) return refuse(proc.status().message());
  char got[16];
  Status st = (*proc)->read(h.direct_probe_addr(), got, sizeof got);
  if (!st.isOk()) return refuse(st.message());
  if (std::memcmp(got, h.direct_probe().data(), sizeof got) != 0) {
    return refuse("the probe read from pid " + std::to_string(c.pid()) +
                  " does not match what it sent");
  }
  c.direct_proc = *proc;
  c.direct_min_bytes = opts_.direct_min_bytes;
  w->set_direct_min_bytes(opts_.direct_min_bytes);
  if (opts_.direct_alone_min_bytes > 0) {
    w->set_direct_alone_min_bytes(std::max(opts_.direct_min_bytes, opts_.direct_alone_min_bytes));
  }
}

void Agent::handleHelloOnLoop(ClientConn& c, const ipc::Hello& h) {
  auto settings = admissibleHello(h, opts_.limits, draining_ || stopping_);
  if (!settings.isOk()) return refuseOnLoop(c, settings.status());
  Job* job = nullptr;
  bool created = false;
  if (auto it = jobs_.find(h.job_id()); it != jobs_.end()) {
    job = it->second.get();
    if (Status st = joinsJob(*job, h, *settings); !st.isOk()) return refuseOnLoop(c, st);
  } else {
    if (!timeline_job_.empty() && timeline_->active() && timeline_->path() == timeline_job_path_) {
      // A trainer's timeline records only its own job: another job arrives.
      ipcLog()->warn("stopping the timeline job {} started ({}): job {} joins this agent",
                     timeline_job_, timeline_job_path_, h.job_id());
      (void)timeline_->stop();
      timeline_job_.clear();
    }
    auto j = std::make_unique<Job>(h.job_id(), h.token(), h.world_size(), h.local_size());
    j->elastic = ElasticParams{h.min_size(), h.max_size(), h.elastic_timeout_ms()};
    j->settings = *settings;
    if (!settings->empty()) {
      ipcLog()->info("job {}: per-job settings from the trainers' environment: {}", h.job_id(),
                     settings->describe());
    }
    job = j.get();
    jobs_[h.job_id()] = std::move(j);
    created = true;
  }
  // Bounded above by --max-arena-mb (checkHelloBounds).
  uint64_t bytes =
      h.arena_bytes() > 0 ? std::max<uint64_t>(h.arena_bytes(), 16ull << 20) : opts_.arena_bytes;
  Status st = c.createArena(bytes, "kolo-" + h.job_id() + "-" + std::to_string(h.local_rank()));
  if (!st.isOk()) {
    if (created) jobs_.erase(h.job_id());
    return refuseOnLoop(c, st);
  }
  ipc::AgentFrame f;
  f.mutable_welcome()->set_code(0);
  f.mutable_welcome()->set_arena_bytes(bytes);
  f.mutable_welcome()->set_agent_id(opts_.agent_id);
  std::vector<int> fds = {c.arena()->fd(), c.doorbellFd(), c.completionFd()};
  UniqueFd device_fd;
  if (h.device_arena_bytes() > 0) grantDeviceOnLoop(c, h, f.mutable_welcome(), &device_fd);
  if (!h.direct_probe().empty()) grantDirectOnLoop(c, h, f.mutable_welcome());
  f.mutable_welcome()->set_max_bytes_in_flight(
      bytesInFlightLimit(opts_.limits, c.allArenasBytes()));
  if (opts_.stream_copy_in && opts_.cross_pipeline_bytes > 0) {
    c.streamed_min_bytes = opts_.cross_pipeline_bytes;
    f.mutable_welcome()->set_streamed_min_bytes(c.streamed_min_bytes);
  }
  if (opts_.split_min_bytes > 0) {
    c.split_min_bytes = opts_.split_min_bytes;
    f.mutable_welcome()->set_split_min_bytes(c.split_min_bytes);
  }
  if (device_fd.valid()) fds.push_back(device_fd.get());
  st = c.send(f, fds);
  if (!st.isOk()) {
    ipcLog()->warn("cannot send Welcome to pid {}: {}", c.pid(), st.toString());
    if (created) jobs_.erase(h.job_id());
    dropClientOnLoop(c.id(), "vanished during admission");
    return;
  }
  c.job_id = h.job_id();
  c.local_rank = h.local_rank();
  c.own_pid = h.pid();
  job->attach(h.local_rank(), &c);
  job->markConnected(h.local_rank());
  uint64_t id = c.id();
  (void)loop_.addFd(c.doorbellFd(), EPOLLIN, [this, id](uint32_t) { onDoorbellOnLoop(id); });
  // Seen wherever the agent pops or pushes (often inside a loop over the
  // job's clients): the drop runs later, on its own.
  c.on_broken_ring = [this, id] { loop_.post([this, id] { onBrokenRingOnLoop(id); }); };
  ipcLog()->info("admitted pid {} as local rank {}/{} of job {} (arena {} MiB)", c.pid(),
                 h.local_rank(), h.local_size(), h.job_id(), bytes >> 20);
  if (created) {
    std::string job_id = h.job_id();
    coord_->joinAndWatch(
        job_id, h.token(), h.local_size(), h.world_size(),
        [this, job_id](StatusOr<coord::World> w) { onWorldOnLoop(job_id, std::move(w)); },
        job->elastic);
    job->coordinator_joined = true;
  }
  maybeSendWorldOnLoop(*job);
  updateGaugesOnLoop();
}

void Agent::maybeSendWorldOnLoop(Job& job) {
  if (!job.ready() || !job.allLocalRanksArrived()) return;
  for (ClientConn* c : job.clients()) {
    if (c != nullptr && c->world_sent != job.world().generation) sendWorldOnLoop(job, *c);
  }
  maybeSendPeerArenasOnLoop(job);
}

// Split reduction (ipc_layout.h kSubmitFlagSplit): every local rank gets
// read-only descriptors of all the job's arenas once they are all
// connected, and again, with a new epoch, whenever a rank's connection was
// replaced. Only in a job on this agent alone.
void Agent::maybeSendPeerArenasOnLoop(Job& job) {
  if (opts_.split_min_bytes == 0 || job.localSize() < 2 || job.world().cross_size != 1) return;
  std::vector<uint64_t> conns;
  for (ClientConn* c : job.clients()) {
    if (c == nullptr || !c->hasArena() || c->split_min_bytes == 0) return;
    conns.push_back(c->id());
  }
  if (conns == job.split_conns) return;
  std::vector<UniqueFd> ro;
  ipc::AgentFrame f;
  auto* p = f.mutable_peers();
  for (ClientConn* c : job.clients()) {
    StatusOr<UniqueFd> fd = c->arena()->readOnlyFd();
    if (!fd.isOk()) {
      ipcLog()->warn("job {}: no split reduction: {}", job.id(), fd.status().toString());
      return;
    }
    ro.push_back(std::move(*fd));
    p->add_arena_bytes(c->arenaBytes());
  }
  job.split_conns = std::move(conns);
  p->set_epoch(++job.split_epoch);
  std::vector<int> fds;
  for (const UniqueFd& fd : ro) fds.push_back(fd.get());
  for (ClientConn* c : job.clients()) {
    Status st = c->send(f, fds);
    if (!st.isOk()) ipcLog()->warn("cannot send PeerArenas to pid {}: {}", c->pid(), st.toString());
  }
}

void Agent::sendWorldOnLoop(Job& job, ClientConn& c) {
  c.world_sent = job.world().generation;
  ipc::AgentFrame f;
  auto* w = f.mutable_world();
  w->set_generation(job.world().generation);
  w->set_rank(job.globalRank(c.local_rank));
  w->set_size(job.world().world_size);
  w->set_local_rank(c.local_rank);
  w->set_local_size(job.localSize());
  w->set_cross_rank(job.world().cross_rank);
  w->set_cross_size(job.world().cross_size);
  Status st = c.send(f);
  if (!st.isOk()) ipcLog()->warn("cannot send World to pid {}: {}", c.pid(), st.toString());
}

void Agent::maybeRemoveJobOnLoop(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  if (job.connectedClients() > 0 || job.executing() > 0) return;
  if (!job.coordinator_left) {
    bool failed = job.state() == JobState::kFailed;
    coord_->leave(job_id, failed, failed ? job.failure().message() : "");
    job.coordinator_left = true;
  }
  coord_->stopWatch(job_id);
  stalls_.removeJob(job_id);
  deviceRuntime().dropNodeComms(job_id + "\n");  // several GPUs' node-local NCCL
  ipcLog()->info("job {} removed ({} ops, {} bytes)", job_id, job.counters().ops_done,
                 job.counters().bytes_done);
  jobs_.erase(it);
  updateGaugesOnLoop();
}

}  // namespace kolo
