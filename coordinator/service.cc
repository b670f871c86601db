#include "coordinator/service.h"

#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string_view>

#include "common/log.h"
#include "coordinator/membership/secrets.h"

namespace kolo::coordinator {

namespace {

template <typename Reply>
struct Answer {
  grpc::Status status;
  Reply reply;
  uint64_t seq = 0;  // the last journal record when the call was done
};

// A KvGet result handed from the loop to the waiting handler thread.
class KvWait {
 public:
  void complete(std::optional<std::string> value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      value_ = std::move(value);
    }
    cv_.notify_all();
  }
  // True once complete; `out` gets the value.
  bool waitFor(std::chrono::milliseconds timeout, std::optional<std::string>* out) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) return false;
    *out = std::move(value_);
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<std::string> value_;
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
        return a;
      },
      kLoopTimeout);
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

grpc::Status CoordinatorService::checkBearer(const grpc::ServerContext* ctx,
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

grpc::Status CoordinatorService::RegisterAgent(grpc::ServerContext* ctx,
                                               const coord::RegisterAgentRequest* req,
                                               coord::RegisterAgentReply* reply) {
  if (auto st = checkBearer(ctx, "RegisterAgent"); !st.ok()) return st;
  return onLoop<coord::RegisterAgentReply>(
      [req = *req](Core* c, coord::RegisterAgentReply* r) {
        return c->registerAgentOnLoop(req, r);
      },
      reply, /*durable=*/true);
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*, const coord::HeartbeatRequest* req,
                                           coord::HeartbeatReply* reply) {
  return onLoop<coord::HeartbeatReply>(
      [req = *req](Core* c, coord::HeartbeatReply* r) { return c->heartbeatOnLoop(req, r); },
      reply);
}

grpc::Status CoordinatorService::JoinJob(grpc::ServerContext* ctx, const coord::JoinJobRequest* req,
                                         coord::JoinJobReply* reply) {
  if (auto st = checkBearer(ctx, "JoinJob"); !st.ok()) return st;
  return onLoop<coord::JoinJobReply>(
      [req = *req](Core* c, coord::JoinJobReply*) { return c->joinJobOnLoop(req); }, reply,
      /*durable=*/true);
}

grpc::Status CoordinatorService::LeaveJob(grpc::ServerContext* ctx,
                                          const coord::LeaveJobRequest* req,
                                          coord::LeaveJobReply* reply) {
  if (auto st = checkBearer(ctx, "LeaveJob"); !st.ok()) return st;
  return onLoop<coord::LeaveJobReply>(
      [req = *req](Core* c, coord::LeaveJobReply*) { return c->leaveJobOnLoop(req); }, reply,
      /*durable=*/true);
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx,
                                          const coord::WatchJobRequest* req,
                                          grpc::ServerWriter<coord::World>* writer) {
  auto queue = std::make_shared<WatchQueue>();
  coord::World unused;
  grpc::Status st = onLoop<coord::World>(
      [req = *req, queue](Core* c, coord::World*) { return c->watchOnLoop(req, queue); }, &unused);
  if (!st.ok()) return st;
  // Unsubscribe however the stream ends.
  struct Unwatch {
    EventLoop* loop;
    Core* core;
    std::string job_id;
    std::shared_ptr<WatchQueue> queue;
    ~Unwatch() {
      loop->post([core = core, job_id = job_id, queue = queue] {
        core->unwatchOnLoop(job_id, queue.get());
      });
    }
  } unwatch{loop_, core_, req->job_id(), queue};

  auto logger = log::get("coord");
  for (;;) {
    coord::World world;
    switch (queue->next(&world, kPollInterval)) {
      case WatchQueue::Next::kWorld: {
        bool terminal = isTerminal(world);
        if (!writer->Write(world)) {
          return grpc::Status(grpc::StatusCode::CANCELLED,
                              fmt::format("watcher of job {} went away", req->job_id()));
        }
        if (terminal) return grpc::Status::OK;
        break;
      }
      case WatchQueue::Next::kClosed:
        logger->debug("job {}: watch of agent {} closed: {}", req->job_id(), req->agent_id(),
                      queue->closeStatus().error_message());
        return queue->closeStatus();
      case WatchQueue::Next::kTimeout:
        break;
    }
    if (ctx->IsCancelled()) {
      logger->debug("job {}: watch of agent {} cancelled", req->job_id(), req->agent_id());
      return grpc::Status::CANCELLED;
    }
    if (shutting_down_->load()) return shuttingDown();
  }
}

grpc::Status CoordinatorService::KvPut(grpc::ServerContext* ctx, const coord::KvPutRequest* req,
                                       coord::KvPutReply* reply) {
  if (auto st = checkBearer(ctx, "KvPut"); !st.ok()) return st;
  return onLoop<coord::KvPutReply>(
      [req = *req](Core* c, coord::KvPutReply*) { return c->kvPutOnLoop(req); }, reply,
      /*durable=*/true);
}

grpc::Status CoordinatorService::KvGet(grpc::ServerContext* ctx, const coord::KvGetRequest* req,
                                       coord::KvGetReply* reply) {
  auto wait = std::make_shared<KvWait>();
  coord::KvGetReply unused;
  grpc::Status st = onLoop<coord::KvGetReply>(
      [req = *req, wait](Core* c, coord::KvGetReply*) {
        return c->kvGetOnLoop(
            req, [wait](std::optional<std::string> v) { wait->complete(std::move(v)); });
      },
      &unused);
  if (!st.ok()) return st;
  // The loop answers within wait_ms; the slack only guards against a stuck loop.
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(std::min(req->wait_ms(), kMaxKvWaitMs)) + kLoopTimeout;
  std::optional<std::string> value;
  while (!wait->waitFor(kPollInterval, &value)) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    if (shutting_down_->load()) return shuttingDown();
    if (std::chrono::steady_clock::now() > deadline) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          fmt::format("KvGet {} of job {}: the coordinator loop did not answer",
                                      req->key(), req->job_id()));
    }
  }
  if (!value.has_value() && shutting_down_->load()) return shuttingDown();
  reply->set_found(value.has_value());
  if (value.has_value()) reply->set_value(std::move(*value));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const coord::ListJobsRequest*,
                                          coord::ListJobsReply* reply) {
  return onLoop<coord::ListJobsReply>(
      [](Core* c, coord::ListJobsReply* r) {
        *r = c->listJobsOnLoop();
        return grpc::Status::OK;
      },
      reply);
}

grpc::Status CoordinatorService::ListAgents(grpc::ServerContext*, const coord::ListAgentsRequest*,
                                            coord::ListAgentsReply* reply) {
  return onLoop<coord::ListAgentsReply>(
      [](Core* c, coord::ListAgentsReply* r) {
        *r = c->listAgentsOnLoop();
        return grpc::Status::OK;
      },
      reply);
}

}  // namespace kolo::coordinator
