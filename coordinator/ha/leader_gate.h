// What the gRPC handlers check first when the coordinator runs with etcd
// (--etcd-endpoints): a standby, or a leader that lost its lease, answers
// every Coordinator RPC with UNAVAILABLE "standby: ..." naming the leader,
// so clients given several coordinator addresses try the next one.
#pragma once

#include <grpcpp/support/status.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

namespace kolo::coordinator::ha {

class LeaderGate {
 public:
  bool leading() const { return leading_.load(); }
  void setLeading(bool on) { leading_.store(on); }
  void setLeaderAddress(std::string address) {
    std::lock_guard<std::mutex> lock(mu_);
    leader_address_ = std::move(address);
  }

  // nullopt while leading; else the answer for every RPC.
  std::optional<grpc::Status> refusal() const {
    if (leading_.load()) return std::nullopt;
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
  mutable std::mutex mu_;
  std::string leader_address_;
};

}  // namespace kolo::coordinator::ha
