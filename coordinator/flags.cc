#include "coordinator/flags.h"

#include <fmt/format.h>

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
      .define("finished-job-retention-s", KnobType::kInt, "300",
              "How long FAILED/FINISHED jobs stay listed (their keys go with them)")
      .define("state-dir", KnobType::kString, "",
              "Journal the state (jobs, generations, agents, keys) in this directory and recover "
              "it at start; empty = in memory only")
      .define("state-compact-records", KnobType::kInt, "10000",
              "Journal records after which the state is compacted into a snapshot")
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
      .define("log-level", KnobType::kString, "",
              "Log level: info, or per subsystem 'warn,coord=debug' (overrides KOLO_LOG_LEVEL)");
}

StatusOr<ServerOptions> serverOptionsFrom(const Config& config) {
  ServerOptions o;
  o.listen = config.getString("listen");
  o.membership.lease_ms = config.getInt("lease-ms");
  o.membership.heartbeat_interval_ms = config.getInt("heartbeat-interval-ms");
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
  int64_t max_watch = config.getInt("max-watch-streams");
  int64_t max_watch_job = config.getInt("max-watch-streams-per-job");
  if (max_watch <= 0 || max_watch_job <= 0) {
    return invalidArgument(fmt::format(
        "--max-watch-streams and --max-watch-streams-per-job must be positive, got {} and {}",
        max_watch, max_watch_job));
  }
  o.watch_limits.total = static_cast<size_t>(max_watch);
  o.watch_limits.per_job = static_cast<size_t>(max_watch_job);
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
