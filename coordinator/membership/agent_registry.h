// Registered agents and their leases. Loop-owned, no locking; time comes
// from the injected Clock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/membership/clock.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator {

struct AgentRecord {
  coord::AgentInfo info;
  // Minted at registration (RegisterAgentReply.agent_secret); every
  // Heartbeat, JoinJob and LeaveJob of this incarnation carries it. Empty for
  // an agent restored without one (an older journal, or a job member put
  // back from its job): it is told to register again.
  std::string secret;
  int64_t registered_ms = 0;      // steady
  int64_t last_heartbeat_ms = 0;  // steady; registration counts as a heartbeat
};

// An agent whose lease ran out, with how long it had been silent.
struct ExpiredAgent {
  coord::AgentInfo info;
  int64_t silent_ms = 0;
};

class AgentRegistry {
 public:
  AgentRegistry(const Clock* clock, int64_t lease_ms) : clock_(clock), lease_ms_(lease_ms) {}

  // Adds the agent, or replaces the record of the same agent_id; renews its lease.
  void upsert(const coord::AgentInfo& info, std::string secret);
  // Renews the lease. False if the agent is unknown (it must register again).
  bool heartbeat(const std::string& agent_id);
  // Removes and returns every agent whose last heartbeat is lease_ms or more ago.
  std::vector<ExpiredAgent> expire();
  // Removes one agent (a clean stop); false if unknown.
  bool remove(const std::string& agent_id);

  const AgentRecord* find(const std::string& agent_id) const;
  const std::map<std::string, AgentRecord>& all() const { return agents_; }
  int64_t leaseMs() const { return lease_ms_; }

 private:
  const Clock* clock_;
  int64_t lease_ms_;
  std::map<std::string, AgentRecord> agents_;  // by agent_id
};

}  // namespace kolo::coordinator
