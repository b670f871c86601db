#include "coordinator/quotas.h"

#include <fmt/format.h>

#include "common/log.h"
#include "coordinator/watch_hub.h"

namespace kolo::coordinator {

grpc::Status quotaRefusal(const std::string& what, const std::string& quota, const char* flag,
                          size_t limit) {
  std::string msg = fmt::format("{} refused: {} (--{} {})", what, quota, flag, limit);
  log::get("coord")->warn("{}", msg);
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, msg);
}

std::string peerHost(const std::string& peer) {
  auto colon = peer.rfind(':');
  auto scheme = peer.find(':');
  if (colon == std::string::npos || colon == scheme) return peer;  // "unix:/path"
  return peer.substr(0, colon);
}

namespace {
std::string memberKey(const WatchAccounting::Ticket& t) { return t.job_id + '\0' + t.agent_id; }

void bump(std::map<std::string, size_t>& m, const std::string& key, int delta) {
  size_t& n = m[key];
  n = delta > 0 ? n + 1 : (n > 0 ? n - 1 : 0);
  if (n == 0) m.erase(key);
}

size_t countOf(const std::map<std::string, size_t>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}
}  // namespace

grpc::Status WatchAccounting::admit(const Quotas& q, const WatchLimits& limits, size_t hub_total,
                                    Ticket t, const WatchQueue* queue) {
  const std::string what = fmt::format("WatchJob of job {}", t.job_id);
  if (t.member) {
    if (countOf(per_member_, memberKey(t)) >= q.watch_streams_per_member) {
      return quotaRefusal(what,
                          fmt::format("agent {} already has {} watch streams on the job",
                                      t.agent_id, countOf(per_member_, memberKey(t))),
                          "max-watch-streams-per-member", q.watch_streams_per_member);
    }
  } else {
    const size_t shared =
        limits.total > q.reserved_watch_streams ? limits.total - q.reserved_watch_streams : 0;
    if (others_ >= shared || hub_total >= limits.total) {
      return quotaRefusal(
          what,
          fmt::format("{} watch streams of callers that are not the job's own agents are open; "
                      "the other {} of --max-watch-streams {} are kept for the jobs' agents "
                      "(send agent_secret as a member agent)",
                      others_, q.reserved_watch_streams, limits.total),
          "reserved-watch-streams", q.reserved_watch_streams);
    }
    if (countOf(per_token_, t.token) >= q.watch_streams_per_token) {
      return quotaRefusal(what,
                          fmt::format("the jobs of this token already have {} watch streams of "
                                      "callers that are not their agents",
                                      countOf(per_token_, t.token)),
                          "max-watch-streams-per-token", q.watch_streams_per_token);
    }
    if (countOf(per_peer_, t.peer) >= q.watch_streams_per_peer) {
      return quotaRefusal(what,
                          fmt::format("peer {} already has {} watch streams (not as a job's agent)",
                                      t.peer, countOf(per_peer_, t.peer)),
                          "max-watch-streams-per-peer", q.watch_streams_per_peer);
    }
  }
  count(t, +1);
  tickets_.emplace(queue, std::move(t));
  return grpc::Status::OK;
}

void WatchAccounting::release(const WatchQueue* queue) {
  auto it = tickets_.find(queue);
  if (it == tickets_.end()) return;
  count(it->second, -1);
  tickets_.erase(it);
}

void WatchAccounting::count(const Ticket& t, int delta) {
  if (t.member) {
    bump(per_member_, memberKey(t), delta);
    return;
  }
  bump(per_token_, t.token, delta);
  bump(per_peer_, t.peer, delta);
  others_ = delta > 0 ? others_ + 1 : (others_ > 0 ? others_ - 1 : 0);
}

}  // namespace kolo::coordinator
