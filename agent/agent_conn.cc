// The local IPC socket: accepting connections within the socket bounds,
// reading and dispatching frames, refusing them, dropping connections.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "agent/agent.h"
#include "agent/ipc/limits.h"
#include "common/log.h"
#include "common/unix_socket.h"

namespace kolo {

namespace {
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
    Status st =
        loop_.addFd(fd, EPOLLIN | EPOLLRDHUP, [this, id](uint32_t ev) { onSocketOnLoop(id, ev); });
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
      ClientConn refused(0, UniqueFd(fd), cred.isOk() ? cred->pid : -1,
                         cred.isOk() ? cred->uid : 0);
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

void Agent::refuseFrameOnLoop(ClientConn& c, const Status& st, const std::string& frame, bool close,
                              int retry_after_ms) {
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
    case ipc::ClientFrame::kDeviceEvents:
      deviceEventsOnLoop(c, f.device_events());
      return;
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
    std::string reason = "rank " + std::to_string(rank) + " (pid " + std::to_string(c->pid()) +
                         ") on " + opts_.hostname + " " + why +
                         " without shutting down: it exited, crashed or was killed";
    ipcLog()->warn("job {}: {}", job.id(), reason);
    if (job.elastic.enabled() && job.state() == JobState::kRunning && job.connectedClients() > 0) {
      elasticRankLostOnLoop(job, c->local_rank, reason);  // the others wait for it to restart
    } else {
      failJobOnLoop(job, peerFailure(reason), true);  // elastic: the coordinator drops this agent
    }
  }
  maybeRemoveJobOnLoop(job.id());
}

}  // namespace kolo
