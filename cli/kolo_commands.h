// The `kolo` CLI's commands: one gRPC call each (deadline 5 s), printed as
// a table or as one JSON document. Each returns the process exit code.
#pragma once

#include <chrono>
#include <ostream>
#include <string>

namespace kolo::cli {

constexpr const char* kDefaultAgentRpc = "127.0.0.1:7471";
constexpr const char* kDefaultCoordinator = "127.0.0.1:7470";

struct KoloCliOptions {
  std::string agent;        // host:port of the agent's gRPC status service
  std::string coordinator;  // host:port of the coordinator
  bool json = false;
  std::chrono::milliseconds deadline{5000};
};

int cmdStatus(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdJobs(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdAgents(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdJob(const KoloCliOptions& o, const std::string& job_id, std::ostream& out, std::ostream& err);
int cmdTimelineStart(const KoloCliOptions& o, const std::string& path, bool mark_cycles, std::ostream& out,
                     std::ostream& err);
int cmdTimelineStop(const KoloCliOptions& o, std::ostream& out, std::ostream& err);
int cmdDrain(const KoloCliOptions& o, std::ostream& out, std::ostream& err);

}  // namespace kolo::cli
