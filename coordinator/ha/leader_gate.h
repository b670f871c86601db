// What the gRPC handlers check first when the coordinator runs with etcd
// (--etcd-endpoints): a standby, or a leader that lost its lease, answers
// every Coordinator RPC with UNAVAILABLE "standby: ..." naming the leader,
// so clients given several coordinator addresses try the next one.
#pragma once

#include <grpcpp/support/status.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace kolo::coordinator::ha {

class LeaderGate {
 public:
  // Leading, and the lease is known valid now: checked on every RPC, so a
  // leader whose election threads are stuck (a hung etcd call) still stops
  // serving before its lease can expire in etcd.
  bool leading() const {
    if (!leading_.load()) return false;
    int64_t until = serve_until_ms_.load();
    return until == 0 || steadyNowMs() < until;
  }
  void setLeading(bool on) { leading_.store(on); }
  // Steady-clock ms after which not to serve (0: no limit).
  void setServeUntil(int64_t steady_ms) { serve_until_ms_.store(steady_ms); }
  static int64_t steadyNowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void setLeaderAddress(std::string address) {
    std::lock_guard<std::mutex> lock(mu_);
    leader_address_ = std::move(address);
  }

  // nullopt while leading; else the answer for every RPC.
  std::optional<grpc::Status> refusal() const {
    if (leading()) return std::nullopt;
    std::string leader;
    {
      std::lock_guard<std::mutex> lock(mu_);
      leader = leader_address_;
    }
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        leader.empty()
            ? "standby: this kolo-coordinator is not the leader; no leader is elected yet"
            : "standby: this kolo-coordinator is not the leader; the leader is at " + leader);
  }

 private:
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> serve_until_ms_{0};
  mutable std::mutex mu_;
  std::string leader_address_;
};

}  // namespace kolo::coordinator::ha
