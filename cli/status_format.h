// How the `kolo` CLI shows the daemons' answers: aligned tables for people,
// one JSON document (nlohmann) for scripts. Pure functions of the protobuf
// replies, so they are unit-tested without a daemon.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "kolo/proto/agent.pb.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::cli {

nlohmann::json toJson(const agentrpc::AgentStatus& s);
nlohmann::json toJson(const agentrpc::JobInfo& j);
nlohmann::json toJson(const coord::ListJobsReply& r, int64_t now_unix_ms);
nlohmann::json toJson(const coord::ListAgentsReply& r);

std::string renderAgentStatus(const agentrpc::AgentStatus& s);
std::string renderAgentJob(const agentrpc::JobInfo& j);
std::string renderCoordinatorJobs(const coord::ListJobsReply& r, int64_t now_unix_ms);
std::string renderCoordinatorAgents(const coord::ListAgentsReply& r);

// "RUNNING" for coord::RUNNING, ...
std::string jobStateName(coord::JobState s);

}  // namespace kolo::cli
