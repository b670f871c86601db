// Quotas on what a tenant can grow in the coordinator (issue 47): watch
// streams per job token and per peer with capacity reserved for the jobs'
// own agents, jobs, KV keys, bytes and waiters, and the size of the
// listings. Each bound is a flag (flags.cc); each refusal is
// RESOURCE_EXHAUSTED and names the quota and its flag
// (docs/security.md, "Attacks on the coordinator (issue 47)").
#pragma once

#include <grpcpp/support/status.h>

#include <cstddef>
#include <map>
#include <string>
#include <unordered_map>

namespace kolo::coordinator {

struct WatchLimits;
class WatchQueue;

struct Quotas {
  // Of --max-watch-streams, this many are kept for streams of a job's own
  // agents (the request carries the agent's secret and the agent is a
  // member of the job, or waits to join it). Every other stream (a CLI, a
  // tenant's own client) shares the rest.
  size_t reserved_watch_streams = 4096;  // --reserved-watch-streams -1: a quarter of the total
  size_t watch_streams_per_token = 256;  // non-member streams on jobs of one token
  size_t watch_streams_per_peer = 2048;  // non-member streams from one peer address
  size_t watch_streams_per_member = 4;   // one member agent's streams on one job
  size_t max_jobs = 16384;               // jobs known at once (active and retained)
  size_t jobs_per_agent = 256;           // active jobs one agent is in (or waits for)
  size_t kv_keys_per_job = 4096;
  size_t kv_bytes_per_job = size_t{16} << 20;  // keys + values
  size_t kv_bytes_total = size_t{512} << 20;
  size_t kv_waiters_per_job = 1024;           // KvGet calls waiting on one job's keys
  size_t kv_waiters_total = 16384;            // ... on all jobs' keys (about 15 KB each)
  size_t list_reply_bytes = size_t{3} << 20;  // ListJobs / ListAgents: truncated past it
};

// RESOURCE_EXHAUSTED "<what> refused: <quota> (--<flag> <limit>)".
grpc::Status quotaRefusal(const std::string& what, const std::string& quota, const char* flag,
                          size_t limit);

// The watch streams open, by what they count against. Loop-only.
class WatchAccounting {
 public:
  struct Ticket {
    std::string job_id;
    std::string token;
    std::string peer;      // the peer's address without its port
    std::string agent_id;  // a member's streams only
    bool member = false;
  };
  // OK and counts the stream under `queue`, or the refusal naming the
  // quota. `hub_total`: streams open now (WatchHub::totalCount()).
  grpc::Status admit(const Quotas& q, const WatchLimits& limits, size_t hub_total, Ticket t,
                     const WatchQueue* queue);
  void release(const WatchQueue* queue);
  size_t others() const { return others_; }
  size_t open() const { return tickets_.size(); }

 private:
  void count(const Ticket& t, int delta);
  std::unordered_map<const WatchQueue*, Ticket> tickets_;
  std::map<std::string, size_t> per_token_, per_peer_, per_member_;
  size_t others_ = 0;
};

// "ipv4:127.0.0.1:5123" -> "ipv4:127.0.0.1" (a peer's host, the unit of
// the per-peer quota).
std::string peerHost(const std::string& peer);

}  // namespace kolo::coordinator
