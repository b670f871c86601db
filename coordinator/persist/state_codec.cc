#include "coordinator/persist/state_codec.h"

#include <fmt/format.h>

#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

namespace kolo::coordinator::persist {

using nlohmann::json;

namespace {

// Thrown inside this file only (caught by decodeRecord / loadState).
struct DecodeError {
  std::string what;
};

[[noreturn]] void fail(std::string what) { throw DecodeError{std::move(what)}; }

// A record line is BODY with ,"crc":"XXXXXXXX" put before its closing brace.
constexpr std::string_view kCrcKey = ",\"crc\":\"";
constexpr size_t kCrcTail = kCrcKey.size() + 8 + 2;  // key, 8 hex digits, "}

std::string withChecksum(std::string body) {
  uint32_t crc = crc32c(body);
  body.pop_back();  // the closing brace
  body += fmt::format("{}{:08x}\"}}", kCrcKey, crc);
  return body;
}

// The record's JSON text without its checksum member, after checking it.
// Without a checksum: the line itself when `legacy_ok`, else an error.
// `had_crc` says which.
std::string checkedBody(std::string_view line, bool legacy_ok, bool* had_crc) {
  *had_crc = line.size() > kCrcTail &&
             line.substr(line.size() - kCrcTail, kCrcKey.size()) == kCrcKey &&
             line.substr(line.size() - 2) == "\"}";
  if (!*had_crc) {
    if (!legacy_ok)
      fail("no checksum (a record ends in \"crc\":\"XXXXXXXX\" since format version 2)");
    return std::string(line);
  }
  std::string_view hex = line.substr(line.size() - 10, 8);
  uint32_t want = 0;
  for (char c : hex) {
    int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (v < 0) fail("the checksum is not 8 lower-case hex digits");
    want = want * 16 + static_cast<uint32_t>(v);
  }
  std::string body(line.substr(0, line.size() - kCrcTail));
  body += '}';
  uint32_t got = crc32c(body);
  if (got != want) {
    fail(
        fmt::format("checksum mismatch (crc {:08x} recorded, {:08x} computed): the record was "
                    "altered after it was written",
                    want, got));
  }
  return body;
}

const json& field(const json& j, const char* name) {
  if (!j.is_object()) fail(fmt::format("expected an object holding '{}'", name));
  auto it = j.find(name);
  if (it == j.end()) fail(fmt::format("missing field '{}'", name));
  return *it;
}

int64_t intField(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json& v = field(j, name);
  if (!v.is_number_integer()) fail(fmt::format("field '{}' is not an integer", name));
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(fmt::format("field '{}' is out of range", name));
    }
    x = static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) fail(fmt::format("field '{}' = {} is out of range", name, x));
  return x;
}

uint64_t uintField(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0)
      return static_cast<uint64_t>(v.get<int64_t>());
    fail(fmt::format("field '{}' is not an unsigned integer", name));
  }
  return v.get<uint64_t>();
}

bool boolField(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_boolean()) fail(fmt::format("field '{}' is not a boolean", name));
  return v.get<bool>();
}

std::string stringField(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_string()) fail(fmt::format("field '{}' is not a string", name));
  auto s = unescapeString(v.get_ref<const std::string&>());
  if (!s.isOk()) fail(fmt::format("field '{}': {}", name, s.status().message()));
  return std::move(s).value();
}

std::string hexField(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_string()) fail(fmt::format("field '{}' is not a string", name));
  auto s = fromHex(v.get_ref<const std::string&>());
  if (!s.isOk()) fail(fmt::format("field '{}': {}", name, s.status().message()));
  return std::move(s).value();
}

const json& arrayField(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_array()) fail(fmt::format("field '{}' is not an array", name));
  return v;
}

constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

json agentToJson(const coord::AgentInfo& a) {
  return json{{"id", escapeString(a.agent_id())},
              {"host", escapeString(a.hostname())},
              {"rpc", escapeString(a.rpc_address())},
              {"data", toHex(a.data_address())}};
}

coord::AgentInfo agentFromJson(const json& j) {
  coord::AgentInfo a;
  a.set_agent_id(stringField(j, "id"));
  a.set_hostname(stringField(j, "host"));
  a.set_rpc_address(stringField(j, "rpc"));
  a.set_data_address(hexField(j, "data"));
  return a;
}

coord::JobState stateFromName(const std::string& s) {
  if (s == "FORMING") return coord::FORMING;
  if (s == "RUNNING") return coord::RUNNING;
  if (s == "FAILED") return coord::FAILED;
  if (s == "FINISHED") return coord::FINISHED;
  fail("unknown job state '" + s + "'");
}

json memberToJson(const JobMember& m) {
  return json{{"agent_id", escapeString(m.agent_id)},
              {"agent", agentToJson(m.info)},
              {"local_size", m.local_size},
              {"left", m.left}};
}

json membersToJson(const std::vector<JobMember>& list, size_t from = 0) {
  json members = json::array();
  for (size_t i = from; i < list.size(); ++i) members.push_back(memberToJson(list[i]));
  return members;
}

JobMember memberFromJson(const json& m) {
  JobMember member;
  member.agent_id = stringField(m, "agent_id");
  member.info = agentFromJson(field(m, "agent"));
  member.local_size = static_cast<int32_t>(intField(m, "local_size", kI32Min, kI32Max));
  member.left = boolField(m, "left");
  return member;
}

std::vector<JobMember> membersFromJson(const json& j, const char* name) {
  std::vector<JobMember> out;
  for (const json& m : arrayField(j, name)) out.push_back(memberFromJson(m));
  return out;
}

// The members a record lists (from `from` on) and the waiting agents, by
// agent id (the first of each id).
std::unordered_map<std::string_view, const JobMember*> membersById(const Job& job,
                                                                   size_t from = 0) {
  std::unordered_map<std::string_view, const JobMember*> by_id;
  by_id.reserve(job.members.size() + job.waiting.size());
  for (size_t i = from; i < job.members.size(); ++i)
    by_id.emplace(job.members[i].agent_id, &job.members[i]);
  for (const JobMember& m : job.waiting) by_id.emplace(m.agent_id, &m);
  return by_id;
}

// A slot names its agent by id when a member the record lists carries the
// same agent (always, once sealed): the agent's fields once per job record
// instead of twice. A job of 4096 agents wrote ~1.3 MB per record with both,
// a record etcd (--max-request-bytes 1.5 MiB) refuses a little further up.
json slotsToJson(const Job& job, size_t members_from) {
  json slots = json::array();
  if (job.slots.empty()) return slots;
  const auto by_id = membersById(job, members_from);
  for (const coord::AgentSlot& s : job.slots) {
    json slot{{"local_size", s.local_size()},
              {"rank_offset", s.rank_offset()},
              {"cross_rank", s.cross_rank()}};
    auto m = by_id.find(s.agent().agent_id());
    if (m != by_id.end() && sameAgent(m->second->info, s.agent())) {
      slot["agent_id"] = escapeString(s.agent().agent_id());
    } else {
      slot["agent"] = agentToJson(s.agent());
    }
    slots.push_back(std::move(slot));
  }
  return slots;
}

// `members_from`: list members from there on only (Record::members_from);
// `with_slots` false: no "slots" (Record::same_slots).
json jobToJson(const Job& job, size_t members_from = 0, bool with_slots = true) {
  json out{{"id", escapeString(job.id)},
           {"token", escapeString(job.token)},
           {"world_size", job.world_size},
           {"state", jobStateName(job.state)},
           {"generation", job.generation},
           {"reason", escapeString(job.reason)},
           {"created_unix_ms", job.created_wall_ms},
           {"ended_unix_ms", job.ended_wall_ms},
           {"members", membersToJson(job.members, members_from)}};
  if (with_slots) out["slots"] = slotsToJson(job, members_from);
  if (job.elastic()) {  // absent for fixed-size jobs (and in older journals)
    out["elastic"] = json{{"min_size", job.min_size},
                          {"max_size", job.max_size},
                          {"timeout_ms", job.elastic_timeout_ms},
                          {"change", escapeString(job.change)},
                          {"below_min_unix_ms", job.below_min_wall_ms},
                          {"waiting", membersToJson(job.waiting)}};
  }
  return out;
}

Job jobFromJson(const json& j) {
  Job job;
  job.id = stringField(j, "id");
  if (job.id.empty()) fail("a job with an empty id");
  job.token = stringField(j, "token");
  job.world_size = static_cast<int32_t>(intField(j, "world_size", 0, kI32Max));
  job.state = stateFromName(stringField(j, "state"));
  job.generation = uintField(j, "generation");
  job.reason = stringField(j, "reason");
  job.created_wall_ms = intField(j, "created_unix_ms", kI64Min, kI64Max);
  job.ended_wall_ms = intField(j, "ended_unix_ms", kI64Min, kI64Max);
  job.members = membersFromJson(j, "members");
  const json* elastic = nullptr;
  if (auto it = j.find("elastic"); it != j.end()) {
    elastic = &*it;
    if (elastic->contains("waiting")) job.waiting = membersFromJson(*elastic, "waiting");
  }
  const auto by_id = membersById(job);
  static const json kNoSlots = json::array();  // (a record with same_slots)
  for (const json& s : j.contains("slots") ? arrayField(j, "slots") : kNoSlots) {
    coord::AgentSlot slot;
    if (s.contains("agent")) {
      *slot.mutable_agent() = agentFromJson(field(s, "agent"));
    } else {  // by reference (jobToJson): the member's agent
      const std::string id = stringField(s, "agent_id");
      auto m = by_id.find(id);
      if (m == by_id.end())
        fail("a slot names agent '" + id + "', which is not a member of job '" + job.id + "'");
      *slot.mutable_agent() = m->second->info;
    }
    slot.set_local_size(static_cast<int32_t>(intField(s, "local_size", kI32Min, kI32Max)));
    slot.set_rank_offset(static_cast<int32_t>(intField(s, "rank_offset", kI32Min, kI32Max)));
    slot.set_cross_rank(static_cast<int32_t>(intField(s, "cross_rank", kI32Min, kI32Max)));
    job.slots.push_back(std::move(slot));
  }
  if (elastic != nullptr) {
    const json& e = *elastic;
    job.min_size = static_cast<int32_t>(intField(e, "min_size", 1, kI32Max));
    job.max_size = static_cast<int32_t>(intField(e, "max_size", 0, kI32Max));
    job.elastic_timeout_ms = intField(e, "timeout_ms", 0, kI64Max);
    job.change = stringField(e, "change");
    job.below_min_wall_ms = intField(e, "below_min_unix_ms", -1, kI64Max);
  }
  return job;
}

const char* typeName(Record::Type t) {
  switch (t) {
    case Record::Type::kAgent:
      return "agent";
    case Record::Type::kAgentLost:
      return "agent_lost";
    case Record::Type::kJob:
      return "job";
    case Record::Type::kJobRemoved:
      return "job_removed";
    case Record::Type::kKvPut:
      return "kv";
  }
  return "?";
}

Record recordFromJson(const json& j) {
  Record r;
  r.seq = uintField(j, "seq");
  std::string type = stringField(j, "type");
  if (type == "agent") {
    r.type = Record::Type::kAgent;
    r.agent = agentFromJson(field(j, "agent"));
    if (r.agent.agent_id().empty()) fail("an agent with an empty id");
    if (j.contains("secret")) r.secret = stringField(j, "secret");  // absent in version 1
  } else if (type == "agent_lost") {
    r.type = Record::Type::kAgentLost;
    r.id = stringField(j, "id");
  } else if (type == "job") {
    r.type = Record::Type::kJob;
    r.job = jobFromJson(field(j, "job"));
    if (j.contains("members_from")) {
      r.members_from = intField(j, "members_from", 0, kI32Max);
      r.same_slots = j.contains("same_slots") && boolField(j, "same_slots");
    }
    if (!r.same_slots && !field(j, "job").contains("slots")) fail("a job record without its slots");
    if (r.members_from >= 0) {
      if (j.contains("members_changed")) {
        for (const json& e : arrayField(j, "members_changed")) {
          const auto index = static_cast<uint32_t>(intField(e, "index", 0, r.members_from - 1));
          r.members_changed.emplace_back(index, memberFromJson(e));
        }
      }
    }
  } else if (type == "job_removed") {
    r.type = Record::Type::kJobRemoved;
    r.id = stringField(j, "id");
  } else if (type == "kv") {
    r.type = Record::Type::kKvPut;
    r.id = stringField(j, "job");
    r.key = stringField(j, "key");
    r.value = hexField(j, "value");
  } else {
    fail("unknown record type '" + type + "'");
  }
  return r;
}

json parseLine(std::string_view line) {
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("not valid JSON");
  if (!j.is_object()) fail("not a JSON object");
  return j;
}

bool sameJob(const Job& a, const Job& b) {
  if (a.id != b.id || a.token != b.token || a.world_size != b.world_size || a.state != b.state ||
      a.generation != b.generation || a.reason != b.reason ||
      a.created_wall_ms != b.created_wall_ms || a.ended_wall_ms != b.ended_wall_ms ||
      a.min_size != b.min_size || a.max_size != b.max_size ||
      a.elastic_timeout_ms != b.elastic_timeout_ms || a.change != b.change ||
      a.below_min_wall_ms != b.below_min_wall_ms || a.waiting.size() != b.waiting.size() ||
      a.members.size() != b.members.size()) {
    return false;
  }
  for (size_t i = 0; i < a.members.size(); ++i) {
    if (!sameMember(a.members[i], b.members[i])) return false;
  }
  return sameSlots(a.slots, b.slots);
}

}  // namespace

bool sameAgent(const coord::AgentInfo& a, const coord::AgentInfo& b) {
  return a.agent_id() == b.agent_id() && a.hostname() == b.hostname() &&
         a.rpc_address() == b.rpc_address() && a.data_address() == b.data_address();
}

bool sameMember(const JobMember& a, const JobMember& b) {
  return a.agent_id == b.agent_id && sameAgent(a.info, b.info) && a.local_size == b.local_size &&
         a.left == b.left;
}

bool sameSlots(const std::vector<coord::AgentSlot>& a, const std::vector<coord::AgentSlot>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const coord::AgentSlot& x = a[i];
    const coord::AgentSlot& y = b[i];
    if (!sameAgent(x.agent(), y.agent()) || x.local_size() != y.local_size() ||
        x.rank_offset() != y.rank_offset() || x.cross_rank() != y.cross_rank()) {
      return false;
    }
  }
  return true;
}

bool PersistedState::operator==(const PersistedState& o) const {
  if (agents.size() != o.agents.size() || jobs.size() != o.jobs.size() || kv != o.kv ||
      agent_secrets != o.agent_secrets) {
    return false;
  }
  for (auto a = agents.begin(), b = o.agents.begin(); a != agents.end(); ++a, ++b) {
    if (a->first != b->first || !sameAgent(a->second, b->second)) return false;
  }
  for (auto a = jobs.begin(), b = o.jobs.begin(); a != jobs.end(); ++a, ++b) {
    if (a->first != b->first || !sameJob(a->second, b->second)) return false;
  }
  return true;
}

Record Record::agentRegistered(const coord::AgentInfo& info, std::string secret) {
  Record r;
  r.type = Type::kAgent;
  r.agent = info;
  r.secret = std::move(secret);
  return r;
}

Record Record::agentLost(std::string agent_id) {
  Record r;
  r.type = Type::kAgentLost;
  r.id = std::move(agent_id);
  return r;
}

Record Record::jobState(const Job& job) {
  Record r;
  r.type = Type::kJob;
  r.job = job;
  return r;
}

Record Record::jobRemoved(std::string job_id) {
  Record r;
  r.type = Type::kJobRemoved;
  r.id = std::move(job_id);
  return r;
}

Record Record::kvPut(std::string job_id, std::string key, std::string value) {
  Record r;
  r.type = Type::kKvPut;
  r.id = std::move(job_id);
  r.key = std::move(key);
  r.value = std::move(value);
  return r;
}

std::string encodeRecord(const Record& r) {
  json j{{"seq", r.seq}, {"type", typeName(r.type)}};
  switch (r.type) {
    case Record::Type::kAgent:
      j["agent"] = agentToJson(r.agent);
      if (!r.secret.empty()) j["secret"] = escapeString(r.secret);
      break;
    case Record::Type::kAgentLost:
    case Record::Type::kJobRemoved:
      j["id"] = escapeString(r.id);
      break;
    case Record::Type::kJob:
      if (r.members_from >= 0) {
        const size_t from = std::min(static_cast<size_t>(r.members_from), r.job.members.size());
        j["job"] = jobToJson(r.job, from, !r.same_slots);
        j["members_from"] = from;
        if (r.same_slots) j["same_slots"] = true;
        if (!r.members_changed.empty()) {
          json changed = json::array();
          for (const auto& [index, m] : r.members_changed) {
            json e = memberToJson(m);
            e["index"] = index;
            changed.push_back(std::move(e));
          }
          j["members_changed"] = std::move(changed);
        }
      } else {
        j["job"] = jobToJson(r.job);
      }
      break;
    case Record::Type::kKvPut:
      j["job"] = escapeString(r.id);
      j["key"] = escapeString(r.key);
      j["value"] = toHex(r.value);
      break;
  }
  // Every string is printable ASCII by construction, so dump cannot throw.
  return withChecksum(j.dump());
}

StatusOr<Record> decodeRecord(std::string_view line, bool legacy_ok) {
  try {
    bool had_crc = false;
    return recordFromJson(parseLine(checkedBody(line, legacy_ok, &had_crc)));
  } catch (const DecodeError& e) {
    return invalidArgument(e.what);
  } catch (const json::exception& e) {
    return invalidArgument(e.what());
  }
}

Status applyRecord(const Record& r, PersistedState* state) {
  switch (r.type) {
    case Record::Type::kAgent:
      state->agents[r.agent.agent_id()] = r.agent;
      if (r.secret.empty()) {
        state->agent_secrets.erase(r.agent.agent_id());
      } else {
        state->agent_secrets[r.agent.agent_id()] = r.secret;
      }
      break;
    case Record::Type::kAgentLost:
      state->agents.erase(r.id);
      state->agent_secrets.erase(r.id);
      break;
    case Record::Type::kJob:
      if (r.members_from >= 0) {
        auto prev = state->jobs.find(r.job.id);
        const size_t have = prev == state->jobs.end() ? 0 : prev->second.members.size();
        const size_t from = static_cast<size_t>(r.members_from);
        Job job = r.job;
        std::vector<JobMember> members;
        if (prev != state->jobs.end()) {
          members.assign(
              prev->second.members.begin(),
              prev->second.members.begin() + static_cast<std::ptrdiff_t>(std::min(from, have)));
        }
        for (const auto& [index, m] : r.members_changed) {
          if (index < members.size()) members[index] = m;
        }
        members.insert(members.end(), job.members.begin(), job.members.end());
        job.members = std::move(members);
        if (r.same_slots && prev != state->jobs.end()) job.slots = prev->second.slots;
        state->jobs.insert_or_assign(r.job.id, std::move(job));
        if (from > have) {
          return invalidArgument(
              fmt::format("job '{}' continues from member {} but its previous record has {}",
                          r.job.id, from, have));
        }
      } else {
        state->jobs.insert_or_assign(r.job.id, r.job);
      }
      break;
    case Record::Type::kJobRemoved: {
      state->jobs.erase(r.id);
      auto first = state->kv.lower_bound({r.id, std::string()});
      auto last = first;
      while (last != state->kv.end() && last->first.first == r.id) ++last;
      state->kv.erase(first, last);
      break;
    }
    case Record::Type::kKvPut:
      state->kv[{r.id, r.key}] = r.value;
      break;
  }
  return okStatus();
}

std::string encodeSnapshot(const PersistedState& state, uint64_t seq) {
  std::string out =
      withChecksum(json{{"type", "snapshot"}, {"version", kFormatVersion}, {"seq", seq}}.dump()) +
      "\n";
  auto add = [&](Record r) {
    r.seq = seq;
    out += encodeRecord(r);
    out += '\n';
  };
  for (const auto& [id, info] : state.agents) {
    auto secret = state.agent_secrets.find(id);
    add(Record::agentRegistered(
        info, secret == state.agent_secrets.end() ? std::string() : secret->second));
  }
  for (const auto& [id, job] : state.jobs) add(Record::jobState(job));
  for (const auto& [slot, value] : state.kv) add(Record::kvPut(slot.first, slot.second, value));
  return out;
}

StatusOr<LoadedState> loadState(std::string_view snapshot, std::string_view journal,
                                std::string_view snapshot_name, std::string_view journal_name) {
  LoadedState out;
  uint64_t snapshot_seq = 0;
  // Splits `text` into lines; `fn(line, number, terminated)`.
  auto forEachLine = [](std::string_view text, auto&& fn) {
    size_t pos = 0;
    size_t number = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      ++number;
      if (nl == std::string_view::npos) {
        fn(text.substr(pos), number, false, text.size());
        return;
      }
      fn(text.substr(pos, nl - pos), number, true, nl + 1);
      pos = nl + 1;
    }
  };
  int64_t snapshot_version = 0;  // 0: no snapshot
  try {
    bool header = false;
    forEachLine(snapshot, [&](std::string_view line, size_t number, bool terminated, size_t) {
      auto where = [&](const std::string& what) {
        return fmt::format("{} line {}: {}", snapshot_name, number, what);
      };
      if (!terminated) fail(where("unterminated line (the snapshot is written whole)"));
      if (line.empty()) return;
      try {
        bool had_crc = false;
        if (!header) {
          json h = parseLine(checkedBody(line, /*legacy_ok=*/true, &had_crc));
          if (stringField(h, "type") != "snapshot") fail("not a snapshot header");
          int64_t version = intField(h, "version", 1, kI32Max);
          if (version > kFormatVersion) {
            fail(fmt::format("format version {} is newer than this coordinator's ({})", version,
                             kFormatVersion));
          }
          if (version >= 2 && !had_crc) fail("no checksum on a version 2 snapshot header");
          snapshot_version = version;
          snapshot_seq = uintField(h, "seq");
          header = true;
          return;
        }
        Status applied = applyRecord(
            recordFromJson(parseLine(checkedBody(line, snapshot_version < 2, &had_crc))),
            &out.state);
        if (!applied.isOk()) fail(applied.message());
      } catch (const DecodeError& e) {
        fail(where(e.what));
      } catch (const json::exception& e) {
        fail(where(e.what()));
      }
    });
    if (!snapshot.empty() && !header) fail(fmt::format("{}: no header line", snapshot_name));
    out.last_seq = snapshot_seq;
    // Lines without a checksum: only an older coordinator's (see the header).
    bool legacy_ok = snapshot_version < 2;
    forEachLine(journal, [&](std::string_view line, size_t number, bool terminated, size_t end) {
      if (!terminated) {
        out.torn_tail = true;
        return;
      }
      out.valid_journal_bytes = end;
      if (line.empty()) return;
      try {
        bool had_crc = false;
        Record r = recordFromJson(parseLine(checkedBody(line, legacy_ok, &had_crc)));
        if (had_crc) legacy_ok = false;
        if (r.seq <= snapshot_seq) return;  // already in the snapshot
        if (r.seq <= out.last_seq) {
          fail(fmt::format("seq {} is not above the previous record's {}", r.seq, out.last_seq));
        }
        out.last_seq = r.seq;
        Status applied = applyRecord(r, &out.state);
        if (!applied.isOk()) fail(applied.message());
        ++out.journal_records;
      } catch (const DecodeError& e) {
        fail(fmt::format("{} line {}: {}", journal_name, number, e.what));
      } catch (const json::exception& e) {
        fail(fmt::format("{} line {}: {}", journal_name, number, e.what()));
      }
    });
  } catch (const DecodeError& e) {
    return invalidArgument(e.what);
  }
  return out;
}

uint32_t crc32c(std::string_view bytes) {
  static const auto kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) crc = kTable[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::string escapeString(std::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

namespace {

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

StatusOr<std::string> unescapeString(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (s.size() - i < 3) {
      return invalidArgument("truncated %-escape");
    }
    int hi = hexValue(s[i + 1]);
    int lo = hexValue(s[i + 2]);
    if (hi < 0 || lo < 0) return invalidArgument("bad %-escape");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

std::string toHex(std::string_view bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

StatusOr<std::string> fromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return invalidArgument("odd number of hex digits");
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = hexValue(hex[i]);
    int lo = hexValue(hex[i + 1]);
    if (hi < 0 || lo < 0) return invalidArgument("not a hex digit");
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace kolo::coordinator::persist
