// A small synchronous client of etcd's v3 gRPC API (third_party/etcd): the
// calls kolo-coordinator needs for its state store (persist/etcd_sink.h)
// and its leader election (leader_election.h). Every call has a deadline;
// none is made on the coordinator loop. With several endpoints a call that
// finds one unreachable tries the next (etcd forwards writes to its raft
// leader itself). No TLS, no auth (docs/coordinator.md, "Limits").
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace kolo::coordinator::ha {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // host:port each
  // Deadline of one call to one endpoint.
  std::chrono::milliseconds call_timeout{2000};
};

// "a:1,b:2" -> {"a:1","b:2"}; InvalidArgument if empty or malformed.
StatusOr<std::vector<std::string>> parseEndpoints(const std::string& text);
// The range end that covers every key starting with `prefix`.
std::string prefixRangeEnd(const std::string& prefix);

// Ends a waitDeleted() in progress from another thread (stop()).
class WatchCanceller {
 public:
  void cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }

 private:
  friend class EtcdClient;
  // False if already cancelled.
  bool attach(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = ctx;
    return !cancelled_;
  }
  void detach() {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = nullptr;
  }
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;
  bool cancelled_ = false;
};

class EtcdClient {
 public:
  // Makes the channels; no I/O (see waitReachable).
  static StatusOr<std::unique_ptr<EtcdClient>> create(EtcdOptions options);

  // Waits until some endpoint answers a read, at most `timeout`.
  // Unavailable naming the endpoints and the last error otherwise.
  Status waitReachable(std::chrono::milliseconds timeout);

  StatusOr<etcdserverpb::RangeResponse> range(const std::string& key,
                                              const std::string& range_end = "");
  StatusOr<etcdserverpb::TxnResponse> txn(const etcdserverpb::TxnRequest& request);
  StatusOr<etcdserverpb::DeleteRangeResponse> deleteRange(const std::string& key,
                                                          const std::string& range_end = "");
  StatusOr<etcdserverpb::PutResponse> put(const std::string& key, const std::string& value,
                                          int64_t lease = 0);

  // A lease of `ttl_s` seconds (etcd may raise it to its minimum): its id and TTL.
  struct Lease {
    int64_t id = 0;
    int64_t ttl_s = 0;
  };
  StatusOr<Lease> leaseGrant(int64_t ttl_s);
  // Renews the lease once; its TTL in seconds, 0 if the lease is gone.
  // `timeout` bounds the call (at most call_timeout).
  StatusOr<int64_t> leaseKeepAlive(int64_t id, std::chrono::milliseconds timeout);
  Status leaseRevoke(int64_t id);

  // Waits until `key` is deleted at a revision >= `from_revision`, at most
  // `timeout`: true when it was, false when the time ran out; Unavailable
  // if etcd canceled the watch (e.g. that revision was compacted).
  // `canceller` (optional) ends the wait early (false).
  StatusOr<bool> waitDeleted(const std::string& key, int64_t from_revision,
                             std::chrono::milliseconds timeout,
                             WatchCanceller* canceller = nullptr);

  std::string endpointsText() const;
  std::chrono::milliseconds callTimeout() const { return options_.call_timeout; }

 private:
  explicit EtcdClient(EtcdOptions options);
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  };
  // Runs `call(endpoint, ctx)` on the current endpoint, then on the others
  // while the answer is UNAVAILABLE or DEADLINE_EXCEEDED.
  template <typename Fn>
  Status callAny(const char* what, Fn call, std::chrono::milliseconds timeout);

  EtcdOptions options_;
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
};

}  // namespace kolo::coordinator::ha
