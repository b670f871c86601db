// The `kolo` CLI's commands: one gRPC call each (deadline 5 s), printed as
// a table or as one JSON document. Each returns the process exit code.
#pragma once

#include <chrono>
#include <map>
#include <ostream>
#include <string>

#include "common/config_tls.h"
#include "common/status.h"

namespace kolo::cli {

constexpr const char* kDefaultAgentRpc = "127.0.0.1:7471";
// The shipped agent.conf's admin token (rpc-auth-token-create): kolo reads it
// when no agent token is given and the user may read it (the socket's group).
constexpr const char* kDefaultAgentTokenFile = "/run/kolo/admin.token";
constexpr const char* kDefaultCoordinator = "127.0.0.1:7470";

struct KoloCliOptions {
  std::string agent;        // host:port of the agent's gRPC status service
  std::string coordinator;  // host:port of the coordinator, or a list host:port,host:port
  bool json = false;
  std::chrono::milliseconds deadline{5000};
  GrpcClientSecurity agent_security;        // --agent-ca ... (KOLO_AGENT_CA ...)
  GrpcClientSecurity coordinator_security;  // --coordinator-ca ... (KOLO_COORDINATOR_CA ...)
};

// The TLS/token flags `kolo` takes for "agent" and "coordinator":
// <peer>-ca, -tls, -cert, -key, -server-name, -token-file (and -token, by
// environment only). Defined in a kolo::Config so that the precedence is the
// daemons' one: flag > KOLO_<PEER>_<NAME> environment > default.
void defineSecurityKnobs(Config& c);
// Fills o.agent_security and o.coordinator_security from the flags given
// (knob name -> value) and the environment; an unreadable file is an error.
Status resolveSecurity(KoloCliOptions& o, const std::map<std::string, std::string>& flags,
                       const std::map<std::string, std::string>& env);

int cmdStatus(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdJobs(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdAgents(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdJob(const KoloCliOptions& o, const std::string& job_id, std::ostream& out, std::ostream& err);
int cmdTimelineStart(const KoloCliOptions& o, const std::string& path, bool mark_cycles, std::ostream& out,
                     std::ostream& err);
int cmdTimelineStop(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
// wait_s > 0: then waits (up to wait_s seconds) until the agent has no jobs
// left; exit 1 if some are still running then (Kubernetes' preStop hook).
int cmdDrain(const KoloCliOptions& o, int wait_s, std::ostream& out, std::ostream& err);
int cmdUndrain(const KoloCliOptions& o, std::ostream& out, std::ostream& err);

}  // namespace kolo::cli
