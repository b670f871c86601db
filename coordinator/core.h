// The coordinator's state, composed of focused managers: Membership (agents,
// leases, jobs, generations), KvStore (job-scoped keys) and WatchHub (World
// streams). Everything here runs on the one loop thread (...OnLoop); the
// gRPC handlers (service.cc) reach it only through EventLoop::post/call.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/event_loop.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership/membership.h"
#include "coordinator/watch_hub.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator {

// KvGet waits at most this long, whatever the client asks.
inline constexpr uint64_t kMaxKvWaitMs = 60 * 1000;

class Core {
 public:
  Core(EventLoop* loop, MembershipOptions options, const Clock* clock);
  ~Core();

  // Arms the lease-expiry and retention timers.
  void startOnLoop();
  // Ends every watch stream and KV wait, refuses new ones, stops the timers.
  void shutdownOnLoop();

  grpc::Status registerAgentOnLoop(const coord::RegisterAgentRequest& req,
                                   coord::RegisterAgentReply* reply);
  coord::HeartbeatReply heartbeatOnLoop(const coord::HeartbeatRequest& req);
  grpc::Status joinJobOnLoop(const coord::JoinJobRequest& req);
  grpc::Status leaveJobOnLoop(const coord::LeaveJobRequest& req);

  // Checks the token, queues the current World on `queue` and subscribes it
  // to every later change of the job.
  grpc::Status watchOnLoop(const coord::WatchJobRequest& req, std::shared_ptr<WatchQueue> queue);
  void unwatchOnLoop(const std::string& job_id, const WatchQueue* queue);

  grpc::Status kvPutOnLoop(const coord::KvPutRequest& req);
  // Calls `done` (on the loop, maybe at once) with the value, or with nullopt
  // when the key did not appear within min(wait_ms, kMaxKvWaitMs). `done` is
  // not called when an error is returned.
  using KvDone = std::function<void(std::optional<std::string>)>;
  grpc::Status kvGetOnLoop(const coord::KvGetRequest& req, KvDone done);

  coord::ListJobsReply listJobsOnLoop() const;
  coord::ListAgentsReply listAgentsOnLoop() const;

  const Membership& membership() const { return membership_; }

 private:
  // Pushes new Worlds to watchers; drops the keys and watchers of removed jobs.
  void applyOnLoop(const Changes& changes);
  grpc::Status refuseIfShuttingDown() const;

  EventLoop* loop_;
  Membership membership_;
  KvStore kv_;
  WatchHub watches_;
  EventLoop::TimerId lease_timer_ = 0;
  EventLoop::TimerId retention_timer_ = 0;
  bool shutting_down_ = false;
};

}  // namespace kolo::coordinator
