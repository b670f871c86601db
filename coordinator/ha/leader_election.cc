#include "coordinator/ha/leader_election.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"

namespace kolo::coordinator::ha {

namespace {

using std::chrono::milliseconds;

int64_t nowMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LeaderElection::LeaderElection(EtcdClient* client, ElectionOptions options,
                               ElectionCallbacks callbacks)
    : client_(client), options_(std::move(options)), callbacks_(std::move(callbacks)) {}

LeaderElection::~LeaderElection() { stop(); }

std::string LeaderElection::leaderAddress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_address_;
}

bool LeaderElection::sleepFor(milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stopping_; });
}

Status LeaderElection::grantLease() {
  int64_t want_s = std::max<int64_t>(1, (options_.ttl.count() + 999) / 1000);
  int64_t sent = nowMs();
  ASSIGN_OR_RETURN(EtcdClient::Lease lease, client_->leaseGrant(want_s));
  if (lease.ttl_s != want_s) {
    log::get("coord.ha")
        ->info("etcd granted a {} s lease ({} s asked: etcd's minimum TTL)", lease.ttl_s, want_s);
  }
  ttl_s_.store(lease.ttl_s);
  lease_valid_until_ms_.store(sent + lease.ttl_s * 1000);
  lease_id_.store(lease.id);
  return okStatus();
}

Status LeaderElection::start() {
  RETURN_IF_ERROR(grantLease());
  lease_thread_ = std::thread([this] { leaseMain(); });
  elect_thread_ = std::thread([this] { electMain(); });
  return okStatus();
}

void LeaderElection::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  watch_canceller_.cancel();
  if (elect_thread_.joinable()) elect_thread_.join();
  if (lease_thread_.joinable()) lease_thread_.join();
  int64_t id = lease_id_.load();
  if (id != 0) {
    // Deletes our key if we lead: a standby takes over without waiting for the TTL.
    Status st = client_->leaseRevoke(id);
    if (!st.isOk()) log::get("coord.ha")->warn("revoking lease {:x}: {}", id, st.message());
  }
  leader_.store(false);
}

void LeaderElection::loseLeadership(const Status& why) {
  if (lost_.exchange(true)) return;
  leader_.store(false);
  log::get("coord.ha")->critical("lost leadership: {}", why.message());
  if (callbacks_.lost) callbacks_.lost(why);
}

void LeaderElection::leaseMain() {
  log::setThreadName("coord-lease");
  auto logger = log::get("coord.ha");
  int64_t next_renewal = 0;
  bool failing = false;
  while (sleepFor(milliseconds(25))) {
    int64_t ttl_ms = ttl_s_.load() * 1000;
    int64_t margin = std::max<int64_t>(ttl_ms / 10, 100);
    int64_t now = nowMs();
    bool leading = leader_.load();
    if (leading && now >= lease_valid_until_ms_.load() - margin) {
      loseLeadership(unavailable(fmt::format(
          "etcd at {} did not renew the election lease within its {} ms TTL (unreachable?): "
          "stepping down so that no two coordinators serve",
          client_->endpointsText(), ttl_ms)));
      continue;
    }
    if (now < next_renewal) continue;
    milliseconds timeout = client_->callTimeout();
    if (leading) {
      timeout = std::min(timeout, milliseconds(std::max<int64_t>(
                                      50, lease_valid_until_ms_.load() - margin - now)));
    }
    auto ttl = client_->leaseKeepAlive(lease_id_.load(), timeout);
    if (!ttl.isOk()) {
      if (!failing) logger->warn("renewing the election lease: {}", ttl.status().message());
      failing = true;
      next_renewal = nowMs() + 200;
      continue;
    }
    if (failing && *ttl > 0) logger->info("etcd renews the election lease again");
    failing = false;
    if (*ttl <= 0) {
      if (leader_.load()) {
        loseLeadership(aborted("etcd says the election lease expired"));
        continue;
      }
      // A standby just needs a new one (etcd answers again after more than
      // the TTL without renewals: a partition, a hung etcd).
      logger->info("etcd answers again but the election lease {:x} expired there; taking a new one",
                   lease_id_.load());
      Status st = grantLease();
      if (!st.isOk()) {
        next_renewal = nowMs() + 200;
        continue;
      }
    } else {
      lease_valid_until_ms_.store(now + *ttl * 1000);
    }
    if (callbacks_.renewed) {
      callbacks_.renewed(lease_valid_until_ms_.load() -
                         std::max<int64_t>(ttl_s_.load() * 1000 / 10, 100));
    }
    next_renewal = now + std::max<int64_t>(ttl_s_.load() * 1000 / 3, 100);
    if (leader_.load()) {
      // Fencing check: the key must still be the one we created.
      auto key = client_->range(options_.key);
      if (key.isOk() &&
          (key->kvs_size() == 0 || key->kvs(0).create_revision() != create_revision_.load())) {
        loseLeadership(
            aborted(fmt::format("fenced: the election key {} is {}", options_.key,
                                key->kvs_size() == 0 ? "gone" : "held by " + key->kvs(0).value())));
      }
    }
  }
}

void LeaderElection::electMain() {
  log::setThreadName("coord-elect");
  auto logger = log::get("coord.ha");
  bool failing = false;
  std::string seen;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (lost_.load()) {
      sleepFor(milliseconds(1000));
      continue;
    }
    etcdserverpb::TxnRequest txn;
    auto* cmp = txn.add_compare();
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_key(options_.key);
    cmp->set_create_revision(0);  // absent
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(options_.key);
    put->set_value(options_.value);
    put->set_lease(lease_id_.load());
    txn.add_failure()->mutable_request_range()->set_key(options_.key);
    auto resp = client_->txn(txn);
    if (!resp.isOk()) {
      if (!failing) logger->warn("campaigning for leadership: {}", resp.status().message());
      failing = true;
      if (!sleepFor(milliseconds(200))) return;
      continue;
    }
    failing = false;
    int64_t revision = resp->header().revision();
    if (resp->succeeded()) {
      create_revision_.store(revision);
      leader_.store(true);
      {
        std::lock_guard<std::mutex> lock(mu_);
        leader_address_ = options_.value;
      }
      logger->info("elected leader (key {} at revision {}, lease {:x}, TTL {} s)", options_.key,
                   revision, lease_id_.load(), ttl_s_.load());
      if (callbacks_.renewed) {
        callbacks_.renewed(lease_valid_until_ms_.load() -
                           std::max<int64_t>(ttl_s_.load() * 1000 / 10, 100));
      }
      Status st = callbacks_.elected ? callbacks_.elected(revision) : okStatus();
      if (!st.isOk()) loseLeadership(st);
      // Watch our own key: deleted (by hand, or the lease expired while
      // this process could not tell) means another coordinator may win at
      // once; stop serving now rather than at the next renewal's check.
      while (!lost_.load()) {
        auto deleted =
            client_->waitDeleted(options_.key, revision, milliseconds(1000), &watch_canceller_);
        if (deleted.isOk() && *deleted) {
          loseLeadership(
              aborted(fmt::format("fenced: the election key {} was deleted", options_.key)));
          break;
        }
        if (!deleted.isOk() && !sleepFor(milliseconds(200))) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_; });
      return;
    }
    std::string leader;
    if (resp->responses_size() > 0 && resp->responses(0).response_range().kvs_size() > 0) {
      leader = resp->responses(0).response_range().kvs(0).value();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      leader_address_ = leader;
    }
    if (leader != seen) {
      logger->info("standby: the leader is {}", leader.empty() ? "(none)" : leader);
      seen = leader;
    }
    if (callbacks_.leader_seen) callbacks_.leader_seen(leader);
    if (leader.empty()) continue;  // deleted since: campaign again
    // Wait (bounded, so stop() is prompt) for the key to go.
    auto deleted =
        client_->waitDeleted(options_.key, revision + 1, milliseconds(1000), &watch_canceller_);
    if (!deleted.isOk()) {
      if (!sleepFor(milliseconds(200))) return;
    }
  }
}

}  // namespace kolo::coordinator::ha
