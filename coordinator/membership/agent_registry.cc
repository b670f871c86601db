#include "coordinator/membership/agent_registry.h"

namespace kolo::coordinator {

void AgentRegistry::upsert(const coord::AgentInfo& info, std::string secret) {
  int64_t now = clock_->steadyMs();
  AgentRecord& r = agents_[info.agent_id()];
  r.info = info;
  r.secret = std::move(secret);
  r.registered_ms = now;
  r.last_heartbeat_ms = now;
}

bool AgentRegistry::heartbeat(const std::string& agent_id) {
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return false;
  it->second.last_heartbeat_ms = clock_->steadyMs();
  return true;
}

bool AgentRegistry::remove(const std::string& agent_id) { return agents_.erase(agent_id) > 0; }

std::vector<ExpiredAgent> AgentRegistry::expire() {
  int64_t now = clock_->steadyMs();
  std::vector<ExpiredAgent> out;
  for (auto it = agents_.begin(); it != agents_.end();) {
    int64_t silent = now - it->second.last_heartbeat_ms;
    if (silent >= lease_ms_) {
      out.push_back({it->second.info, silent});
      it = agents_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

const AgentRecord* AgentRegistry::find(const std::string& agent_id) const {
  auto it = agents_.find(agent_id);
  return it == agents_.end() ? nullptr : &it->second;
}

}  // namespace kolo::coordinator
