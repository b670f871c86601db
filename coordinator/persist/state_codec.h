// The coordinator's durable state and its text form. Pure (no I/O), so it
// is unit-tested and fuzzed on its own; coordinator/persist/journal.h does
// the files.
//
// One record per line, a JSON object:
//   {"seq":7,"type":"agent","agent":{"id":..,"host":..,"rpc":..,"data":HEX},"secret":..}
//   {"seq":8,"type":"agent_lost","id":AGENT}
//   {"seq":9,"type":"job","job":{"id":..,"token":..,"world_size":4,"state":"RUNNING",
//                              "generation":1,"reason":..,"created_unix_ms":..,
//                              "ended_unix_ms":-1,"members":[..],"slots":[..]}}
//   {"seq":10,"type":"job_removed","id":JOB}
//   {"seq":11,"type":"kv","job":JOB,"key":KEY,"value":HEX}
// A "job" record carries the whole job as it is after the change, so replay
// is "last record wins" and never re-runs the membership rules; except that
// one with "members_from":K lists only members K.. and keeps the first K of
// the job's previous record (the journal's own, or the snapshot's), but for
// those in "members_changed" ([{"index":i, member}], i < K), and with
// "same_slots":true its slots too (none written): a job forming
// or its agents leaving write each member once or twice, not once per flush
// (a job of 4096 agents wrote 140-200 MB of journal while it formed and
// ended). Strings are
// percent-escaped outside printable ASCII (so any bytes survive and a line
// is always valid JSON); bytes fields are hex.
//
// Every record line ends in its checksum: the object's last member is
// "crc":"XXXXXXXX", the CRC-32C (hex) of the line without that member (the
// same JSON text closed right after the record's own members). A line
// whose checksum does not match (a token edited by hand, a flipped bit) is
// an error naming the file and line, like a malformed one.
//
// A snapshot is a header line {"type":"snapshot","version":2,"seq":S}
// followed by the records that rebuild the state (their seq is S). Journal
// records with seq <= S are already in the snapshot and are skipped.
//
// Format version 1 (before checksums and agent secrets) is still read: a
// version 1 snapshot's records have no checksum, and journal lines without
// one are accepted while the snapshot is absent or version 1 and no line
// with a checksum came before them. A coordinator that recovers such a state
// rewrites it at once as a version 2 snapshot.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/membership/job.h"
#include "kolo/proto/coordinator.pb.h"

namespace kolo::coordinator::persist {

inline constexpr int kFormatVersion = 2;

// Everything the coordinator keeps across a restart. Leases, watchers and
// KV waiters are not kept: agents get a fresh lease, clients re-watch.
struct PersistedState {
  std::map<std::string, coord::AgentInfo> agents;  // by agent_id
  std::map<std::string, std::string> agent_secrets;  // by agent_id (absent: none, version 1)
  std::map<std::string, Job> jobs;                 // by job id; ended_steady_ms is not kept
  std::map<std::pair<std::string, std::string>, std::string> kv;  // (job, key) -> value

  bool operator==(const PersistedState& o) const;
};

struct Record {
  enum class Type { kAgent, kAgentLost, kJob, kJobRemoved, kKvPut };
  Type type = Type::kAgent;
  uint64_t seq = 0;
  coord::AgentInfo agent;  // kAgent
  std::string secret;      // kAgent: the registration's agent secret
  std::string id;          // kAgentLost: agent id; kJobRemoved, kKvPut: job id
  Job job;                 // kJob
  // kJob: >= 0 when the record lists only job.members[members_from..] (the
  // earlier ones are the previous record's); -1: every member.
  int64_t members_from = -1;
  // kJob with members_from: the earlier members that changed since the
  // previous record (index < members_from, the member as it is now).
  std::vector<std::pair<uint32_t, JobMember>> members_changed;
  // kJob with members_from: the slots are the previous record's (not
  // written: "slots" absent, "same_slots":true).
  bool same_slots = false;
  std::string key;         // kKvPut
  std::string value;       // kKvPut

  static Record agentRegistered(const coord::AgentInfo& info, std::string secret = "");
  static Record agentLost(std::string agent_id);
  static Record jobState(const Job& job);
  static Record jobRemoved(std::string job_id);
  static Record kvPut(std::string job_id, std::string key, std::string value);
};

// One line with its checksum, without the trailing newline.
std::string encodeRecord(const Record& r);
// InvalidArgument (with what is wrong) for anything but a well-formed record
// whose checksum matches. `legacy_ok`: a line without a checksum (format
// version 1) is accepted too.
StatusOr<Record> decodeRecord(std::string_view line, bool legacy_ok = false);
// Field-by-field equality of what a record keeps (the agent's info, a
// member, a job's slots): replay checks, and Core's choice of what a job's
// next record must repeat.
bool sameAgent(const coord::AgentInfo& a, const coord::AgentInfo& b);
bool sameMember(const JobMember& a, const JobMember& b);
bool sameSlots(const std::vector<coord::AgentSlot>& a, const std::vector<coord::AgentSlot>& b);

// Applies a record to the state (the same effect the change had live). A
// job record that continues members the state lacks (members_from past the
// job's previous members, or no previous job) keeps what there is and says
// so: InvalidArgument (loadState's error for a corrupt journal).
Status applyRecord(const Record& r, PersistedState* state);

// The snapshot text (header + records, each line ending in '\n').
std::string encodeSnapshot(const PersistedState& state, uint64_t seq);

struct LoadedState {
  PersistedState state;
  uint64_t last_seq = 0;           // the highest seq seen (snapshot or journal)
  size_t journal_records = 0;      // journal records applied (after the snapshot)
  bool torn_tail = false;          // the journal's last line was incomplete and was ignored
  size_t valid_journal_bytes = 0;  // the journal's length up to its last whole record
};

// Rebuilds the state from a snapshot (may be empty: none yet) and the
// journal. A malformed line is an error naming the file and line, except an
// unterminated last journal line (a write cut short by a crash), which is
// ignored and reported in torn_tail.
// The names are how errors call the two files (their paths, in the Journal).
StatusOr<LoadedState> loadState(std::string_view snapshot, std::string_view journal,
                                std::string_view snapshot_name = "snapshot",
                                std::string_view journal_name = "journal");

// CRC-32C (Castagnoli) of `bytes` (exposed for tests).
uint32_t crc32c(std::string_view bytes);

// Escaping helpers (exposed for tests).
std::string escapeString(std::string_view s);
StatusOr<std::string> unescapeString(std::string_view s);
std::string toHex(std::string_view bytes);
StatusOr<std::string> fromHex(std::string_view hex);

}  // namespace kolo::coordinator::persist
