// The job-scoped key-value store used for bootstrap (NCCL unique ids, UCX
// worker addresses). Loop-owned, no locking. A reader may wait for a key:
// it leaves a one-shot waiter that runs when the key is put, or with
// nullopt when the waiter expires or the job's keys are dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kolo::coordinator {

class KvStore {
 public:
  using WaiterId = uint64_t;
  using Waiter = std::function<void(std::optional<std::string> value)>;
  using Slot = std::pair<std::string, std::string>;  // (job_id, key)

  void put(const std::string& job_id, const std::string& key, std::string value);
  std::optional<std::string> get(const std::string& job_id, const std::string& key) const;

  // Runs `fn` once: with the value when the key is put, or with nullopt from
  // expireWaiter()/eraseJob()/failAllWaiters(). The key must be absent now.
  WaiterId addWaiter(const std::string& job_id, const std::string& key, Waiter fn);
  // Runs the waiter with nullopt if it is still pending; a no-op otherwise.
  void expireWaiter(WaiterId id);
  // Drops every key of the job and releases its waiters with nullopt.
  void eraseJob(const std::string& job_id);
  // Releases every waiter with nullopt (shutdown).
  void failAllWaiters();

  size_t keyCount(const std::string& job_id) const;
  size_t waiterCount() const { return waiter_keys_.size(); }
  // What one job holds (quotas: coordinator/quotas.h), kept as keys change.
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;  // keys + values
    size_t waiters = 0;
  };
  Usage usage(const std::string& job_id) const;
  size_t totalBytes() const { return total_bytes_; }
  // Every key of every job (snapshots).
  const std::map<Slot, std::string>& values() const { return values_; }

 private:
  std::map<Slot, std::string> values_;
  std::map<Slot, std::vector<std::pair<WaiterId, Waiter>>> waiters_;
  std::unordered_map<WaiterId, Slot> waiter_keys_;
  WaiterId next_waiter_ = 1;
  std::map<std::string, Usage> usage_;  // by job
  size_t total_bytes_ = 0;
  void dropWaiterUsage(const std::string& job_id);
};

}  // namespace kolo::coordinator
