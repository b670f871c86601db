#include "agent/coord/coord_client.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/coord/listener_owner.h"
#include "common/config_grpc.h"
#include "common/fd.h"
#include "common/log.h"
#include "common/tcp_probe.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent.coord"); }

}  // namespace

std::string coordinatorUnreachableHint(const std::string& address, const GrpcClientSecurity& s) {
  int err = tcpConnectError(address, std::chrono::milliseconds(500));
  if (err == 0) return tlsHint(s, "coordinator");
  if (err == EHOSTUNREACH && address.find(':') != std::string::npos) {
    return " (nothing answers at " + address +
           ": the name does not resolve or the host is unreachable)";
  }
  return " (nothing is listening at " + address + ": " + std::strerror(err) +
         "; is kolo-coordinator running there? check --coordinator)";
}

Status fromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return okStatus();
  Code c = Code::kInternal;
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: c = Code::kUnavailable; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: c = Code::kTimedOut; break;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION: c = Code::kInvalidArgument; break;
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED: c = Code::kPermissionDenied; break;
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED: c = Code::kAborted; break;
    default: break;
  }
  return Status(c, what + ": " + s.error_message());
}

namespace {
std::vector<std::string> addressList(const std::string& address) {
  auto list = parseCoordinatorList(address, "--coordinator");
  // The agent's config checked it; an unchecked string is used as it is.
  return list.isOk() ? list.value() : std::vector<std::string>{address};
}

std::chrono::system_clock::time_point toSystem(std::chrono::steady_clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - std::chrono::steady_clock::now());
}
}  // namespace

CoordClient::CoordClient(std::string address, coord::AgentInfo self, EventLoop& loop,
                         GrpcClientSecurity security)
    : address_(std::move(address)),
      self_(std::move(self)),
      loop_(loop),
      security_(std::move(security)),
      endpoints_(addressList(address_)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  // No BDP probing: the channel carries heartbeats and small answers, and
  // every read would otherwise cost the coordinator a PING to answer
  // (thousands of agents: thousands of writes a second).
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (const auto& a : endpoints_.all()) {
    stubs_[a] = coord::Coordinator::NewStub(makeSecureChannel(a, security_, args));
  }
  if (!security_.token.empty() && !security_.tls) {
    logger()->warn("a bearer token is set for the coordinator at {} but TLS is off: the token crosses the "
                   "network in clear text (give --coordinator-ca)", address_);
  }
}

void CoordClient::prepare(grpc::ClientContext& ctx) const { addBearerToken(ctx, security_); }

grpc::Status CoordClient::verifyServer(const std::string& address) const {
  if (security_.tls) return grpc::Status::OK;  // the certificate is the check
  Status st = checkPlainCoordinator(address, security_.server_uid);
  if (st.isOk()) return grpc::Status::OK;
  log::rateLimited(squat_log_, *logger(), spdlog::level::err, "{}", st.message());
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, st.message());
}

std::string CoordClient::agentSecret() const {
  std::lock_guard<std::mutex> lock(secret_mu_);
  return agent_secret_;
}

std::string CoordClient::jobToken(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(secret_mu_);
  auto it = tokens_.find(job_id);
  return it == tokens_.end() ? std::string() : it->second;
}

CoordEndpoints::Next CoordClient::failOver(const std::string& from, const std::string& why) {
  CoordEndpoints::Next next = endpoints_.failed(from, why);
  if (next.switched && next.address != from) {
    log::rateLimited(switch_log_, *logger(), spdlog::level::warn, "coordinator at {} unavailable ({}); trying {}{}",
                     from, why, next.address, next.hinted ? " (the leader it named)" : "");
  }
  return next;
}

void CoordClient::answered(const std::string& address) {
  endpoints_.succeeded(address);
  std::lock_guard<std::mutex> lock(answered_mu_);
  if (answered_ == address) return;
  if (!answered_.empty()) logger()->info("now using the coordinator at {} (was {})", address, answered_);
  answered_ = address;
}

bool CoordClient::pause(std::chrono::milliseconds d) {
  if (d.count() <= 0) return !stop_.load();
  std::unique_lock<std::mutex> lock(hb_mu_);
  return !hb_cv_.wait_for(lock, d, [&] { return stop_.load(); });
}

std::string CoordClient::triedText(const std::map<std::string, std::string>& errors) const {
  if (endpoints_.size() == 1) return "at " + endpoints_.all()[0];
  std::string s = "at " + endpoints_.joined() + " (";
  bool first = true;
  for (const auto& a : endpoints_.all()) {
    auto it = errors.find(a);
    s += std::string(first ? "" : "; ") + a + ": " + (it == errors.end() ? "not tried" : it->second);
    first = false;
  }
  return s + ")";
}

CoordClient::Outcome CoordClient::callWithFailover(Clock::time_point deadline, std::chrono::milliseconds per_try,
                                                   bool idempotent, const Rpc& rpc, grpc::ClientContext** track) {
  Outcome out;
  const bool several = endpoints_.size() > 1;
  while (true) {
    out.address = endpoints_.current();
    grpc::ClientContext ctx;
    ctx.set_deadline(toSystem(std::min<Clock::time_point>(deadline, Clock::now() + per_try)));
    prepare(ctx);
    if (track != nullptr) {
      std::lock_guard<std::mutex> lock(register_mu_);
      if (stop_.load()) {
        out.status = grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
        return out;
      }
      *track = &ctx;  // shutdown() cancels it: a stop does not wait for its deadline
    }
    out.status = verifyServer(out.address);
    if (!out.status.ok()) return out;
    out.status = rpc(stub(out.address), ctx);
    if (track != nullptr) {
      std::lock_guard<std::mutex> lock(register_mu_);
      *track = nullptr;
    }
    if (out.status.ok()) {
      answered(out.address);
      return out;
    }
    // No answer in time counts as unavailable too: a host that died without
    // closing its connections, or a frozen process. The next call (or the
    // next try, if time is left) goes to the next address; a slow leader
    // that is fine costs one standby's answer, which names it.
    const auto code = out.status.error_code();
    const bool no_answer = code == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!several || stop_.load() || (code != grpc::StatusCode::UNAVAILABLE && !no_answer)) return out;
    out.errors[out.address] = out.status.error_message();
    if (!idempotent && !neverReachedLeader(out.status.error_message())) return out;
    CoordEndpoints::Next next = failOver(out.address, out.status.error_message());
    if (Clock::now() + next.wait >= deadline) return out;
    if (!pause(next.wait)) return out;
  }
}

std::chrono::milliseconds CoordClient::perTry(std::chrono::milliseconds timeout) const {
  // A leader normally answers well within its loop's 5 s
  // (CoordinatorService::kLoopTimeout); past that, the next address gets
  // the rest of the time (these calls are idempotent: a slow leader that
  // answers later is asked again, through a standby's hint).
  return endpoints_.size() > 1 ? std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5)) : timeout;
}

std::chrono::milliseconds CoordClient::failoverBudget(std::chrono::milliseconds usual) const {
  return endpoints_.size() > 1 ? std::max(usual, watch_retry_) : usual;
}

CoordClient::~CoordClient() { shutdown(); }

void CoordClient::cancelRegistration() {
  register_cancelled_ = true;
  {
    std::lock_guard<std::mutex> lock(register_mu_);
    if (register_ctx_ != nullptr) register_ctx_->TryCancel();
  }
  hb_cv_.notify_all();
}

// RegisterAgent may go again anywhere: it carries previous_secret, and a
// registration presenting the secret the coordinator holds is the same
// process again (it keeps its jobs; docs/coordinator.md "Reconciliation").
// The first registration has no jobs to lose. (One narrow case: a
// re-registration that the old leader journaled but whose answer was lost
// makes the new leader hold a secret this agent never got; the retry then
// counts as a new incarnation and ends this agent's jobs, as a restart
// would. It needs the agent to be forgotten and the leader to die inside one
// RegisterAgent.)
Status CoordClient::registerAgent(std::chrono::steady_clock::time_point deadline) {
  Status last;
  const bool several = endpoints_.size() > 1;
  std::map<std::string, Status> failures;  // address -> its last failure (several addresses)
  const auto started = std::chrono::steady_clock::now();
  log::RateLimiter waiting_log(std::chrono::seconds(10), 1);
  (void)waiting_log.admit();  // the first line comes after 10 s of waiting
  while (!stop_.load() && !register_cancelled_.load()) {
    const std::string address = endpoints_.current();
    grpc::ClientContext ctx;
    auto now = std::chrono::steady_clock::now();
    auto left = std::min<std::chrono::steady_clock::duration>(deadline - now, std::chrono::seconds(2));
    ctx.set_deadline(std::chrono::system_clock::now() + std::max<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(50)));
    // One address: wait for it to come up. Several: fail fast and try the next.
    ctx.set_wait_for_ready(!several);
    if (grpc::Status v = verifyServer(address); !v.ok()) {
      // Another user's listener (a port taken while the coordinator is
      // down): nothing is sent; the real one may come back before the deadline.
      last = Status(Code::kPermissionDenied, "cannot register with the coordinator at " + address +
                                                 ": " + v.error_message());
      if (several) failOver(address, v.error_message());
      if (std::chrono::steady_clock::now() >= deadline || !pause(std::chrono::milliseconds(200)))
        return last;
      continue;
    }
    prepare(ctx);
    coord::RegisterAgentRequest req;
    *req.mutable_agent() = self_;
    // The same process registering again keeps its jobs; see the proto.
    req.set_previous_secret(agentSecret());
    coord::RegisterAgentReply rep;
    {
      std::lock_guard<std::mutex> lock(register_mu_);
      register_ctx_ = &ctx;
    }
    grpc::Status s = register_cancelled_.load()
                         ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")
                         : stub(address).RegisterAgent(&ctx, req, &rep);
    {
      std::lock_guard<std::mutex> lock(register_mu_);
      register_ctx_ = nullptr;
    }
    if (register_cancelled_.load()) break;
    if (s.ok()) {
      answered(address);
      {
        std::lock_guard<std::mutex> lock(secret_mu_);
        agent_secret_ = rep.agent_secret();
      }
      heartbeat_ms_ = rep.heartbeat_interval_ms() > 0 ? rep.heartbeat_interval_ms() : 1000;
      stream_heartbeat_ms_ = rep.stream_heartbeat_interval_ms() > 0
                                 ? rep.stream_heartbeat_interval_ms()
                                 : heartbeat_ms_;
      logger()->info("registered with coordinator {} as {} (lease {} ms)", address,
                     self_.agent_id(), rep.lease_ms());
      return okStatus();
    }
    last = fromGrpc(s, "cannot register with the coordinator at " + address);
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      // A missing or wrong token does not get better by retrying.
      return Status(last.code(), last.message() +
                                     (security_.token.empty()
                                          ? " (give the token with --coordinator-token-file or KOLO_COORDINATOR_TOKEN)"
                                          : " (check --coordinator-token / --coordinator-token-file)"));
    }
    const bool unreachable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    std::chrono::milliseconds wait(200);
    if (several && unreachable) {
      failures[address] = last;
      CoordEndpoints::Next next = failOver(address, s.error_message());
      wait = next.wait;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      // Only now: the hint probes the address (a TLS hint only if something answers).
      if (several && unreachable) {
        std::string msg = "cannot register with the coordinator at any of " + endpoints_.joined() + ": ";
        bool first = true;
        for (const auto& a : endpoints_.all()) {
          auto it = failures.find(a);
          std::string why = it == failures.end() ? std::string("not tried before the deadline")
                                                 : it->second.message().substr(it->second.message().find(": ") + 2);
          // The hint probes the address; a standby answered, so it has none.
          if (it != failures.end() && why.rfind("standby:", 0) != 0 &&
              (it->second.code() == Code::kUnavailable || it->second.code() == Code::kTimedOut)) {
            why += coordinatorUnreachableHint(a, security_);
          }
          msg += std::string(first ? "" : "; ") + a + ": " + why;
          first = false;
        }
        last = Status(last.code(), msg);
      } else if (unreachable) {
        last =
            Status(last.code(), last.message() + coordinatorUnreachableHint(address, security_));
      }
      break;
    }
    if (waiting_log.admit()) {
      auto waited = std::chrono::duration_cast<std::chrono::seconds>(
          std::chrono::steady_clock::now() - started);
      auto left = std::chrono::duration_cast<std::chrono::seconds>(
          deadline - std::chrono::steady_clock::now());
      logger()->warn("still waiting for the coordinator at {} after {} s ({}); giving up in {} s",
                     address_, waited.count(), s.error_message(), left.count());
    }
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
    if (wait.count() > 0) {
      std::unique_lock<std::mutex> lock(hb_mu_);
      hb_cv_.wait_for(lock, wait, [&] { return stop_.load() || register_cancelled_.load(); });
    }
  }
  if (register_cancelled_.load() || last.isOk()) {
    return aborted("stopped while waiting for the coordinator at " + address_);
  }
  return last;
}

// Heartbeats go anywhere: renewing a lease twice is harmless. After a
// failover the new leader knows the agent (same state, a fresh lease) and
// answers known=true; one that does not gets a registration.
struct CoordClient::HbStream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<coord::HeartbeatRequest, coord::HeartbeatReply>> rw;
  std::thread reader;
  std::atomic<bool> ended{false};      // Read returned false
  std::atomic<bool> forgotten{false};  // an answer said known = false
  std::atomic<uint64_t> answers{0};
  uint64_t asked = 0;  // heartbeats sent without quiet; heartbeat thread only
};

grpc::Status CoordClient::closeHeartbeatStream(bool cancel) {
  if (!hb_stream_) return grpc::Status::OK;
  if (cancel) hb_stream_->ctx.TryCancel();
  {
    std::lock_guard<std::mutex> lock(register_mu_);
    hb_stream_ctx_ = nullptr;
  }
  if (hb_stream_->reader.joinable()) hb_stream_->reader.join();
  grpc::Status st = hb_stream_->rw->Finish();
  hb_stream_.reset();
  return st;
}

grpc::Status CoordClient::streamHeartbeat() {
  if (hb_stream_) {
    HbStream& h = *hb_stream_;
    // Asked for an answer a heartbeat ago and none came: the coordinator is
    // frozen or the connection is gone without a reset.
    const bool silent = h.answers.load() < h.asked;
    if (h.ended.load() || silent) {
      grpc::Status st = closeHeartbeatStream(silent);
      if (silent) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "no answer on the heartbeat stream within " +
                                std::to_string(stream_heartbeat_ms_) + " ms");
      }
      return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the heartbeat stream ended")
                     : st;
    }
  }
  if (!hb_stream_) {
    if (grpc::Status v = verifyServer(endpoints_.current()); !v.ok()) return v;
    auto h = std::make_unique<HbStream>();
    prepare(h->ctx);
    {
      std::lock_guard<std::mutex> lock(register_mu_);
      if (stop_.load()) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
      hb_stream_ctx_ = &h->ctx;
    }
    h->rw = stub(endpoints_.current()).HeartbeatStream(&h->ctx);
    HbStream* raw = h.get();
    h->reader = std::thread([this, raw] {
      log::setThreadName("coord-hb-read");
      coord::HeartbeatReply rep;
      while (raw->rw->Read(&rep)) {
        raw->answers++;
        if (!rep.known()) {
          raw->forgotten = true;
          std::lock_guard<std::mutex> lock(hb_mu_);
          hb_wake_ = true;
          hb_cv_.notify_all();
        }
      }
      raw->ended = true;
      std::lock_guard<std::mutex> lock(hb_mu_);
      hb_wake_ = true;
      hb_cv_.notify_all();
    });
    hb_stream_ = std::move(h);
  }
  HbStream& h = *hb_stream_;
  coord::HeartbeatRequest req;
  req.set_agent_id(self_.agent_id());
  req.set_agent_secret(agentSecret());
  const bool ask = ++hb_beats_ % kAskEveryBeats == 0;
  req.set_quiet(!ask);
  if (ask) h.asked = h.answers.load() + 1;
  if (!h.rw->Write(req)) {
    grpc::Status st = closeHeartbeatStream(false);
    return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the heartbeat stream ended") : st;
  }
  return grpc::Status::OK;
}

void CoordClient::startHeartbeats() {
  // A list of addresses: unary heartbeats, whose failover is callWithFailover's.
  hb_unary_only_ = endpoints_.size() > 1;
  if (hb_unary_only_) hb_unary_seen_ = true;
  heartbeat_ = std::thread([this] {
    log::setThreadName("coord-hb");
    // On the stream the longer interval (RegisterAgentReply), unary calls
    // the shorter one.
    auto interval = [this] {
      return std::chrono::milliseconds(hb_unary_only_ ? heartbeat_ms_ : stream_heartbeat_ms_);
    };
    auto next = Clock::now() + interval();
    // (Not once refused as replaced: registering would take the id back.)
    auto registerAgain = [this] {
      if (replaced_logged_) return;
      logger()->warn("coordinator forgot this agent; registering again");
      (void)registerAgent(std::chrono::steady_clock::now() + std::chrono::seconds(2));
    };
    auto workingAgain = [this](const std::string& address) {
      if (heartbeat_failures_ == 0) return;
      logger()->info("heartbeats to {} work again after {} failed", address, heartbeat_failures_);
      heartbeat_failures_ = 0;
    };
    while (!stop_.load()) {
      {
        std::unique_lock<std::mutex> lock(hb_mu_);
        hb_cv_.wait_until(lock, next, [&] { return stop_.load() || hb_wake_; });
        hb_wake_ = false;
      }
      if (stop_.load()) break;
      // The stream's news: an answer known = false (register again now), or
      // its end (a heartbeat now, as a unary call if the stream fails again).
      // The reader wakes this thread for both, so every answer known = false
      // is seen here.
      if (hb_stream_ && hb_stream_->forgotten.exchange(false)) {
        registerAgain();
        continue;
      }
      if (Clock::now() < next && !(hb_stream_ && hb_stream_->ended.load())) continue;
      next = Clock::now() + interval();
      if (!hb_unary_only_) {
        grpc::Status s = streamHeartbeat();
        if (s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) {
          if (s.ok()) workingAgain(endpoints_.current());
          continue;
        }
        if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
          logger()->info(
              "the coordinator at {} has no HeartbeatStream; heartbeats go as Heartbeat calls",
              endpoints_.current());
          hb_unary_only_ = true;
          hb_unary_seen_ = true;
        } else {
          logger()->debug("heartbeat stream to {}: {}; a Heartbeat call instead",
                          endpoints_.current(), s.error_message());
        }
        // Below: this heartbeat as a unary call (its errors logged there).
      }
      coord::HeartbeatRequest req;
      req.set_agent_id(self_.agent_id());
      req.set_agent_secret(agentSecret());
      coord::HeartbeatReply rep;
      const std::chrono::milliseconds interval(heartbeat_ms_);
      Outcome o = callWithFailover(
          Clock::now() + interval, interval, true,
          [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) { return st.Heartbeat(&ctx, req, &rep); },
          &heartbeat_ctx_);
      const grpc::Status& s = o.status;
      if (stop_.load()) break;
      if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        // Another process registered this agent id since (a second agent with
        // the same --agent-id): registering again would fail its jobs, and
        // it would do the same to ours. Say so and let the lease run out.
        if (!replaced_logged_) {
          logger()->error(
              "the coordinator at {} refuses this agent's heartbeats: {} (is another "
              "agent running with id {}?)",
              o.address, s.error_message(), self_.agent_id());
          replaced_logged_ = true;
        }
        continue;  // (its reply says known = false: registering would take the id back)
      } else if (!s.ok()) {
        // Once, then at most every 30 s while the coordinator stays away.
        ++heartbeat_failures_;
        log::rateLimited(heartbeat_log_, *logger(), spdlog::level::warn,
                         "heartbeat to {} failed ({} in a row): {}", o.address, heartbeat_failures_,
                         s.error_message());
        continue;
      }
      workingAgain(o.address);
      if (!rep.known()) registerAgain();
    }
    (void)closeHeartbeatStream(true);
  });
}

// What every JoinJob from this agent carries.
coord::JoinJobRequest CoordClient::joinRequest(const std::string& job_id, const std::string& token,
                                               int local_size, int world_size) const {
  coord::JoinJobRequest req;
  req.set_job_id(job_id);
  req.set_token(token);
  req.set_agent_id(self_.agent_id());
  req.set_agent_secret(agentSecret());
  req.set_local_size(local_size);
  req.set_world_size(world_size);
  return req;
}

// joinAndWatch's JoinJob, with failover within its budget: OK, or the
// refusal the watch posts.
Status CoordClient::joinJob(const std::string& job_id, const std::string& token, int local_size,
                            int world_size, const ElasticParams& elastic) {
  coord::JoinJobRequest req = joinRequest(job_id, token, local_size, world_size);
  req.set_min_size(elastic.min_size);
  req.set_max_size(elastic.max_size);
  req.set_elastic_timeout_ms(elastic.timeout_ms);
  coord::JoinJobReply rep;
  const auto timeout = failoverBudget(std::chrono::seconds(10));
  Outcome o = callWithFailover(Clock::now() + timeout, perTry(timeout), true,
                               [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) {
                                 return st.JoinJob(&ctx, req, &rep);
                               });
  if (!o.status.ok())
    return fromGrpc(o.status, "the coordinator at " + o.address + " refused job " + job_id);
  return okStatus();
}

// Why a job's watch ended for good: its last status, at each address tried.
Status CoordClient::lostWatch(const std::string& job_id, const grpc::Status& last,
                              const std::map<std::string, std::string>& errors) const {
  Status st =
      fromGrpc(last.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended") : last,
               "lost the watch on job " + job_id + " at coordinator " + endpoints_.all()[0]);
  if (endpoints_.size() > 1) {  // each address with why it failed
    st = Status(st.code(), "lost the watch on job " + job_id + " at coordinators " +
                               triedText(errors).substr(3));
  }
  return st;
}

// JoinJob (without reset/admit) may go again anywhere: the same agent
// joining a FORMING job again only sets its local_size again, a member's
// retried join of a RUNNING job with the same sizes is OK, and a retried
// elastic join stays in the waiting list once (docs/coordinator.md "Jobs").
void CoordClient::joinAndWatch(const std::string& job_id, const std::string& token,
                               int local_size, int world_size, WorldCallback cb,
                               ElasticParams elastic) {
  auto w = std::make_shared<Watch>();
  w->ctx = std::make_unique<grpc::ClientContext>();
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (auto it = watches_.find(job_id); it != watches_.end()) {
      it->second->cancelled = true;
      if (it->second->ctx) it->second->ctx->TryCancel();
      if (it->second->thread.joinable()) it->second->thread.detach();
    }
    watches_[job_id] = w;
  }
  {
    std::lock_guard<std::mutex> lock(secret_mu_);
    tokens_[job_id] = token;
  }
  w->thread = std::thread([this, w, job_id, token, local_size, world_size, cb, elastic] {
    log::setThreadName("coord-watch");
    auto post = [this, cb](StatusOr<coord::World> r) {
      loop_.post([cb, r = std::move(r)]() mutable { cb(std::move(r)); });
    };
    if (Status joined = joinJob(job_id, token, local_size, world_size, elastic); !joined.isOk()) {
      post(joined);
      return;
    }
    // The watch survives a coordinator restart or failover: when the stream
    // breaks, it is opened again (a recovered coordinator or a new leader
    // sends the same World), at the next address when the one in use is
    // unavailable, until `watch_retry` passes without success.
    std::unique_ptr<grpc::ClientContext> ctx;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      ctx = std::move(w->ctx);
    }
    auto give_up = std::chrono::steady_clock::now() + watch_retry_;
    grpc::Status last;
    std::map<std::string, std::string> errors;  // address -> why its watch failed
    while (!stop_.load()) {
      const std::string address = endpoints_.current();
      coord::WatchJobRequest req;
      req.set_agent_secret(agentSecret());  // the stream counts as the job's own agent's
      req.set_job_id(job_id);
      req.set_agent_id(self_.agent_id());
      req.set_token(token);
      req.set_brief(true);  // agent_ops.cc reads no addresses, and no agents before RUNNING
      req.set_local_size_runs(true);  // compact_world.cc reads them
      if (ctx) prepare(*ctx);
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        w->ctx = std::move(ctx);
        if (w->cancelled) break;
      }
      if (grpc::Status v = verifyServer(address); !v.ok()) {
        last = v;
        break;
      }
      auto reader = stub(address).WatchJob(w->ctx.get(), req);
      coord::World world;
      bool got = false, terminal = false;
      while (reader->Read(&world)) {
        if (!got) answered(address);
        got = true;
        post(world);
        if (world.state() == coord::FAILED || world.state() == coord::FINISHED) {
          terminal = true;
          break;
        }
      }
      last = reader->Finish();
      if (terminal || last.error_code() == grpc::StatusCode::CANCELLED || stop_.load()) return;
      if (last.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
          last.error_code() == grpc::StatusCode::NOT_FOUND) {
        break;  // the coordinator does not know the job (any more): no point retrying
      }
      if (got) {
        give_up = std::chrono::steady_clock::now() + watch_retry_;
        errors.clear();
      }
      errors[address] = last.error_message();
      if (std::chrono::steady_clock::now() >= give_up) break;
      std::chrono::milliseconds wait(250);
      if (endpoints_.size() > 1 && !got && last.error_code() == grpc::StatusCode::UNAVAILABLE) {
        // It did not open here: go to the next address (the stream of one
        // that just broke is first opened again where it was).
        wait = failOver(address, last.error_message()).wait;
      } else {
        logger()->warn("watch on job {} broke ({}); opening it again", job_id, last.error_message());
      }
      if (!pause(wait)) break;
      ctx = std::make_unique<grpc::ClientContext>();
    }
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      cancelled = w->cancelled;
    }
    if (!stop_.load() && !cancelled) post(lostWatch(job_id, last, errors));
  });
}

void CoordClient::stopWatch(const std::string& job_id) {
  std::shared_ptr<Watch> w;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    auto it = watches_.find(job_id);
    if (it == watches_.end()) return;
    w = it->second;
    watches_.erase(it);
    w->cancelled = true;
    if (w->ctx) w->ctx->TryCancel();
  }
  // Join off the caller's thread: the watcher may be blocked in a post.
  oneshot_.submit([w] {
    if (w->thread.joinable()) w->thread.join();
  });
}

// JoinJob with reset or admit is not idempotent (a repeated reset seals one
// more generation), so it goes to another address only when the call never
// reached a leader (a standby's answer, a connection refused).
void CoordClient::requestGeneration(const std::string& job_id, const std::string& token, int local_size,
                                    int world_size, const std::string& reason, bool admit) {
  oneshot_.submit([this, job_id, token, local_size, world_size, reason, admit] {
    coord::JoinJobRequest req = joinRequest(job_id, token, local_size, world_size);
    req.set_reset(!admit);
    req.set_admit(admit);
    req.set_reason(reason);
    coord::JoinJobReply rep;
    const auto timeout = std::chrono::seconds(3);
    Outcome o = callWithFailover(
        Clock::now() + timeout, timeout, false,
        [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) { return st.JoinJob(&ctx, req, &rep); });
    if (!o.status.ok()) {
      logger()->warn("asking for a new generation of job {} failed: {}", job_id, o.status.error_message());
    }
  });
}

// LeaveJob may go again anywhere: a second failed=true is ignored (the
// first failure wins), and a second clean leave of a member that already
// left changes nothing (at worst NOT_FOUND, logged).
void CoordClient::leave(const std::string& job_id, bool failed, const std::string& reason) {
  oneshot_.submit([this, job_id, failed, reason] {
    coord::LeaveJobRequest req;
    req.set_job_id(job_id);
    req.set_token(jobToken(job_id));
    req.set_agent_id(self_.agent_id());
    req.set_agent_secret(agentSecret());
    req.set_failed(failed);
    req.set_reason(reason);
    coord::LeaveJobReply rep;
    // Long enough for a new leader to be elected: a leave lost in a failover
    // would leave the job RUNNING there for good (its agents heartbeat on).
    const auto timeout = failoverBudget(std::chrono::seconds(3));
    Outcome o = callWithFailover(
        Clock::now() + timeout, std::chrono::seconds(3), true,
        [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) { return st.LeaveJob(&ctx, req, &rep); });
    if (!o.status.ok()) logger()->warn("LeaveJob({}) failed: {}", job_id, o.status.error_message());
  });
}

// KvPut may go again anywhere: it writes the same value under the same key.
Status CoordClient::kvPut(const std::string& job_id, const std::string& token,
                          const std::string& key, const std::string& value) {
  coord::KvPutRequest req;
  req.set_job_id(job_id);
  req.set_token(token);
  req.set_key(key);
  req.set_value(value);
  coord::KvPutReply rep;
  const auto timeout = failoverBudget(std::chrono::seconds(10));
  Outcome o = callWithFailover(
      Clock::now() + timeout, perTry(timeout), true,
      [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) { return st.KvPut(&ctx, req, &rep); });
  return fromGrpc(o.status, "KvPut " + key);
}

// KvGet is a read: a wait that the old leader ended (UNAVAILABLE) goes on
// at the next address with what is left of it.
StatusOr<std::string> CoordClient::kvGet(const std::string& job_id, const std::string& token,
                                         const std::string& key, std::chrono::milliseconds wait) {
  const auto wait_end = Clock::now() + wait;
  coord::KvGetRequest req;
  req.set_job_id(job_id);
  req.set_token(token);
  req.set_key(key);
  coord::KvGetReply rep;
  const auto timeout = wait + std::chrono::seconds(5);
  Outcome o = callWithFailover(Clock::now() + timeout, timeout, true,
                               [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) {
                                 auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     wait_end - Clock::now());
                                 req.set_wait_ms(static_cast<uint64_t>(std::max<int64_t>(left.count(), 0)));
                                 return st.KvGet(&ctx, req, &rep);
                               });
  RETURN_IF_ERROR(fromGrpc(o.status, "KvGet " + key));
  if (!rep.found()) return timedOut("key " + key + " did not appear within " + std::to_string(wait.count()) + " ms");
  return rep.value();
}

void CoordClient::deregister(std::chrono::milliseconds timeout) {
  const std::string secret = agentSecret();
  if (secret.empty() || stop_.load()) return;
  coord::HeartbeatRequest req;
  req.set_agent_id(self_.agent_id());
  req.set_agent_secret(secret);
  req.set_leaving(true);
  coord::HeartbeatReply rep;
  Outcome o = callWithFailover(
      Clock::now() + timeout, timeout, true,
      [&](coord::Coordinator::Stub& st, grpc::ClientContext& ctx) { return st.Heartbeat(&ctx, req, &rep); });
  if (o.status.ok()) {
    logger()->info("deregistered from the coordinator at {}", o.address);
  } else {
    logger()->info(
        "could not deregister from the coordinator at {} ({}); it will see the lease expire",
        o.address, o.status.error_message());
  }
}

void CoordClient::shutdown() {
  if (stop_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(register_mu_);
    if (heartbeat_ctx_ != nullptr) heartbeat_ctx_->TryCancel();
    if (hb_stream_ctx_ != nullptr) hb_stream_ctx_->TryCancel();
    if (register_ctx_ != nullptr) register_ctx_->TryCancel();
  }
  hb_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  std::map<std::string, std::shared_ptr<Watch>> ws;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    ws.swap(watches_);
  }
  for (auto& [id, w] : ws) {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      w->cancelled = true;
      if (w->ctx) w->ctx->TryCancel();
    }
    if (w->thread.joinable()) w->thread.join();
  }
}

}  // namespace kolo
