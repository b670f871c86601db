// Agent lifecycle and the local IPC server (accept, Hello, disconnects).
#include "agent/agent.h"

#include <cctype>
#include <signal.h>
#include <sys/epoll.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>

#include "agent/rpc/status_service.h"
#include "common/log.h"
#include "common/sd_notify.h"
#include "common/unix_socket.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent"); }
auto ipcLog() { return log::get("agent.ipc"); }
constexpr size_t kMaxJobIdBytes = 128;
}  // namespace

Agent::Agent(AgentOptions opts)
    : opts_(std::move(opts)),
      loop_("agent-loop"),
      pool_("reduce", opts_.reduce_threads),
      executor_(loop_, pool_, opts_.inline_reduce_bytes) {
  coord::AgentInfo self;
  self.set_agent_id(opts_.agent_id);
  self.set_hostname(opts_.hostname);
  coord_ = std::make_unique<CoordClient>(opts_.coordinator, self, loop_, opts_.coordinator_security);
}

Agent::~Agent() {
  if (rpc_server_) rpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (coord_) coord_->shutdown();
  if (listen_fd_.valid()) ::unlink(opts_.socket_path.c_str());
}

Status Agent::start() {
  started_ = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(listen_fd_, listenUnix(opts_.socket_path, opts_.socket_mode, opts_.socket_group));
  logger()->info("listening on {} (mode {:o})", opts_.socket_path, opts_.socket_mode);
  RETURN_IF_ERROR(startRpcServer());
  if (!opts_.metrics_listen.empty()) {
    metrics_http_ = std::make_unique<metrics::MetricsHttpServer>(metrics_, opts_.metrics_listen);
    RETURN_IF_ERROR(metrics_http_->start().withContext("--metrics-listen " + opts_.metrics_listen));
    logger()->info("metrics on http://{}/metrics", metrics_http_->boundAddress());
  }
  initMetrics();
  updateGaugesOnLoop();
  {
    std::string host = opts_.rpc_listen.substr(0, opts_.rpc_listen.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = opts_.hostname;
    coord_->setRpcAddress(host + ":" + std::to_string(rpc_port_));
  }
  RETURN_IF_ERROR(coord_->registerAgent(std::chrono::steady_clock::now() +
                                        std::chrono::seconds(opts_.register_timeout_s)));
  coord_->startHeartbeats();

  // Signals arrive as events on the loop (they are blocked in every thread by main()).
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  signal_fd_.reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (opts_.spin_us > 0) {
    // Before sleeping, poll the submission rings briefly: the next small
    // collective usually arrives within microseconds, and a sleep + wake-up
    // costs more than that. Work posted by other threads (the backends'
    // completions: a small cross-agent collective's answer) is caught the
    // same way.
    loop_.setBeforeSleep([this] {
      auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(opts_.spin_us);
      do {
        if (loop_.hasPosted()) return true;
        for (auto& [id, c] : conns_) {
          if (c->hasArena() && c->hasSubmissions()) return true;
        }
        ::sched_yield();
      } while (std::chrono::steady_clock::now() < end);
      return false;
    });
  }
  Status st = loop_.addFd(listen_fd_.get(), EPOLLIN, [this](uint32_t) { onAcceptOnLoop(); });
  RETURN_IF_ERROR(st);
  if (signal_fd_.valid()) {
    RETURN_IF_ERROR(loop_.addFd(signal_fd_.get(), EPOLLIN, [this](uint32_t) {
      signalfd_siginfo si;
      while (::read(signal_fd_.get(), &si, sizeof si) == sizeof si) {
        logger()->info("received signal {}; shutting down", si.ssi_signo);
      }
      stop();
    }));
  }
  stall::StallOptions so;
  so.warning_time = std::chrono::seconds(std::max<int64_t>(1, opts_.stall_check_time_s));
  so.shutdown_time = std::chrono::seconds(std::max<int64_t>(0, opts_.stall_shutdown_time_s));
  so.disabled = opts_.stall_check_disable;
  stalls_.setOptions(so);
  auto period = std::min<std::chrono::milliseconds>(std::chrono::seconds(5), so.warning_time / 4);
  loop_.addTimer(period, [this] { checkStallsOnLoop(); }, period);
  {
    timeline::TimelineOptions to;
    to.label = opts_.agent_id;
    to.dir = opts_.timeline_dir;  // confines every caller's file name
    timeline_ = std::make_unique<Timeline>(to);
  }
  if (!opts_.timeline_filename.empty()) {
    Status ts = timeline_->start(opts_.timeline_filename, opts_.timeline_mark_cycles);
    if (!ts.isOk()) return ts.withContext("--timeline-filename");
    logger()->info("writing the timeline to {}", opts_.timeline_filename);
  }
  RETURN_IF_ERROR(writeReadyFile());
  Status sd = sdNotifyReady("serving " + opts_.socket_path);
  if (!sd.isOk()) logger()->warn("sd_notify READY failed: {}", sd.message());
  return okStatus();
}

StatusOr<std::string> Agent::timelineOnLoop(bool start, const std::string& path, bool mark_cycles) {
  if (!start) {
    std::string p = timeline_->path();
    RETURN_IF_ERROR(timeline_->stop());
    logger()->info("timeline stopped ({})", p);
    return p;
  }
  if (path.empty()) return invalidArgument("timeline start needs a file path");
  // "%a" stands for this agent's id, as in --timeline-filename, so that
  // several agents on one host write separate files.
  std::string file = substitutePathToken(path, "%a", opts_.agent_id);
  if (timeline_->active()) RETURN_IF_ERROR(timeline_->stop());
  RETURN_IF_ERROR(timeline_->start(file, mark_cycles));
  logger()->info("timeline started: {}", timeline_->path());
  return timeline_->path();
}

void Agent::checkStallsOnLoop() {
  stall::StallReport report = stalls_.check(std::chrono::steady_clock::now());
  if (!report.text.empty()) log::get("agent.stall")->warn("{}", report.text);
  for (const auto& j : report.jobs) {
    metrics_.counter("kolo_stalls_total", "Collectives reported as stalled").inc(j.tensors.size());
  }
  for (const std::string& job_id : report.shutdown) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    failJobOnLoop(*it->second,
                  aborted("job " + job_id + " stalled longer than --stall-shutdown-time-s=" +
                          std::to_string(opts_.stall_shutdown_time_s) + " s; see the agent log for the missing ranks"),
                  true);
  }
}

Status Agent::writeReadyFile() {
  if (opts_.ready_file.empty()) return okStatus();
  std::string host = opts_.rpc_listen.substr(0, opts_.rpc_listen.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
  std::string tmp = opts_.ready_file + ".tmp";
  {
    std::ofstream f(tmp);
    f << host << ":" << rpc_port_ << "\n";
    if (metrics_http_) f << "metrics=" << metrics_http_->boundAddress() << "\n";
    if (!f) return internalError("cannot write ready file " + tmp);
  }
  if (::rename(tmp.c_str(), opts_.ready_file.c_str()) != 0) {
    return errnoStatus("rename ready file", errno);
  }
  return okStatus();
}

Status Agent::startRpcServer() {
  grpc::EnableDefaultHealthCheckService(true);
  rpc_service_ = makeStatusService(*this);
  grpc::ServerBuilder b;
  b.AddListeningPort(opts_.rpc_listen, statusServiceCredentials(opts_.rpc_security), &rpc_port_);
  b.RegisterService(rpc_service_.get());
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  rpc_server_ = b.BuildAndStart();
  if (!rpc_server_ || rpc_port_ == 0) {
    return unavailable("cannot serve gRPC on " + opts_.rpc_listen + " (address in use?)");
  }
  rpc_server_->GetHealthCheckService()->SetServingStatus(true);
  logger()->info("status service on port {}", rpc_port_);
  return okStatus();
}

void Agent::run() { loop_.run(); }

void Agent::stop() {
  loop_.post([this] {
    if (stopping_) return;
    stopping_ = true;
    (void)sdNotifyStopping("draining jobs");
    if (timeline_ && timeline_->active()) (void)timeline_->stop();
    for (auto& [id, job] : jobs_) {
      failJobOnLoop(*job, aborted("the kolo agent on " + opts_.hostname + " is shutting down"), true);
    }
    // Give the departing notifications a moment to flush, then leave the loop.
    loop_.addTimer(std::chrono::milliseconds(50), [this] {
      if (rpc_server_) rpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      coord_->shutdown();
      loop_.stop();
    });
  });
}

void Agent::onAcceptOnLoop() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        ipcLog()->warn("accept failed: {}", std::strerror(errno));
      }
      return;
    }
    UniqueFd sock(fd);
    auto cred = peerCredentials(fd);
    pid_t pid = cred.isOk() ? cred->pid : -1;
    uid_t uid = cred.isOk() ? cred->uid : 0;
    uint64_t id = next_conn_id_++;
    auto conn = std::make_unique<ClientConn>(id, std::move(sock), pid, uid);
    Status st = loop_.addFd(fd, EPOLLIN | EPOLLRDHUP, [this, id](uint32_t ev) { onSocketOnLoop(id, ev); });
    if (!st.isOk()) {
      ipcLog()->warn("cannot watch client socket: {}", st.toString());
      continue;
    }
    ipcLog()->debug("connection {} from pid {} uid {}", id, pid, uid);
    conns_[id] = std::move(conn);
  }
}

void Agent::onSocketOnLoop(uint64_t conn_id, uint32_t events) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  ClientConn& c = *it->second;
  Status st = readAvailable(c.socketFd(), &c.decoder(), &c.receivedFds());
  std::string payload;
  while (c.decoder().next(&payload)) {
    handleFrameOnLoop(c, payload);
    if (conns_.find(conn_id) == conns_.end()) return;  // dropped while handling
  }
  if (!st.isOk()) {
    if (st.code() == Code::kInvalidArgument) {
      ipcLog()->warn("dropping connection from pid {}: {}", c.pid(), st.message());
      dropClientOnLoop(conn_id, "sent a malformed frame (" + st.message() + ")");
    } else {
      dropClientOnLoop(conn_id, c.said_goodbye ? "shut down" : "closed its connection");
    }
    return;
  }
  if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) {
    dropClientOnLoop(conn_id, c.said_goodbye ? "shut down" : "closed its connection");
  }
}

void Agent::handleFrameOnLoop(ClientConn& c, const std::string& payload) {
  // Clients never send descriptors; close any they did.
  c.receivedFds().clear();
  ipc::ClientFrame f;
  if (!f.ParseFromString(payload)) {
    ipcLog()->warn("dropping connection from pid {}: undecodable frame of {} bytes", c.pid(),
                   payload.size());
    dropClientOnLoop(c.id(), "sent an undecodable frame");
    return;
  }
  switch (f.msg_case()) {
    case ipc::ClientFrame::kHello:
      if (c.hasArena()) {
        dropClientOnLoop(c.id(), "sent a second Hello");
        return;
      }
      handleHelloOnLoop(c, f.hello());
      return;
    case ipc::ClientFrame::kGoodbye:
      c.said_goodbye = true;
      return;
    case ipc::ClientFrame::kTimeline: {
      auto r = timelineOnLoop(f.timeline().start(), f.timeline().path(), f.timeline().mark_cycles());
      if (!r.isOk()) ipcLog()->warn("timeline control from pid {}: {}", c.pid(), r.status().message());
      return;
    }
    default:
      ipcLog()->warn("dropping connection from pid {}: unknown frame type", c.pid());
      dropClientOnLoop(c.id(), "sent an unknown frame");
      return;
  }
}

void Agent::refuseOnLoop(ClientConn& c, const Status& st) {
  ipcLog()->warn("refusing pid {}: {}", c.pid(), st.message());
  ipc::AgentFrame f;
  f.mutable_welcome()->set_code(static_cast<int>(st.code()));
  f.mutable_welcome()->set_message(st.message());
  (void)c.send(f);
  // The connection stays until the client closes it; it holds no job.
}

namespace {

// The device path (docs/gpu.md): a device arena and event pairs for a
// trainer that asked for them. Without one it is still admitted; its device
// tensors are refused with device_error.
void grantDeviceOnLoop(ClientConn& c, const ipc::Hello& h, ipc::Welcome* w, UniqueFd* fd) {
  const uint64_t bytes = std::clamp<uint64_t>(h.device_arena_bytes(), 2ull << 20, 64ull << 30);
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
      ipcLog()->info("pid {}: device arena of {} MiB on CUDA device {}", c.pid(), c.device->bytes() >> 20,
                     c.device->device());
      return;
    }
  }
  c.device_error = "the kolo agent could not grant a device arena: " + st.message();
  w->set_device_error(c.device_error);
  ipcLog()->warn("pid {}: {}", c.pid(), c.device_error);
}

}  // namespace

void Agent::handleHelloOnLoop(ClientConn& c, const ipc::Hello& h) {
  if (h.protocol_version() != kIpcProtocolVersion) {
    return refuseOnLoop(c, invalidArgument("protocol version " + std::to_string(h.protocol_version()) +
                                          " is not supported by this agent (speaks " +
                                          std::to_string(kIpcProtocolVersion) + ")"));
  }
  if (draining_ || stopping_) return refuseOnLoop(c, unavailable("the kolo agent is draining and admits no new trainers"));
  if (h.job_id().empty() || h.job_id().size() > kMaxJobIdBytes) {
    return refuseOnLoop(c, invalidArgument("job id must be 1.." + std::to_string(kMaxJobIdBytes) + " bytes"));
  }
  if (h.token().empty()) return refuseOnLoop(c, permissionDenied("a job token is required (KOLO_JOB_TOKEN)"));
  if (h.local_size() < 1 || h.local_rank() < 0 || h.local_rank() >= h.local_size()) {
    return refuseOnLoop(c, invalidArgument("local rank " + std::to_string(h.local_rank()) +
                                          " is not in [0, local size " + std::to_string(h.local_size()) + ")"));
  }
  if (h.world_size() < h.local_size()) {
    return refuseOnLoop(c, invalidArgument("world size " + std::to_string(h.world_size()) +
                                          " is smaller than local size " + std::to_string(h.local_size())));
  }
  Job* job = nullptr;
  bool created = false;
  if (auto it = jobs_.find(h.job_id()); it != jobs_.end()) {
    job = it->second.get();
    if (job->token() != h.token()) return refuseOnLoop(c, permissionDenied("wrong token for job " + h.job_id()));
    if (job->localSize() != h.local_size() || (!job->elastic.enabled() && job->worldSize() != h.world_size())) {
      return refuseOnLoop(c, invalidArgument(
          "job " + h.job_id() + " has local size " + std::to_string(job->localSize()) + " and world size " +
          std::to_string(job->worldSize()) + " on this agent, but this trainer says " +
          std::to_string(h.local_size()) + " and " + std::to_string(h.world_size())));
    }
    if (job->state() == JobState::kFailed || job->state() == JobState::kEnding) {
      return refuseOnLoop(c, Status(job->failure().code(), "job " + h.job_id() + " can no longer be joined: " +
                                                                job->failure().message()));
    }
    if (job->everConnected(h.local_rank()) && (!job->elastic.enabled() || job->client(h.local_rank()) != nullptr)) {
      return refuseOnLoop(c, invalidArgument("local rank " + std::to_string(h.local_rank()) + " of job " +
                                            h.job_id() + " is already taken"));
    }
  } else {
    auto j = std::make_unique<Job>(h.job_id(), h.token(), h.world_size(), h.local_size());
    j->elastic = ElasticParams{h.min_size(), h.max_size(), h.elastic_timeout_ms()};
    job = j.get();
    jobs_[h.job_id()] = std::move(j);
    created = true;
  }
  uint64_t bytes = h.arena_bytes() > 0 ? std::clamp<uint64_t>(h.arena_bytes(), 16ull << 20, 64ull << 30)
                                       : opts_.arena_bytes;
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
  job->attach(h.local_rank(), &c);
  job->markConnected(h.local_rank());
  uint64_t id = c.id();
  (void)loop_.addFd(c.doorbellFd(), EPOLLIN, [this, id](uint32_t) { onDoorbellOnLoop(id); });
  // Seen wherever the agent pops or pushes (often inside a loop over the
  // job's clients): the drop runs later, on its own.
  c.on_broken_ring = [this, id] { loop_.post([this, id] { onBrokenRingOnLoop(id); }); };
  ipcLog()->info("admitted pid {} as local rank {}/{} of job {} (arena {} MiB)", c.pid(), h.local_rank(),
                 h.local_size(), h.job_id(), bytes >> 20);
  if (created) {
    std::string job_id = h.job_id();
    coord_->joinAndWatch(job_id, h.token(), h.local_size(), h.world_size(),
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

void Agent::onBrokenRingOnLoop(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  ClientConn& c = *it->second;
  const std::string why = c.ringError();
  ipcLog()->error("closing the connection of pid {} (job {}, local rank {}): it {}", c.pid(),
                  c.job_id.empty() ? "-" : c.job_id, c.local_rank, why);
  // The trainer learns why before its socket closes.
  ipc::AgentFrame f;
  f.mutable_job_failed()->set_code(static_cast<int>(Code::kInvalidArgument));
  f.mutable_job_failed()->set_message("the kolo agent closed this connection: this process " + why +
                                      " in the shared arena");
  (void)c.send(f);
  dropClientOnLoop(conn_id, why, true);
}

void Agent::dropClientOnLoop(uint64_t conn_id, const std::string& why, bool broke_rings) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  std::unique_ptr<ClientConn> c = std::move(it->second);
  conns_.erase(it);
  loop_.removeFd(c->socketFd());
  if (c->hasArena()) loop_.removeFd(c->doorbellFd());
  updateGaugesOnLoop();
  if (c->job_id.empty()) return;
  auto jit = jobs_.find(c->job_id);
  if (jit == jobs_.end()) return;
  Job& job = *jit->second;
  int rank = job.hasWorld() ? job.globalRank(c->local_rank) : c->local_rank;
  job.detach(c->local_rank);
  if (broke_rings) {
    // As when a trainer dies, but the reason says what it did.
    std::string reason = "rank " + std::to_string(rank) + " (pid " + std::to_string(c->pid()) +
                         ") on " + opts_.hostname + " " + why + "; the agent closed its connection";
    if (job.state() == JobState::kFailed) {
      // Nothing more to fail.
    } else if (job.elastic.enabled() && job.state() == JobState::kRunning &&
               job.connectedClients() > 0) {
      elasticRankLostOnLoop(job, c->local_rank, reason);
    } else {
      failJobOnLoop(job, peerFailure(reason), true);
    }
  } else if (c->said_goodbye) {
    ipcLog()->info("rank {} (pid {}) of job {} shut down", rank, c->pid(), job.id());
    job.setEnding(aborted("rank " + std::to_string(rank) + " of job " + job.id() +
                          " has shut down; collectives that need it can no longer complete"));
    endJobForRankOnLoop(job, c->local_rank);
  } else if (job.state() != JobState::kFailed) {
    std::string reason = "rank " + std::to_string(rank) + " (pid " + std::to_string(c->pid()) + ") on " +
                         opts_.hostname + " " + why + " without shutting down: it exited, crashed or was killed";
    ipcLog()->warn("job {}: {}", job.id(), reason);
    if (job.elastic.enabled() && job.state() == JobState::kRunning && job.connectedClients() > 0) {
      elasticRankLostOnLoop(job, c->local_rank, reason);  // the others wait for it to restart
    } else {
      failJobOnLoop(job, peerFailure(reason), true);  // elastic: the coordinator drops this agent
    }
  }
  maybeRemoveJobOnLoop(job.id());
}

void Agent::maybeRemoveJobOnLoop(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  if (job.connectedClients() > 0 || job.executing > 0) return;
  if (!job.coordinator_left) {
    bool failed = job.state() == JobState::kFailed;
    coord_->leave(job_id, failed, failed ? job.failure().message() : "");
    job.coordinator_left = true;
  }
  coord_->stopWatch(job_id);
  stalls_.removeJob(job_id);
  ipcLog()->info("job {} removed ({} ops, {} bytes)", job_id, job.counters().ops_done,
                 job.counters().bytes_done);
  jobs_.erase(it);
  updateGaugesOnLoop();
}

void Agent::initMetrics() {
  for (int c = 0; c < OpMetrics::kCollectives; ++c) {
    std::string op(collectiveName(static_cast<CollectiveType>(c)));
    for (int i = 0; i < kNumDataTypes; ++i) {
      std::string dt(dataTypeName(static_cast<DataType>(i)));
      const char* help = "Collectives completed on this agent";
      op_metrics_.ok[c][i] = &metrics_.counter("kolo_collectives_total", help,
                                               {{"op", op}, {"dtype", dt}, {"status", "ok"}});
      op_metrics_.failed[c][i] = &metrics_.counter("kolo_collectives_total", help,
                                                   {{"op", op}, {"dtype", dt}, {"status", "error"}});
      op_metrics_.bytes[c][i] = &metrics_.counter("kolo_collective_bytes_total",
                                                  "Payload bytes of completed collectives (one rank's tensor)",
                                                  {{"op", op}, {"dtype", dt}});
    }
    op_metrics_.latency[c] = &metrics_.histogram("kolo_collective_latency_seconds",
                                                 "From the first rank's submission to completion", {{"op", op}});
  }
  op_metrics_.negotiation = &metrics_.histogram("kolo_negotiation_seconds",
                                                "From a name's first local submission to node-ready");
}

void Agent::updateGaugesOnLoop() {
  int clients = 0;
  for (auto& [id, c] : conns_) clients += !c->job_id.empty();
  metrics_.gauge("kolo_clients", "Trainer processes connected to this agent").set(clients);
  metrics_.gauge("kolo_jobs", "Jobs with ranks on this agent").set(static_cast<double>(jobs_.size()));
}

}  // namespace kolo
