// Agent lifecycle: start (socket, gRPC status service, metrics, coordinator
// registration, timers), run and stop; the stall check and the metrics.
#include "agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "agent/gpu/device_api.h"
#include "agent/rpc/status_service.h"
#include "common/log.h"
#include "common/sd_notify.h"
#include "common/unix_socket.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent"); }
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
