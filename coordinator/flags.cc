#include "coordinator/flags.h"

#include <fmt/format.h>

#include "coordinator/ha/etcd_client.h"

namespace kolo::coordinator {

void defineFlags(Config& config) {
  config
      .define("listen", KnobType::kString, "0.0.0.0:7470",
              "gRPC listen address host:port (port 0 picks a free port; see --ready-file)")
      .define("metrics-listen", KnobType::kString, "",
              "Prometheus /metrics HTTP address, e.g. 0.0.0.0:7473 (port 0 picks a free port; "
              "empty: off)")
      .define("ready-file", KnobType::kString, "",
              "Once serving, write 'host:port' of the bound address to this file (atomically: "
              "temp file then rename)")
      .define("lease-ms", KnobType::kInt, "5000",
              "Agent lease: an agent silent this long is lost and its jobs fail")
      .define("heartbeat-interval-ms", KnobType::kInt, "1000",
              "Heartbeat interval told to agents (must be below lease-ms)")
      .define("stream-heartbeat-interval-ms", KnobType::kInt, "0",
              "Interval of the quiet heartbeats agents send on their HeartbeatStream (must be "
              "below lease-ms); 0 = max(heartbeat-interval-ms, lease-ms / 3)")
      .define("finished-job-retention-s", KnobType::kInt, "300",
              "How long FAILED/FINISHED jobs stay listed (their keys go with them)")
      .define("state-dir", KnobType::kString, "",
              "Journal the state (jobs, generations, agents, keys) in this directory and recover "
              "it at start; empty = in memory only")
      .define("state-compact-records", KnobType::kInt, "10000",
              "Journal records after which the state is compacted into a snapshot")
      .define("state-compact-bytes", KnobType::kInt, "67108864",
              "Journal bytes after which the state is compacted into a snapshot (whichever of "
              "this and --state-compact-records comes first)")
      .define("etcd-endpoints", KnobType::kString, "",
              "Keep the state in etcd instead of --state-dir: etcd client endpoints "
              "host:port[,host:port]; coordinators sharing --etcd-prefix elect one leader, the "
              "others stand by (UNAVAILABLE 'standby: ...')")
      .define("etcd-prefix", KnobType::kString, "/kolo/default/",
              "Key prefix of this cluster's state and election key in etcd (one per cluster)")
      .define("election-ttl-ms", KnobType::kInt, "0",
              "TTL of the leader's etcd lease (whole seconds, at least etcd's minimum, 2 s by "
              "default): a dead leader is replaced after about this long; 0 = --lease-ms")
      .define("advertise-address", KnobType::kString, "",
              "host:port that standbys report as this coordinator's address when it leads; "
              "empty = the --listen host (the hostname for 0.0.0.0) and the bound port")
      .define("etcd-connect-timeout-ms", KnobType::kInt, "10000",
              "etcd unreachable at start: give up (exit 1) after this long")
      .define("tls-cert", KnobType::kString, "",
              "PEM certificate (chain) of this server: serve TLS only (needs --tls-key)")
      .define("tls-key", KnobType::kString, "", "PEM private key for --tls-cert")
      .define("tls-client-ca", KnobType::kString, "",
              "PEM CA bundle: require and verify a client certificate signed by it (mutual TLS)")
      .define("auth-token-file", KnobType::kString, "",
              "File holding a bearer token that RegisterAgent, JoinJob, LeaveJob and KvPut must "
              "carry ('authorization: Bearer <token>'); empty = none")
      .define("max-watch-streams", KnobType::kInt, "16384",
              "WatchJob streams served at once in total (a stream holds no thread, only its "
              "buffers); past it a new stream is refused with RESOURCE_EXHAUSTED")
      .define("max-watch-streams-per-job", KnobType::kInt, "8192",
              "WatchJob streams served at once for one job (at least its agents); past it a new "
              "stream is refused with RESOURCE_EXHAUSTED")
      .define("operator-token-file", KnobType::kString, "",
              "File holding the operator token: a RegisterAgent carrying it as the metadata "
              "'x-kolo-operator-token' may register a live agent's id without that agent's "
              "secret (its old jobs end at once); empty = only the agent's own secret may")
      .define("reserved-watch-streams", KnobType::kInt, "-1",
              "Of --max-watch-streams, streams kept for the jobs' own agents (a request with the "
              "agent's secret, from a member of the job); other watchers share the rest; "
              "-1 = a quarter of --max-watch-streams")
      .define("max-watch-streams-per-token", KnobType::kInt, "256",
              "WatchJob streams at once on the jobs of one token, not counting their agents'")
      .define("max-watch-streams-per-peer", KnobType::kInt, "2048",
              "WatchJob streams at once from one peer address, not counting a job's agents'")
      .define("max-watch-streams-per-member", KnobType::kInt, "4",
              "WatchJob streams at once of one member agent on one job")
      .define("max-jobs", KnobType::kInt, "16384",
              "Jobs held at once (FORMING, RUNNING and retained FAILED/FINISHED); past it a "
              "JoinJob that would create one is refused")
      .define("max-jobs-per-agent", KnobType::kInt, "256",
              "Active jobs one agent may be in (or wait to join) at once")
      .define("max-kv-keys-per-job", KnobType::kInt, "4096", "KV keys one job may hold")
      .define("max-kv-bytes-per-job", KnobType::kInt, "16777216",
              "Bytes of keys and values one job may hold")
      .define("max-kv-bytes", KnobType::kInt, "536870912",
              "Bytes of keys and values all jobs together may hold")
      .define("max-kv-waiters-per-job", KnobType::kInt, "1024",
              "KvGet calls waiting for keys of one job at once")
      .define("max-kv-waiters", KnobType::kInt, "16384",
              "KvGet calls waiting for keys of all jobs at once (about 15 KB each)")
      .define("max-list-reply-bytes", KnobType::kInt, "3145728",
              "ListJobs / ListAgents replies are cut to this many bytes (marked truncated, with "
              "the total), so they always fit gRPC's 4 MiB message limit")
      .define("brief-world-slots", KnobType::kInt, "256",
              "Worlds pushed to kolo-agents list each agent's slot for jobs of at most this many "
              "agents; a larger job's World carries only the agents' local sizes and each "
              "agent's own slot (O(N) bytes per agent instead of O(N) slots)")
      .define("watch-writer-threads", KnobType::kInt, "0",
              "Threads that write the Worlds a job's change pushes to its watchers (one write "
              "per agent), so that the loop goes on meanwhile; 0 = this machine's cores, at "
              "least 2 and at most 8")
      .define("log-level", KnobType::kString, "",
              "Log level: info, or per subsystem 'warn,coord=debug' (overrides KOLO_LOG_LEVEL)");
}

namespace {

// A quota knob: positive (reserved-watch-streams may be 0).
Status readQuota(const Config& config, const char* name, size_t* out, int64_t min = 1) {
  int64_t v = config.getInt(name);
  if (v < min)
    return invalidArgument(fmt::format("--{} must be at least {}, got {}", name, min, v));
  *out = static_cast<size_t>(v);
  return okStatus();
}

Status readQuotas(const Config& config, Quotas* q) {
  if (config.getInt("reserved-watch-streams") != -1) {
    RETURN_IF_ERROR(readQuota(config, "reserved-watch-streams", &q->reserved_watch_streams, 0));
  }
  RETURN_IF_ERROR(readQuota(config, "max-watch-streams-per-token", &q->watch_streams_per_token));
  RETURN_IF_ERROR(readQuota(config, "max-watch-streams-per-peer", &q->watch_streams_per_peer));
  RETURN_IF_ERROR(readQuota(config, "max-watch-streams-per-member", &q->watch_streams_per_member));
  RETURN_IF_ERROR(readQuota(config, "max-jobs", &q->max_jobs));
  RETURN_IF_ERROR(readQuota(config, "max-jobs-per-agent", &q->jobs_per_agent));
  RETURN_IF_ERROR(readQuota(config, "max-kv-keys-per-job", &q->kv_keys_per_job));
  RETURN_IF_ERROR(readQuota(config, "max-kv-bytes-per-job", &q->kv_bytes_per_job));
  RETURN_IF_ERROR(readQuota(config, "max-kv-bytes", &q->kv_bytes_total));
  RETURN_IF_ERROR(readQuota(config, "max-kv-waiters-per-job", &q->kv_waiters_per_job));
  RETURN_IF_ERROR(readQuota(config, "max-kv-waiters", &q->kv_waiters_total));
  RETURN_IF_ERROR(readQuota(config, "max-list-reply-bytes", &q->list_reply_bytes, 1024));
  return okStatus();
}

}  // namespace

StatusOr<ServerOptions> serverOptionsFrom(const Config& config) {
  ServerOptions o;
  o.listen = config.getString("listen");
  o.membership.lease_ms = config.getInt("lease-ms");
  o.membership.heartbeat_interval_ms = config.getInt("heartbeat-interval-ms");
  o.membership.stream_heartbeat_interval_ms = config.getInt("stream-heartbeat-interval-ms");
  int64_t retention_s = config.getInt("finished-job-retention-s");
  if (o.listen.empty()) return invalidArgument("--listen must not be empty");
  if (o.membership.lease_ms <= 0) {
    return invalidArgument("--lease-ms must be positive, got " +
                           std::to_string(o.membership.lease_ms));
  }
  if (o.membership.heartbeat_interval_ms <= 0 ||
      o.membership.heartbeat_interval_ms >= o.membership.lease_ms) {
    return invalidArgument("--heartbeat-interval-ms must be positive and below --lease-ms (" +
                           std::to_string(o.membership.lease_ms) + "), got " +
                           std::to_string(o.membership.heartbeat_interval_ms));
  }
  if (o.membership.stream_heartbeat_interval_ms < 0 ||
      o.membership.stream_heartbeat_interval_ms >= o.membership.lease_ms) {
    return invalidArgument(
        "--stream-heartbeat-interval-ms must be 0 (lease-ms / 3) or positive and below "
        "--lease-ms (" +
        std::to_string(o.membership.lease_ms) + "), got " +
        std::to_string(o.membership.stream_heartbeat_interval_ms));
  }
  if (retention_s < 0) {
    return invalidArgument("--finished-job-retention-s must not be negative, got " +
                           std::to_string(retention_s));
  }
  o.membership.finished_job_retention_ms = retention_s * 1000;
  o.state_dir = config.getString("state-dir");
  int64_t compact = config.getInt("state-compact-records");
  if (compact <= 0) {
    return invalidArgument("--state-compact-records must be positive, got " +
                           std::to_string(compact));
  }
  o.compact_records = static_cast<uint64_t>(compact);
  int64_t compact_bytes = config.getInt("state-compact-bytes");
  if (compact_bytes < 4096) {
    return invalidArgument("--state-compact-bytes must be at least 4096, got " +
                           std::to_string(compact_bytes));
  }
  o.compact_bytes = static_cast<uint64_t>(compact_bytes);
  const std::string& endpoints = config.getString("etcd-endpoints");
  if (!endpoints.empty()) {
    if (!o.state_dir.empty()) {
      return invalidArgument(
          "--state-dir and --etcd-endpoints are mutually exclusive: keep the state either in a "
          "directory (one coordinator) or in etcd (several, one leading)");
    }
    ASSIGN_OR_RETURN(o.etcd_endpoints, ha::parseEndpoints(endpoints));
  }
  o.etcd_prefix = config.getString("etcd-prefix");
  if (o.etcd_prefix.empty() || o.etcd_prefix.front() != '/') {
    return invalidArgument("--etcd-prefix must start with '/', got '" + o.etcd_prefix + "'");
  }
  if (o.etcd_prefix.back() != '/') o.etcd_prefix += '/';
  o.election_ttl_ms = config.getInt("election-ttl-ms");
  if (o.election_ttl_ms < 0) {
    return invalidArgument("--election-ttl-ms must not be negative, got " +
                           std::to_string(o.election_ttl_ms));
  }
  o.advertise_address = config.getString("advertise-address");
  if (!o.advertise_address.empty()) {
    std::string h;
    int p = 0;
    if (!splitHostPort(o.advertise_address, &h, &p).isOk() || h.empty() || p == 0) {
      return invalidArgument("--advertise-address must be host:port, got '" + o.advertise_address +
                             "'");
    }
  }
  o.etcd_connect_timeout_ms = config.getInt("etcd-connect-timeout-ms");
  if (o.etcd_connect_timeout_ms <= 0) {
    return invalidArgument("--etcd-connect-timeout-ms must be positive");
  }
  int64_t max_watch = config.getInt("max-watch-streams");
  int64_t max_watch_job = config.getInt("max-watch-streams-per-job");
  if (max_watch <= 0 || max_watch_job <= 0) {
    return invalidArgument(fmt::format(
        "--max-watch-streams and --max-watch-streams-per-job must be positive, got {} and {}",
        max_watch, max_watch_job));
  }
  o.watch_limits.total = static_cast<size_t>(max_watch);
  o.watch_limits.per_job = static_cast<size_t>(max_watch_job);
  o.quotas.reserved_watch_streams = o.watch_limits.total / 4;  // -1: a quarter
  RETURN_IF_ERROR(readQuotas(config, &o.quotas));
  if (o.quotas.reserved_watch_streams >= o.watch_limits.total) {
    return invalidArgument(
        fmt::format("--reserved-watch-streams ({}) must be below --max-watch-streams ({})",
                    o.quotas.reserved_watch_streams, o.watch_limits.total));
  }
  o.operator_token_file = config.getString("operator-token-file");
  int64_t brief_slots = config.getInt("brief-world-slots");
  if (brief_slots < 0 || brief_slots > 1'000'000) {
    return invalidArgument(
        fmt::format("--brief-world-slots must be in 0..1000000, got {}", brief_slots));
  }
  o.watch_limits.brief_world_slots = static_cast<int>(brief_slots);
  int64_t writers = config.getInt("watch-writer-threads");
  if (writers < 0 || writers > 64) {
    return invalidArgument(
        fmt::format("--watch-writer-threads must be in 0..64 (0: the cores), got {}", writers));
  }
  o.watch_writer_threads = static_cast<int>(writers);
  o.tls_cert_file = config.getString("tls-cert");
  o.tls_key_file = config.getString("tls-key");
  o.tls_client_ca_file = config.getString("tls-client-ca");
  o.auth_token_file = config.getString("auth-token-file");
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return invalidArgument("--tls-cert and --tls-key go together");
  }
  if (!o.tls_client_ca_file.empty() && o.tls_cert_file.empty()) {
    return invalidArgument("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)");
  }
  return o;
}

}  // namespace kolo::coordinator
