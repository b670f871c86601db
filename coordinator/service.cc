#include "coordinator/service.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "common/log.h"
#include "coordinator/membership/secrets.h"

namespace kolo::coordinator {

namespace {

template <typename Reply>
struct Answer {
  grpc::Status status;
  Reply reply;
  uint64_t seq = 0;      // the last journal record when the call was done
  bool pending = false;  // job records of the call are still to be journaled
};

grpc::Status shuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
}

}  // namespace

template <typename Reply>
grpc::Status CoordinatorService::onLoop(std::function<grpc::Status(Core*, Reply*)> fn, Reply* reply,
                                        bool durable) {
  Core* core = core_;
  // The closure owns copies of everything it needs: if the loop answers late
  // the handler is gone, but the closure still runs safely.
  auto answer = loop_->call<Answer<Reply>>(
      [core, fn = std::move(fn)] {
        Answer<Reply> a;
        a.status = fn(core, &a.reply);
        a.seq = core->lastRecordSeqOnLoop();
        a.pending = core->jobRecordsPendingOnLoop();
        return a;
      },
      kLoopTimeout);
  if (answer.isOk() && durable && sink_ != nullptr && answer->pending) {
    // The group commit was posted behind the call: this turn runs after it.
    auto seq = loop_->call<uint64_t>([core] { return core->lastRecordSeqOnLoop(); }, kLoopTimeout);
    if (!seq.isOk()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "coordinator busy: " + seq.status().message());
    }
    answer->seq = *seq;
  }
  if (!answer.isOk()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "coordinator busy: " + answer.status().message());
  }
  if (durable && sink_ != nullptr && answer->seq > 0) {
    Status st = sink_->waitDurable(answer->seq, kLoopTimeout);
    if (!st.isOk()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the coordinator could not persist the change: " + st.message());
    }
  }
  *reply = std::move(answer->reply);
  return answer->status;
}

template <typename Reply>
void CoordinatorService::answerDurably(grpc::ServerUnaryReactor* reactor, Reply* reply,
                                       std::function<grpc::Status(Core*, Reply*)> fn) {
  // `reply` stays valid until Finish. The service outlives every call: the
  // server waits for them to finish before it is destroyed.
  loop_->post([this, reactor, reply, fn = std::move(fn)] {
    Core* core = core_;
    grpc::Status st = fn(core, reply);
    if (notifier_ == nullptr) {
      reactor->Finish(st);
      return;
    }
    auto wait = [this, reactor, st](uint64_t seq) {
      if (seq == 0) {
        reactor->Finish(st);
        return;
      }
      notifier_->notify(seq, kLoopTimeout, [reactor, st](Status durable) {
        if (!durable.isOk()) {
          reactor->Finish(
              grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "the coordinator could not persist the change: " + durable.message()));
          return;
        }
        reactor->Finish(st);
      });
    };
    if (core->jobRecordsPendingOnLoop()) {
      // The group commit was posted behind the call: this turn runs after it.
      loop_->post([core, wait] { wait(core->lastRecordSeqOnLoop()); });
    } else {
      wait(core->lastRecordSeqOnLoop());
    }
  });
}

grpc::Status CoordinatorService::checkBearer(const grpc::ServerContextBase* ctx,
                                             const char* method) const {
  if (auth_token_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        fmt::format("{} needs a bearer token: this coordinator runs with "
                                    "--auth-token-file; send the metadata 'authorization: Bearer "
                                    "<token>'",
                                    method));
  }
  std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kScheme = "Bearer ";
  if (value.size() < kScheme.size() || value.substr(0, kScheme.size()) != kScheme) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        fmt::format("{}: the authorization metadata must be 'Bearer <token>'", method));
  }
  if (!constantTimeEquals(value.substr(kScheme.size()), auth_token_)) {
    log::get("coord")->warn("{} refused from {}: wrong bearer token", method, ctx->peer());
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        fmt::format("{}: the bearer token is not valid for this coordinator", method));
  }
  return grpc::Status::OK;
}

bool CoordinatorService::byOperator(const grpc::ServerContextBase* ctx) const {
  if (operator_token_.empty()) return false;
  const auto& md = ctx->client_metadata();
  auto it = md.find("x-kolo-operator-token");
  if (it == md.end()) return false;
  std::string_view value(it->second.data(), it->second.size());
  if (constantTimeEquals(value, operator_token_)) return true;
  log::get("coord")->warn("RegisterAgent from {}: wrong operator token, ignored", ctx->peer());
  return false;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterAgent(grpc::CallbackServerContext* ctx,
                                                            const coord::RegisterAgentRequest* req,
                                                            coord::RegisterAgentReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auto st = refusal(ctx, "RegisterAgent"); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  const bool by_operator = byOperator(ctx);
  answerDurably<coord::RegisterAgentReply>(
      reactor, reply, [req, by_operator](Core* c, coord::RegisterAgentReply* r) {
        return c->registerAgentOnLoop(*req, r, by_operator);
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const coord::HeartbeatRequest* req,
                                                        coord::HeartbeatReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auto st = standby(); st) {
    reactor->Finish(*st);
    return reactor;
  }
  if (shutting_down_->load()) {
    reactor->Finish(shuttingDown());
    return reactor;
  }
  // `req` and `reply` stay valid until Finish, which the loop calls.
  loop_->post(
      [core = core_, req, reply, reactor] { reactor->Finish(core->heartbeatOnLoop(*req, reply)); });
  return reactor;
}

// One HeartbeatStream. A heartbeat read is answered on the loop, in one
// turn with the others read meanwhile (queueHeartbeat); the next read starts
// once the answer is written, so one heartbeat per stream is in flight. A
// quiet heartbeat the coordinator knows gets no answer: the next read starts
// on the loop at once (kolo-agent's usual heartbeat: no write, no write
// callback per beat).
// Deletes itself in OnDone.
class HeartbeatStreamReactor final
    : public grpc::ServerBidiReactor<coord::HeartbeatRequest, coord::HeartbeatReply> {
 public:
  explicit HeartbeatStreamReactor(CoordinatorService* service) : service_(service) {
    service_->trackHeartbeatStream(this, true);
    read();
  }

  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      // end() finished the stream while this read was outstanding: nothing
      // may touch the stream once it finished (OnDone may delete it).
      if (finished_) return;
    }
    if (!ok) {  // the agent closed its side, or went away
      finish(grpc::Status::OK);
      return;
    }
    if (auto st = service_->standby(); st) {
      finish(*st);
      return;
    }
    service_->queueHeartbeat(this);
  }

  // On the loop: the heartbeat read, as Heartbeat would answer it.
  void answerOnLoop(Core* core) {
    reply_.Clear();
    grpc::Status st = core->heartbeatOnLoop(req_, &reply_);
    if (!st.ok()) {
      finish(st);
      return;
    }
    if (req_.quiet() && reply_.known()) {
      read();
      return;
    }
    StartWrite(&reply_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "the agent went away"));
      return;
    }
    read();
  }

  // Any thread: ends the stream now if it waits for a heartbeat, else once
  // the heartbeat in hand is answered.
  void end(const grpc::Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      end_ = why;
      // Decided under the lock, with the read's completion (OnReadDone):
      // either the read is outstanding and the stream finishes here (the
      // read then ends with ok=false and returns), or the heartbeat read is
      // queued and its answer ends the stream (read() sees end_).
      if (!reading_) return;
      finished_ = true;
    }
    Finish(why);
  }

  void OnDone() override {
    service_->trackHeartbeatStream(this, false);
    delete this;
  }

 private:
  void read() {
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      end = end_;
      if (!end) {
        reading_ = true;
        // Under the lock, so that end() cannot finish the stream between
        // the decision and the read (StartRead after Finish). Safe: a
        // server read never completes inline (OnReadDone runs later, on
        // gRPC's thread), unlike Finish, which is never called under mu_.
        StartRead(&req_);
        return;
      }
    }
    finish(*end);
  }

  void finish(const grpc::Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(st);
  }

  CoordinatorService* service_;
  coord::HeartbeatRequest req_;
  coord::HeartbeatReply reply_;
  std::mutex mu_;
  bool reading_ = false;  // a read is outstanding
  bool finished_ = false;
  std::optional<grpc::Status> end_;  // end() was called
};

grpc::ServerBidiReactor<coord::HeartbeatRequest, coord::HeartbeatReply>*
CoordinatorService::HeartbeatStream(grpc::CallbackServerContext* ctx) {
  (void)ctx;
  auto* stream = new HeartbeatStreamReactor(this);
  if (auto st = standby(); st) stream->end(*st);
  if (shutting_down_->load()) stream->end(shuttingDown());
  return stream;
}

void CoordinatorService::trackHeartbeatStream(HeartbeatStreamReactor* stream, bool open) {
  std::optional<grpc::Status> ended;
  {
    std::lock_guard<std::recursive_mutex> lock(hb_mu_);
    if (!open) {
      hb_streams_.erase(stream);
      return;
    }
    hb_streams_.insert(stream);
    ended = hb_ended_;
  }
  if (ended) stream->end(*ended);
}

void CoordinatorService::endHeartbeatStreams(const grpc::Status& why) {
  // Under the lock: a stream is deleted (OnDone) only after it left the set,
  // on this thread (inline, over a copy of the set) or once this returns.
  std::lock_guard<std::recursive_mutex> lock(hb_mu_);
  hb_ended_ = why;
  std::vector<HeartbeatStreamReactor*> open(hb_streams_.begin(), hb_streams_.end());
  for (HeartbeatStreamReactor* stream : open) stream->end(why);
}

void CoordinatorService::queueHeartbeat(HeartbeatStreamReactor* stream) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(hb_queue_mu_);
    first = hb_queue_.empty();
    hb_queue_.push_back(stream);
  }
  // The first heartbeat of a batch starts a short timer on the loop; those
  // read until it fires are answered with it, in one turn. At 4096 agents
  // that is one loop wake-up per kHeartbeatBatch instead of one per
  // heartbeat (each a context switch of the loop thread); a lease of
  // seconds does not notice the delay.
  if (first) {
    loop_->post([this] { loop_->addTimer(kHeartbeatBatch, [this] { answerHeartbeatsOnLoop(); }); });
  }
}

void CoordinatorService::answerHeartbeatsOnLoop() {
  std::vector<HeartbeatStreamReactor*> batch;
  {
    std::lock_guard<std::mutex> lock(hb_queue_mu_);
    batch.swap(hb_queue_);
  }
  for (HeartbeatStreamReactor* stream : batch) stream->answerOnLoop(core_);
}

grpc::ServerUnaryReactor* CoordinatorService::JoinJob(grpc::CallbackServerContext* ctx,
                                                      const coord::JoinJobRequest* req,
                                                      coord::JoinJobReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auto st = refusal(ctx, "JoinJob"); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  answerDurably<coord::JoinJobReply>(
      reactor, reply, [req](Core* c, coord::JoinJobReply*) { return c->joinJobOnLoop(*req); });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::LeaveJob(grpc::CallbackServerContext* ctx,
                                                       const coord::LeaveJobRequest* req,
                                                       coord::LeaveJobReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auto st = refusal(ctx, "LeaveJob"); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  answerDurably<coord::LeaveJobReply>(
      reactor, reply, [req](Core* c, coord::LeaveJobReply*) { return c->leaveJobOnLoop(*req); });
  return reactor;
}

// One WatchJob stream. The loop pushes Worlds on the queue; the listener
// starts a write whenever none is in flight. Deletes itself in OnDone.
class WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(EventLoop* loop, Core* core, coord::WatchJobRequest req, WorkerPool* writers,
               std::string peer)
      : loop_(loop),
        core_(core),
        req_(std::move(req)),
        peer_(std::move(peer)),
        queue_(std::make_shared<WatchQueue>()) {
    queue_->setWriters(writers);
    queue_->setListener([this] { pump(); });
  }

  // Subscribes on the loop; the first World (or the refusal) comes from
  // there, through the queue: the closure never touches the reactor, which
  // may be gone (cancelled) by the time it runs.
  void start() {
    loop_->post([core = core_, req = req_, peer = peer_, queue = queue_] {
      grpc::Status st = core->watchOnLoop(req, queue, peer);
      if (!st.ok()) queue->close(st);
    });
  }

  void OnWriteDone(bool ok) override {
    bool terminal;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      terminal = current_ != nullptr && current_->terminal;
      current_.reset();
      if (!ok || cancelled_) terminal = true;
    }
    if (!ok || cancelled_) {
      finishOnce(grpc::Status(grpc::StatusCode::CANCELLED,
                              fmt::format("watcher of job {} went away", req_.job_id())));
    } else if (terminal) {
      finishOnce(grpc::Status::OK);
    } else {
      pump();
    }
  }

  // Ends the stream before it started (a malformed request, a standby, a
  // shutdown): through the one finish guard, so that OnCancel, which gRPC
  // also runs after a non-OK Finish, cannot finish it again (issue 47: a
  // second Finish is a gRPC assertion, and the coordinator aborted).
  void refuse(const grpc::Status& st) { finishOnce(st); }

  void OnCancel() override {
    bool writing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      writing = writing_;
      if (finished_) return;
    }
    log::get("coord")->debug("job {}: watch of agent {} cancelled", req_.job_id(), req_.agent_id());
    // A write in flight ends with ok=false and finishes there.
    if (!writing) finishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    queue_->setListener(nullptr);  // no pump() runs after this
    // Posted after the subscription, so it also undoes one that came late.
    loop_->post([core = core_, job_id = req_.job_id(), queue = queue_] {
      core->unwatchOnLoop(job_id, queue.get());
    });
    delete this;
  }

 private:
  // Starts the next write, or finishes once the queue is closed.
  void pump() {
    std::shared_ptr<const PublishedWorld> world;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || finished_ || cancelled_) return;
      switch (queue_->take(&world)) {
        case WatchQueue::Next::kWorld:
          writing_ = true;
          current_ = world;
          if (auto self = world->selves.find(req_.agent_id()); self != world->selves.end()) {
            // A compact World: the shared bytes, then this agent's slot.
            grpc::Slice parts[2] = {world->bytes, self->second};
            buffer_ = grpc::ByteBuffer(parts, 2);
          } else {
            buffer_ = grpc::ByteBuffer(&world->bytes, 1);  // a reference, no copy
          }
          break;
        case WatchQueue::Next::kClosed:
          break;
        case WatchQueue::Next::kTimeout:
          return;
      }
    }
    if (world != nullptr) {
      StartWrite(&buffer_);
    } else {
      grpc::Status why = queue_->closeStatus();
      log::get("coord")->debug("job {}: watch of agent {} closed: {}", req_.job_id(),
                               req_.agent_id(), why.error_message());
      finishOnce(why);
    }
  }

  void finishOnce(const grpc::Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(st);
  }

  EventLoop* loop_;
  Core* core_;  // only dereferenced on the loop
  const coord::WatchJobRequest req_;
  const std::string peer_;
  std::shared_ptr<WatchQueue> queue_;
  std::mutex mu_;
  bool writing_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  std::shared_ptr<const PublishedWorld> current_;  // keeps buffer_'s bytes alive
  grpc::ByteBuffer buffer_;
};

int CoordinatorService::watchWritersFor(int requested) {
  if (requested > 0) return requested;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  coord::WatchJobRequest req;
  grpc::Status st;
  if (!grpc::SerializationTraits<coord::WatchJobRequest>::Deserialize(
           const_cast<grpc::ByteBuffer*>(request), &req)
           .ok()) {
    st = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "WatchJob: malformed request");
  } else if (shutting_down_->load()) {
    st = shuttingDown();
  } else if (auto refused = standby(); refused) {
    st = *refused;
  }
  auto* reactor = new WatchReactor(loop_, core_, std::move(req), &watch_writers_, ctx->peer());
  if (!st.ok()) {
    reactor->refuse(st);
  } else {
    reactor->start();
  }
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KvPut(grpc::CallbackServerContext* ctx,
                                                    const coord::KvPutRequest* req,
                                                    coord::KvPutReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auto st = refusal(ctx, "KvPut"); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  answerDurably<coord::KvPutReply>(
      reactor, reply, [req](Core* c, coord::KvPutReply*) { return c->kvPutOnLoop(*req); });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KvGet(grpc::CallbackServerContext* ctx,
                                                    const coord::KvGetRequest* req,
                                                    coord::KvGetReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auto st = standby(); st) {
    reactor->Finish(*st);
    return reactor;
  }
  if (shutting_down_->load()) {
    reactor->Finish(shuttingDown());
    return reactor;
  }
  // `reply` stays valid until Finish; the loop answers within wait_ms (the
  // waiter's timer), or at shutdown when every waiter is failed.
  const std::atomic<bool>* shutting_down = shutting_down_;
  loop_->post([core = core_, req = *req, reactor, reply, shutting_down] {
    grpc::Status st =
        core->kvGetOnLoop(req, [reactor, reply, shutting_down](std::optional<std::string> value) {
          if (!value.has_value() && shutting_down->load()) {
            reactor->Finish(shuttingDown());
            return;
          }
          reply->set_found(value.has_value());
          if (value.has_value()) reply->set_value(std::move(*value));
          reactor->Finish(grpc::Status::OK);
        });
    if (!st.ok()) reactor->Finish(st);
  });
  return reactor;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const coord::ListJobsRequest*,
                                          coord::ListJobsReply* reply) {
  if (auto st = standby(); st) return *st;
  return onLoop<coord::ListJobsReply>(
      [](Core* c, coord::ListJobsReply* r) {
        *r = c->listJobsOnLoop();
        return grpc::Status::OK;
      },
      reply);
}

grpc::Status CoordinatorService::ListAgents(grpc::ServerContext*, const coord::ListAgentsRequest*,
                                            coord::ListAgentsReply* reply) {
  if (auto st = standby(); st) return *st;
  return onLoop<coord::ListAgentsReply>(
      [](Core* c, coord::ListAgentsReply* r) {
        *r = c->listAgentsOnLoop();
        return grpc::Status::OK;
      },
      reply);
}

}  // namespace kolo::coordinator
