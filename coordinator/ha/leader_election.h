// Leader election among kolo-coordinators sharing an etcd prefix.
//
// Each coordinator holds an etcd lease (TTL = --election-ttl-ms, rounded up
// to whole seconds; etcd may raise it to its minimum), renewed every TTL/3
// by the "coord-lease" thread. The "coord-elect" thread campaigns: a Txn
// that creates the election key P leader = the advertise address, bound to
// the lease, if the key does not exist. The winner is the leader; the
// others read who leads and watch the key until it is deleted (the leader
// resigned, or its lease expired), then campaign again.
//
// A leader counts its lease valid until the send time of the last
// acknowledged renewal + TTL (etcd starts the TTL later than that), and
// gives up leadership (lost()) 10% of the TTL before: its keep-alives are
// not acknowledged in time, etcd says the lease is gone, or the key is no
// longer the one it created (fenced: the leader watches its own key, and
// checks it after each renewal). The sink's writes are guarded by the
// same key (persist/etcd_sink.h), so a leader that has not noticed yet
// cannot write either.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "coordinator/ha/etcd_client.h"

namespace kolo::coordinator::ha {

struct ElectionOptions {
  std::string key;    // e.g. /kolo/default/leader
  std::string value;  // this coordinator's advertise address (host:port)
  std::chrono::milliseconds ttl{5000};
};

struct ElectionCallbacks {
  // Won: the key was created at `create_revision` under `lease_id`. Runs on
  // the election thread; a non-ok status gives leadership up again (the
  // process then exits: lost() is called).
  std::function<Status(int64_t create_revision)> elected;
  // The lease is known valid until `serve_until_ms` (steady clock, ms, the
  // step-down margin taken off): after each renewal (lease thread).
  std::function<void(int64_t serve_until_ms)> renewed;
  // A standby read who leads ("" none), election thread.
  std::function<void(const std::string& leader)> leader_seen;
  // Leadership is gone (any thread of this class). Called at most once.
  std::function<void(const Status& why)> lost;
};

class LeaderElection {
 public:
  LeaderElection(EtcdClient* client, ElectionOptions options, ElectionCallbacks callbacks);
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Grants the lease (bounded by the client's call timeout) and starts the
  // threads.
  Status start();
  // Stops campaigning; a leader deletes its key by revoking its lease, so a
  // standby takes over at once. Idempotent.
  void stop();

  bool isLeader() const { return leader_.load(); }
  // The leader's address as last read ("" if none known).
  std::string leaderAddress() const;
  int64_t leaseId() const { return lease_id_.load(); }
  std::chrono::milliseconds grantedTtl() const { return std::chrono::seconds(ttl_s_.load()); }

 private:
  void leaseMain();
  void electMain();
  void loseLeadership(const Status& why);
  // Waits `d` or until stop(); false when stopping.
  bool sleepFor(std::chrono::milliseconds d);
  Status grantLease();

  EtcdClient* client_;
  ElectionOptions options_;
  ElectionCallbacks callbacks_;

  std::atomic<int64_t> lease_id_{0};
  std::atomic<int64_t> ttl_s_{0};
  std::atomic<bool> leader_{false};
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> create_revision_{0};
  // Steady-clock ms until which this process may consider its lease alive.
  std::atomic<int64_t> lease_valid_until_ms_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string leader_address_;
  WatchCanceller watch_canceller_;  // stop() ends the election thread's watch
  std::thread lease_thread_;
  std::thread elect_thread_;
};

}  // namespace kolo::coordinator::ha
