#include "cli/status_format.h"

#include <sstream>
#include <vector>

#include "cli/table.h"

namespace kolo::cli {

namespace {

using nlohmann::json;

json countersJson(const agentrpc::Counters& c) {
  return {{"ops_done", c.ops_done()}, {"bytes_done", c.bytes_done()}, {"ops_failed", c.ops_failed()}};
}

std::string countersText(const agentrpc::Counters& c) {
  return std::to_string(c.ops_done()) + " done (" + formatBytes(c.bytes_done()) + "), " +
         std::to_string(c.ops_failed()) + " failed";
}

json inFlightJson(const agentrpc::InFlight& f) {
  return {{"name", f.name()},
          {"op", f.op()},
          {"dtype", f.dtype()},
          {"shape", std::vector<int64_t>(f.shape().begin(), f.shape().end())},
          {"submitted_ranks", std::vector<int>(f.submitted_ranks().begin(), f.submitted_ranks().end())},
          {"waiting_ranks", std::vector<int>(f.waiting_ranks().begin(), f.waiting_ranks().end())},
          {"age_ms", f.age_ms()}};
}

std::string shapeText(const agentrpc::InFlight& f) {
  std::vector<std::string> dims;
  for (int64_t d : f.shape()) dims.push_back(std::to_string(d));
  return std::string("[").append(join(dims, ",")).append("]");
}

// Ranks hosted by an agent for a job: rank_offset .. rank_offset + local_size - 1.
std::string localRanks(const agentrpc::JobInfo& j) {
  std::vector<int> r;
  for (int i = 0; i < j.local_size(); ++i) r.push_back(j.rank_offset() + i);
  return formatRanks(r);
}

json agentInfoJson(const coord::AgentInfo& a) {
  return {{"agent_id", a.agent_id()}, {"hostname", a.hostname()}, {"rpc_address", a.rpc_address()}};
}

// A block of "key  value" lines, keys padded.
std::string keyValues(const std::vector<std::pair<std::string, std::string>>& kv) {
  size_t w = 0;
  for (auto& [k, v] : kv) w = std::max(w, k.size());
  std::string out;
  for (auto& [k, v] : kv) out += k + std::string(w - k.size() + 2, ' ') + v + "\n";
  return out;
}

}  // namespace

std::string jobStateName(coord::JobState s) {
  switch (s) {
    case coord::FORMING: return "FORMING";
    case coord::RUNNING: return "RUNNING";
    case coord::FAILED: return "FAILED";
    case coord::FINISHED: return "FINISHED";
    default: return "UNKNOWN";
  }
}

json toJson(const agentrpc::JobInfo& j) {
  json in_flight = json::array();
  for (auto& f : j.in_flight()) in_flight.push_back(inFlightJson(f));
  return {{"job_id", j.job_id()},
          {"state", j.state()},
          {"generation", j.generation()},
          {"rank_offset", j.rank_offset()},
          {"local_size", j.local_size()},
          {"world_size", j.world_size()},
          {"connected_clients", j.connected_clients()},
          {"counters", countersJson(j.counters())},
          {"in_flight", in_flight},
          {"in_flight_omitted", j.in_flight_omitted()},
          {"reason", j.reason()},
          {"backend", j.backend()},
          {"backend_reason", j.backend_reason()}};
}

namespace {

json mpsJson(const agentrpc::MpsInfo& m) {
  return {{"state", m.state()}, {"reason", m.reason()}, {"pipe_dir", m.pipe_dir()}};
}

// "MPS up (pipe /run/kolo-mps)" / "MPS down: no control socket in /run/kolo-mps".
std::string mpsText(const agentrpc::MpsInfo& m) {
  if (m.state() == "up") return "MPS up (pipe " + m.pipe_dir() + ")";
  return "MPS " + m.state() + (m.reason().empty() ? "" : ": " + m.reason());
}

// One line per GPU; an agent without a GPU says so, with the node's MPS
// state. Nothing from an agent too old to report it.
std::string gpuLines(const agentrpc::AgentStatus& s) {
  if (s.gpus_size() == 0 && s.no_gpu().empty() && s.mps().state().empty()) return "";
  std::string out;
  for (auto& g : s.gpus()) {
    out += "GPU " + std::to_string(g.index()) + ": " + mpsText(g.mps());
    if (g.mps().state() == "up" && g.mps_client() == "no") {
      out +=
          "; the agent's own CUDA contexts are not MPS clients (was MPS started after the agent?)";
    }
    out += "\n";
  }
  if (s.gpus_size() == 0) {
    out += "no GPU" +
           (s.no_gpu().empty() || s.no_gpu() == "no GPU" ? "" : " (" + s.no_gpu() + ")") +
           "; node " + mpsText(s.mps()) + "\n";
  }
  return out;
}

}  // namespace

json toJson(const agentrpc::AgentStatus& s) {
  json clients = json::array();
  for (auto& c : s.clients()) {
    clients.push_back({{"job_id", c.job_id()},
                       {"local_rank", c.local_rank()},
                       {"rank", c.rank()},
                       {"pid", s.pids_hidden() ? json(nullptr) : json(c.pid())},
                       {"own_pid", s.pids_hidden() ? json(nullptr) : json(c.own_pid())},
                       {"uid", s.pids_hidden() ? json(nullptr) : json(c.uid())},
                       {"arena_bytes", c.arena_bytes()}});
  }
  json jobs = json::array();
  for (auto& j : s.jobs()) jobs.push_back(toJson(j));
  json gpus = json::array();
  for (auto& g : s.gpus()) {
    gpus.push_back(
        {{"index", g.index()}, {"mps", mpsJson(g.mps())}, {"mps_client", g.mps_client()}});
  }
  return {{"agent_id", s.agent_id()},
          {"hostname", s.hostname()},
          {"version", s.version()},
          {"socket_path", s.socket_path()},
          {"coordinator", s.coordinator()},
          {"uptime_ms", s.uptime_ms()},
          {"draining", s.draining()},
          {"pids_hidden", s.pids_hidden()},
          {"clients", clients},
          {"clients_omitted", s.clients_omitted()},
          {"jobs", jobs},
          {"counters", countersJson(s.counters())},
          {"gpus", gpus},
          {"no_gpu", s.no_gpu()},
          {"mps", mpsJson(s.mps())}};
}

json toJson(const coord::ListJobsReply& r, int64_t now_unix_ms) {
  json jobs = json::array();
  for (auto& j : r.jobs()) {
    json agents = json::array();
    for (auto& a : j.agents()) {
      json slot = agentInfoJson(a.agent());
      slot["local_size"] = a.local_size();
      slot["rank_offset"] = a.rank_offset();
      slot["cross_rank"] = a.cross_rank();
      agents.push_back(slot);
    }
    json job = {{"job_id", j.job_id()},
                {"state", jobStateName(j.state())},
                {"generation", j.generation()},
                {"world_size", j.world_size()},
                {"joined_ranks", j.joined_ranks()},
                {"agents", agents},
                {"reason", j.reason()},
                {"created_unix_ms", j.created_unix_ms()}};
    if (j.created_unix_ms() > 0) job["age_ms"] = now_unix_ms - j.created_unix_ms();
    jobs.push_back(job);
  }
  json out = {{"jobs", jobs}};
  if (r.truncated()) {
    out["truncated"] = true;
    out["total"] = r.total();
  }
  return out;
}

json toJson(const coord::ListAgentsReply& r) {
  json agents = json::array();
  for (auto& a : r.agents()) {
    json j = agentInfoJson(a.agent());
    j["last_heartbeat_age_ms"] = a.last_heartbeat_age_ms();
    j["job_ids"] = std::vector<std::string>(a.job_ids().begin(), a.job_ids().end());
    agents.push_back(j);
  }
  return {{"agents", agents}};
}

std::string renderAgentStatus(const agentrpc::AgentStatus& s) {
  std::string out = keyValues(
      {{"agent", s.agent_id() + (s.version().empty() ? "" : " (kolo " + s.version() + ")")},
       {"host", s.hostname()},
       {"socket", s.socket_path()},
       {"state",
        s.draining() ? "draining: admits no new trainers (kolo undrain to resume)" : "serving"},
       {"coordinator", s.coordinator().empty() ? "-" : s.coordinator()},
       {"uptime", formatDuration(s.uptime_ms())},
       {"collectives", countersText(s.counters())}});
  out += gpuLines(s);
  out += "\n";
  if (s.jobs_size() == 0) {
    out += "no jobs\n";
  } else {
    Table t({"JOB", "STATE", "GEN", "RANKS HERE", "WORLD", "CLIENTS", "DONE", "FAILED", "IN FLIGHT"});
    for (auto& j : s.jobs()) {
      t.add({j.job_id(), j.state(), std::to_string(j.generation()), localRanks(j), std::to_string(j.world_size()),
             std::to_string(j.connected_clients()) + "/" + std::to_string(j.local_size()),
             std::to_string(j.counters().ops_done()), std::to_string(j.counters().ops_failed()),
             std::to_string(j.in_flight_size())});
    }
    out += t.render();
  }
  out += "\n";
  if (s.clients_size() == 0) {
    out += "no clients connected\n";
  } else {
    Table t({"PID", "UID", "JOB", "RANK", "LOCAL RANK", "ARENA"});
    const bool hidden = s.pids_hidden();
    for (auto& c : s.clients()) {
      // The agent's view of the pid, and the trainer's own when they differ
      // (a container's PID namespace): "0 (own 7)" when the agent cannot
      // see the trainer at all (sibling namespaces, e.g. Kubernetes pods).
      std::string pid = std::to_string(c.pid());
      if (c.own_pid() != 0 && c.own_pid() != c.pid())
        pid += " (own " + std::to_string(c.own_pid()) + ")";
      t.add({hidden ? "-" : pid, hidden ? "-" : std::to_string(c.uid()),
             c.job_id().empty() ? "-" : c.job_id(), std::to_string(c.rank()),
             std::to_string(c.local_rank()), formatBytes(c.arena_bytes())});
    }
    out += t.render();
    if (hidden) {
      out +=
          "pids and uids are shown to the agent's admins only: give kolo the agent's token "
          "(--agent-token-file, readable by the socket's group on a default install; "
          "docs/security.md)\n";
    }
  }
  return out;
}

std::string renderAgentJob(const agentrpc::JobInfo& j) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"job", j.job_id()},
      {"state", j.state() + " (generation " + std::to_string(j.generation()) + ")"},
      {"ranks here", localRanks(j) + " of " + std::to_string(j.world_size()) + ", " +
                         std::to_string(j.connected_clients()) + " connected"},
      {"collectives", countersText(j.counters())}};
  if (!j.backend().empty())
    kv.emplace_back("backend", j.backend() + " (" + j.backend_reason() + ")");
  if (!j.reason().empty()) kv.emplace_back("reason", j.reason());
  std::string out = keyValues(kv) + "\n";
  if (j.in_flight_size() == 0 && j.in_flight_omitted() == 0)
    return out + "no collective in flight\n";
  if (j.in_flight_omitted() > 0) {
    // The agent bounds its replies (--status-max-in-flight): the oldest are listed.
    out += std::to_string(j.in_flight_size() + j.in_flight_omitted()) +
           " collective(s) in flight, the oldest " + std::to_string(j.in_flight_size()) +
           " listed (" + std::to_string(j.in_flight_omitted()) + " left out):\n";
  } else {
    out += std::to_string(j.in_flight_size()) + " collective(s) in flight:\n";
  }
  Table t({"NAME", "OP", "DTYPE", "SHAPE", "AGE", "WAITING FOR", "SUBMITTED"});
  for (auto& f : j.in_flight()) {
    t.add({f.name(), f.op(), f.dtype(), shapeText(f), formatDuration(f.age_ms()),
           formatRanks({f.waiting_ranks().begin(), f.waiting_ranks().end()}),
           formatRanks({f.submitted_ranks().begin(), f.submitted_ranks().end()})});
  }
  return out + t.render();
}

std::string renderCoordinatorJobs(const coord::ListJobsReply& r, int64_t now_unix_ms) {
  if (r.jobs_size() == 0) return "no jobs\n";
  Table t({"JOB", "STATE", "GEN", "RANKS", "AGENTS", "AGE", "REASON"});
  for (auto& j : r.jobs()) {
    std::vector<std::string> slots;
    for (auto& a : j.agents()) slots.push_back(a.agent().agent_id() + ":" + std::to_string(a.local_size()));
    std::string agents = join(slots, ",");
    t.add({j.job_id(), jobStateName(j.state()), std::to_string(j.generation()),
           std::to_string(j.joined_ranks()) + "/" + std::to_string(j.world_size()), agents.empty() ? "-" : agents,
           j.created_unix_ms() > 0 ? formatDuration(now_unix_ms - j.created_unix_ms()) : "-",
           j.reason().empty() ? "-" : j.reason()});
  }
  std::string out = t.render();
  if (r.truncated()) {
    out += "(" + std::to_string(r.jobs_size()) + " of " + std::to_string(r.total()) +
           " jobs listed: the reply stops at the coordinator's --max-list-reply-bytes)\n";
  }
  return out;
}

std::string renderCoordinatorAgents(const coord::ListAgentsReply& r) {
  if (r.agents_size() == 0) return "no agents\n";
  Table t({"AGENT", "HOST", "STATUS ADDRESS", "LAST HEARTBEAT", "JOBS"});
  for (auto& a : r.agents()) {
    std::string jobs = join({a.job_ids().begin(), a.job_ids().end()}, ",");
    t.add({a.agent().agent_id(), a.agent().hostname(),
           a.agent().rpc_address().empty() ? "-" : a.agent().rpc_address(),
           formatDuration(a.last_heartbeat_age_ms()) + " ago", jobs.empty() ? "-" : jobs});
  }
  std::string out = t.render();
  if (r.truncated()) {
    out += "(" + std::to_string(r.agents_size()) + " of " + std::to_string(r.total()) +
           " agents listed: the reply stops at the coordinator's --max-list-reply-bytes)\n";
  }
  return out;
}

}  // namespace kolo::cli
