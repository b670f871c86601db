// Agent lifecycle and the local IPC server (accept, Hello, disconnects).
#include "agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/core/cross_memory.h"
#include "agent/gpu/device_api.h"
#include "agent/ipc/limits.h"
#include "agent/rpc/status_service.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/sd_notify.h"
#include "common/unix_socket.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent"); }
auto ipcLog() { return log::get("agent.ipc"); }
// Repeated warnings a peer can trigger in a loop go through these.
log::RateLimiter g_accept_log;
log::RateLimiter g_refuse_log;
log::RateLimiter g_drop_log;
// Accepts per wake-up, so that a connection storm cannot starve the loop.
constexpr int kAcceptBatch = 64;
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// Bytes read from one connection per wake-up (a few maximal frames).
constexpr size_t kReadBudget = 4 * kMaxFrameBytes;
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
  coord_->setWatchRetry(std::chrono::seconds(opts_.coordinator_watch_retry_s));
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
  mps_ = std::make_unique<MpsMonitor>(opts_.mps_pipe_dir, &metrics_);
  {
    // What `kolo agents` and the other hosts are told: --rpc-advertise-address
    // (e.g. a pod's IP, where the node's name answers nothing), else the
    // listening host, else --hostname.
    const std::string& adv = opts_.rpc_advertise_address;
    const bool has_port = !adv.empty() && adv.back() != ']' &&
                          adv.rfind(':') != std::string::npos &&
                          (adv.front() != '[' || adv.find("]:") != std::string::npos);
    std::string host = opts_.rpc_listen.substr(0, opts_.rpc_listen.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = opts_.hostname;
    if (!adv.empty()) host = adv;
    coord_->setRpcAddress(has_port ? adv : host + ":" + std::to_string(rpc_port_));
  }
  // Signals arrive as events on the loop (they are blocked in every thread by
  // main()). Already while registering: SIGTERM must not wait for an absent
  // coordinator (systemd and Kubernetes stop the agent with it).
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  signal_fd_.reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  RETURN_IF_ERROR(registerWatchingSignals());
  coord_->startHeartbeats();
  if (opts_.spin_us > 0) {
    loop_.setBeforeSleep([this] { return beforeSleepOnLoop(); });
    loop_.setAfterSleep([this] { afterSleepOnLoop(); });
  }
  Status st = loop_.addFd(listen_fd_.get(), EPOLLIN, [this](uint32_t) { onAcceptOnLoop(); });
  RETURN_IF_ERROR(st);
  // Kept for the moment accept() fails with EMFILE: closing it frees one
  // descriptor, enough to accept the waiting connection and refuse it.
  spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  {
    auto timeout = std::chrono::duration<double>(opts_.limits.handshake_timeout_s);
    auto period = std::clamp<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(timeout / 4),
        std::chrono::milliseconds(50), std::chrono::seconds(1));
    loop_.addTimer(
        period, [this] { closeLateHandshakesOnLoop(); }, period);
  }
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
    to.max_bytes = opts_.timeline_max_bytes;
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

namespace {
std::string signalText(int sig) {
  const char* a = ::sigabbrev_np(sig);
  return a != nullptr ? std::string("SIG") + a : "signal " + std::to_string(sig);
}
}  // namespace

Status Agent::registerWatchingSignals() {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(opts_.register_timeout_s);
  if (!signal_fd_.valid()) return coord_->registerAgent(deadline);
  UniqueFd done(::eventfd(0, EFD_CLOEXEC));
  if (!done.valid()) return errnoStatus("eventfd", errno);
  std::thread watcher([this, &done] {
    pollfd fds[2] = {{signal_fd_.get(), POLLIN, 0}, {done.get(), POLLIN, 0}};
    while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
    }
    if ((fds[0].revents & POLLIN) == 0) return;
    signalfd_siginfo si;
    while (::read(signal_fd_.get(), &si, sizeof si) == sizeof si)
      stop_signal_ = static_cast<int>(si.ssi_signo);
    if (stop_signal_ == 0) return;
    logger()->info("received {} while registering with the coordinator at {}; stopping",
                   signalText(stop_signal_), coord_->address());
    coord_->cancelRegistration();
  });
  Status st = coord_->registerAgent(deadline);
  uint64_t one = 1;
  ssize_t ignored = ::write(done.get(), &one, sizeof one);
  (void)ignored;
  watcher.join();
  if (stop_signal_ != 0) {
    return aborted("stopped by " + signalText(stop_signal_) +
                   " while waiting for the coordinator at " + coord_->address());
  }
  return st;
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

Status Agent::trainerTimelineOnLoop(ClientConn& c, const ipc::TimelineControl& t) {
  // The timeline is the agent's (one file, every job's tensors): a trainer
  // may switch it only while its job is the only one here, and may not touch
  // one the operator (or another job) started. The file path is confined by
  // timelineOnLoop.
  const bool ours = !timeline_job_.empty() && timeline_job_ == c.job_id && timeline_->active() &&
                    timeline_->path() == timeline_job_path_;
  if (timeline_->active() && !ours) {
    return permissionDenied(
        "TimelineControl from job " + c.job_id +
        " refused: the agent's timeline was started by its operator or another job; use "
        "`kolo timeline` on the agent");
  }
  if (jobs_.size() > 1) {
    return permissionDenied(
        "TimelineControl from job " + c.job_id + " refused: this agent serves " +
        std::to_string(jobs_.size() - 1) +
        " other job(s) and its timeline would record theirs; use `kolo timeline` on the agent");
  }
  if (!t.start() && !timeline_->active()) return okStatus();
  ASSIGN_OR_RETURN(std::string path, timelineOnLoop(t.start(), t.path(), t.mark_cycles()));
  if (t.start()) {
    timeline_job_ = c.job_id;
    timeline_job_path_ = path;
  } else {
    timeline_job_.clear();
    timeline_job_path_.clear();
  }
  return okStatus();
}

void Agent::checkStallsOnLoop() {
  // check() logs the report; each job's part of it goes to the job's ranks
  // too (a Notice they print on stderr), so a hang is never silent.
  stall::StallReport report = stalls_.check(std::chrono::steady_clock::now());
  for (const auto& j : report.jobs) {
    metrics_.counter("kolo_stalls_total", "Collectives reported as stalled").inc(j.tensors.size());
    auto it = jobs_.find(j.job_id);
    if (it == jobs_.end()) continue;
    const std::string text = stall::StallInspector::formatJob(j, stalls_.options());
    ipc::AgentFrame f;
    f.mutable_notice()->set_kind("stall");
    f.mutable_notice()->set_message(text);
    for (ClientConn* c : it->second->clients()) {
      if (c != nullptr) (void)c->send(f);
    }
    if (!j.must_shut_down) continue;
    // The failure's text reaches every pending op (a completion holds a
    // short text): the missing ranks in one line; the report above has all.
    failJobOnLoop(*it->second,
                  aborted("job " + j.job_id + " stalled longer than --stall-shutdown-time-s=" +
                          std::to_string(opts_.stall_shutdown_time_s) +
                          " s: " + stall::StallInspector::summarizeJob(j) +
                          " (the stall report on stderr lists every collective)"),
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
  rpc_server_->GetHealthCheckService()->SetServingStatus(kHealthService, true);
  logger()->info("status service on port {}", rpc_port_);
  return okStatus();
}

void Agent::run() {
  gpu::markLoopThread();  // the host emulation checks that nothing blocks it
  loop_.run();
}

void Agent::stop() {
  loop_.post([this] {
    if (stopping_) return;
    stopping_ = true;
    staging_cancel_ = true;  // a device staging wait ends now, not at its deadline
    (void)sdNotifyStopping("draining jobs");
    if (timeline_ && timeline_->active()) (void)timeline_->stop();
    for (auto& [id, job] : jobs_) {
      failJobOnLoop(*job, aborted("the kolo agent on " + opts_.hostname + " is shutting down"), true);
    }
    // Give the departing notifications a moment to flush, then leave the loop.
    loop_.addTimer(std::chrono::milliseconds(50), [this] {
      if (rpc_server_) rpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      coord_->deregister(std::chrono::milliseconds(300));
      coord_->shutdown();
      loop_.stop();
    });
  });
}

void Agent::onAcceptOnLoop() {
  for (int i = 0; i < kAcceptBatch && !accept_paused_; ++i) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) return acceptOverflowOnLoop(errno);
      log::rateLimited(g_accept_log, *ipcLog(), spdlog::level::warn,
                       "accept failed: {}; pausing accepts for {} ms", std::strerror(errno),
                       kAcceptPause.count());
      return pauseAcceptOnLoop();
    }
    UniqueFd sock(fd);
    auto cred = peerCredentials(fd);
    pid_t pid = cred.isOk() ? cred->pid : -1;
    uid_t uid = cred.isOk() ? cred->uid : 0;
    uint64_t id = next_conn_id_++;
    auto conn = std::make_unique<ClientConn>(id, std::move(sock), pid, uid);
    conn->gid = cred.isOk() ? cred->gid : 0;
    conn->peer_pidfd.reset(peerPidfd(conn->socketFd(), pid));
    Status over;
    if (static_cast<int64_t>(conns_.size()) >= opts_.limits.max_connections) {
      over = unavailable(
          "the kolo agent has " + std::to_string(conns_.size()) + " connections open (limit " +
          std::to_string(opts_.limits.max_connections) + ", --max-connections); try again later");
    } else if (int n = conns_per_uid_[uid]; n >= opts_.limits.max_connections_per_uid) {
      over = unavailable("uid " + std::to_string(uid) + " has " + std::to_string(n) +
                         " connections open to the kolo agent (limit " +
                         std::to_string(opts_.limits.max_connections_per_uid) +
                         ", --max-connections-per-uid); close idle ones");
    }
    if (!over.isOk()) {
      // Only the agent-wide limit passes as others disconnect; a uid over its
      // own limit holds those connections itself.
      bool momentary = static_cast<int64_t>(conns_.size()) >= opts_.limits.max_connections;
      refuseFrameOnLoop(*conn, over, "connection", false,  // not registered: closed on return
                        momentary ? static_cast<int>(kAcceptPause.count()) * 2 : 0);
      continue;
    }
    Status st = loop_.addFd(fd, EPOLLIN | EPOLLRDHUP, [this, id](uint32_t ev) { onSocketOnLoop(id, ev); });
    if (!st.isOk()) {
      log::rateLimited(g_accept_log, *ipcLog(), spdlog::level::warn,
                       "cannot watch client socket: {}", st.toString());
      continue;
    }
    ipcLog()->debug("connection {} from pid {} uid {}", id, pid, uid);
    ++conns_per_uid_[uid];
    conns_[id] = std::move(conn);
  }
}

void Agent::acceptOverflowOnLoop(int err) {
  // Out of descriptors: the waiting connection would make epoll report the
  // socket again and again. Use the spare descriptor to take it and refuse
  // it with a reason, then stop accepting for a moment.
  log::rateLimited(g_accept_log, *ipcLog(), spdlog::level::warn,
                   "accept failed: {} ({} connections open); refusing new connections and pausing "
                   "accepts for {} ms",
                   std::strerror(err), conns_.size(), kAcceptPause.count());
  if (spare_fd_.valid()) {
    spare_fd_.reset();
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      auto cred = peerCredentials(fd);
      ClientConn refused(0, UniqueFd(fd), cred.isOk() ? cred->pid : -1, cred.isOk() ? cred->uid : 0);
      refuseFrameOnLoop(refused,
                        unavailable(std::string("the kolo agent is out of file descriptors (") +
                                    std::strerror(err) + "); try again later"),
                        "connection", false, static_cast<int>(kAcceptPause.count()) * 2);
    }
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  pauseAcceptOnLoop();
}

void Agent::pauseAcceptOnLoop() {
  if (accept_paused_ || !listen_fd_.valid()) return;
  accept_paused_ = true;
  loop_.removeFd(listen_fd_.get());
  loop_.addTimer(kAcceptPause, [this] {
    accept_paused_ = false;
    if (stopping_) return;
    Status st = loop_.addFd(listen_fd_.get(), EPOLLIN, [this](uint32_t) { onAcceptOnLoop(); });
    if (!st.isOk()) ipcLog()->error("cannot watch the agent socket again: {}", st.toString());
    if (!spare_fd_.valid()) spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  });
}

void Agent::closeLateHandshakesOnLoop() {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(opts_.limits.handshake_timeout_s);
  std::vector<uint64_t> late;
  for (auto& [id, c] : conns_) {
    if (c->job_id.empty() && now - c->accepted_at >= limit) late.push_back(id);
  }
  for (uint64_t id : late) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    std::ostringstream secs;
    secs << opts_.limits.handshake_timeout_s;
    refuseFrameOnLoop(
        *it->second,
        timedOut("no admitted Hello within " + secs.str() +
                 " s of connecting (--handshake-timeout-s): the kolo agent closes the connection"),
        "handshake", true);
  }
}

void Agent::refuseFrameOnLoop(ClientConn& c, const Status& st, const std::string& frame,
                              bool close, int retry_after_ms) {
  log::rateLimited(g_refuse_log, *ipcLog(), spdlog::level::warn,
                   "refusing {} from pid {} uid {}: {}", frame, c.pid(), c.uid(), st.message());
  ipc::AgentFrame f;
  f.mutable_refused()->set_code(static_cast<int>(st.code()));
  f.mutable_refused()->set_message(st.message());
  f.mutable_refused()->set_frame(frame);
  f.mutable_refused()->set_retry_after_ms(retry_after_ms);
  (void)c.send(f);
  if (close && c.id() != 0) dropClientOnLoop(c.id(), "was refused (" + st.message() + ")");
}

void Agent::onSocketOnLoop(uint64_t conn_id, uint32_t events) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  ClientConn& c = *it->second;
  bool more = false;
  Status st = readAvailable(c.socketFd(), &c.decoder(), &c.receivedFds(), kReadBudget, &more);
  std::string payload;
  while (c.decoder().next(&payload)) {
    handleFrameOnLoop(c, payload);
    if (conns_.find(conn_id) == conns_.end()) return;  // dropped while handling
  }
  if (!st.isOk()) {
    if (st.code() == Code::kInvalidArgument) {
      log::rateLimited(g_drop_log, *ipcLog(), spdlog::level::warn,
                       "dropping connection from pid {}: {}", c.pid(), st.message());
      dropClientOnLoop(conn_id, "sent a malformed frame (" + st.message() + ")");
    } else {
      dropClientOnLoop(conn_id, c.said_goodbye ? "shut down" : "closed its connection");
    }
    return;
  }
  if (!more && (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) {
    dropClientOnLoop(conn_id, c.said_goodbye ? "shut down" : "closed its connection");
  }
}

void Agent::handleFrameOnLoop(ClientConn& c, const std::string& payload) {
  // Clients never send descriptors; close any they did.
  c.receivedFds().clear();
  ipc::ClientFrame f;
  if (!f.ParseFromString(payload)) {
    log::rateLimited(g_drop_log, *ipcLog(), spdlog::level::warn,
                     "dropping connection from pid {}: undecodable frame of {} bytes", c.pid(),
                     payload.size());
    dropClientOnLoop(c.id(), "sent an undecodable frame");
    return;
  }
  if (c.job_id.empty() && f.msg_case() != ipc::ClientFrame::kHello) {
    // Before admission only Hello: nothing else may act on the agent (the
    // timeline is the agent's, not an anonymous caller's).
    const char* what = f.msg_case() == ipc::ClientFrame::kGoodbye    ? "Goodbye"
                       : f.msg_case() == ipc::ClientFrame::kTimeline ? "TimelineControl"
                                                                     : "unknown";
    refuseFrameOnLoop(
        c,
        permissionDenied(std::string("a ") + what +
                         " frame before admission: the kolo agent takes only Hello until the "
                         "trainer is admitted to a job"),
        what, true);
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
      Status st = trainerTimelineOnLoop(c, f.timeline());
      if (!st.isOk()) {
        refuseFrameOnLoop(c, st, "TimelineControl", false);
      } else if (f.timeline().want_reply()) {
        ipc::AgentFrame reply;
        reply.mutable_notice()->set_kind("timeline");
        reply.mutable_notice()->set_message(timeline_->active() ? timeline_->path() : "stopped");
        (void)c.send(reply);
      }
      return;
    }
    default:
      log::rateLimited(g_drop_log, *ipcLog(), spdlog::level::warn,
                       "dropping connection from pid {}: unknown frame type", c.pid());
      dropClientOnLoop(c.id(), "sent an unknown frame");
      return;
  }
}

void Agent::refuseOnLoop(ClientConn& c, const Status& st) {
  log::rateLimited(g_refuse_log, *ipcLog(), spdlog::level::warn, "refusing pid {}: {}", c.pid(),
                   st.message());
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
    return refuse("the probe read from pid " + std::to_string(c.pid()) + " does not match what it sent");
  }
  c.direct_proc = *proc;
  c.direct_min_bytes = opts_.direct_min_bytes;
  w->set_direct_min_bytes(opts_.direct_min_bytes);
  if (opts_.direct_alone_min_bytes > 0) {
    w->set_direct_alone_min_bytes(std::max(opts_.direct_min_bytes, opts_.direct_alone_min_bytes));
  }
}

void Agent::handleHelloOnLoop(ClientConn& c, const ipc::Hello& h) {
  if (h.protocol_version() != kIpcProtocolVersion) {
    return refuseOnLoop(c, invalidArgument("protocol version " + std::to_string(h.protocol_version()) +
                                          " is not supported by this agent (speaks " +
                                          std::to_string(kIpcProtocolVersion) + ")"));
  }
  if (draining_ || stopping_) return refuseOnLoop(c, unavailable("the kolo agent is draining and admits no new trainers"));
  // Every size in the Hello within its bound before anything is sized by it.
  if (Status b = checkHelloBounds(h, opts_.limits); !b.isOk()) return refuseOnLoop(c, b);
  if (h.token().empty())
    return refuseOnLoop(c, permissionDenied("a job token is required (KOLO_JOB_TOKEN)"));
  if (h.world_size() < h.local_size()) {
    return refuseOnLoop(c, invalidArgument("world size " + std::to_string(h.world_size()) +
                                          " is smaller than local size " + std::to_string(h.local_size())));
  }
  if (h.job_settings_size() > 64) {
    return refuseOnLoop(c, invalidArgument("a Hello with " + std::to_string(h.job_settings_size()) +
                                          " job settings (at most 64)"));
  }
  auto settings = parseJobSettings({h.job_settings().begin(), h.job_settings().end()});
  if (!settings.isOk()) return refuseOnLoop(c, settings.status().withContext("job " + h.job_id()));
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
    if (job->settings != *settings) {
      return refuseOnLoop(c, invalidArgument(
          "job " + h.job_id() + " runs with per-job settings (" + job->settings.describe() +
          ") from its first trainer on this agent, but this trainer's environment gives (" +
          settings->describe() +
          "): every rank of a job must set the same KOLO_*/HOROVOD_* tuning variables"));
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
  if (auto u = conns_per_uid_.find(c->uid()); u != conns_per_uid_.end() && --u->second <= 0)
    conns_per_uid_.erase(u);
  unchargeTableOnLoop(*c, c->in_flight.size() * c->table_cost);  // what it still had in flight
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
  if (job.connectedClients() > 0 || job.executing() > 0) return;
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
  op_metrics_.direct_bytes = &metrics_.counter(
      "kolo_direct_bytes_total",
      "Payload bytes of allreduces the agent read in the trainers' own memory (direct user-memory path; "
      "one rank's tensor per op)");
  op_metrics_.streamed_bytes =
      &metrics_.counter("kolo_streamed_copy_bytes_total",
                        "Payload bytes of allreduces across agents that the agent began while "
                        "their trainers were still "
                        "copying them into the arena (streamed copy-in; one rank's tensor per op)");
  op_metrics_.streamed_out_bytes =
      &metrics_.counter("kolo_streamed_copy_out_bytes_total",
                        "Result bytes of streamed allreduces across agents that the agent told "
                        "their trainers were final chunk by chunk, before the op completed "
                        "(streamed copy-out; summed over the ranks)");
  op_metrics_.split_bytes =
      &metrics_.counter("kolo_split_bytes_total",
                        "Payload bytes of allreduces the ranks of a job on this agent reduced "
                        "themselves, each its share (split reduction; the tensor's bytes per op)");
  op_metrics_.negotiation = &metrics_.histogram("kolo_negotiation_seconds",
                                                "From a name's first local submission to node-ready");
}

void Agent::updateGaugesOnLoop() {
  int clients = 0;
  for (auto& [id, c] : conns_) clients += !c->job_id.empty();
  metrics_.gauge("kolo_clients", "Trainer processes connected to this agent").set(clients);
  metrics_.gauge("kolo_jobs", "Jobs with ranks on this agent").set(static_cast<double>(jobs_.size()));
  metrics_
      .gauge("kolo_agent_draining",
             "1 while the agent is drained (kolo drain): it admits no new trainers")
      .set(draining_ ? 1 : 0);
}

}  // namespace kolo
