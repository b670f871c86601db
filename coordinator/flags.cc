#include "coordinator/flags.h"

namespace kolo::coordinator {

void defineFlags(Config& config) {
  config
      .define("listen", KnobType::kString, "0.0.0.0:7470",
              "gRPC listen address host:port (port 0 picks a free port; see --ready-file)")
      .define("ready-file", KnobType::kString, "",
              "Once serving, write 'host:port' of the bound address to this file (atomically: "
              "temp file then rename)")
      .define("lease-ms", KnobType::kInt, "5000",
              "Agent lease: an agent silent this long is lost and its jobs fail")
      .define("heartbeat-interval-ms", KnobType::kInt, "1000",
              "Heartbeat interval told to agents (must be below lease-ms)")
      .define("finished-job-retention-s", KnobType::kInt, "300",
              "How long FAILED/FINISHED jobs stay listed (their keys go with them)")
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
  return o;
}

}  // namespace kolo::coordinator
