// Coordinator durability: the record codec, replay, the journal files, and
// the Core's records replayed against its live state (stepped clock, no
// threads except the journal's own writer).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/event_loop.h"
#include "coordinator/core.h"
#include "coordinator/persist/journal.h"
#include "coordinator/persist/record_sink.h"
#include "coordinator/persist/state_codec.h"
#include "tests/coordinator/manual_clock.h"

namespace kolo::coordinator::persist {
namespace {

using std::chrono::milliseconds;

coord::AgentInfo agent(const std::string& id, const std::string& host) {
  coord::AgentInfo a;
  a.set_agent_id(id);
  a.set_hostname(host);
  a.set_rpc_address(host + ":7471");
  a.set_data_address(std::string("\x00\xff ucx\n", 7) + id);
  return a;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kolo-persist-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(StateCodecTest, EscapingRoundTripsEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  std::string escaped = escapeString(all);
  for (char c : escaped) {
    EXPECT_TRUE(c >= 0x20 && c <= 0x7e) << "escaped text must be printable ASCII";
  }
  auto back = unescapeString(escaped);
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(*back, all);
  EXPECT_EQ(escapeString("job-1/a b"), "job-1/a b") << "plain ids stay readable";
  EXPECT_FALSE(unescapeString("%4").isOk());
  EXPECT_FALSE(unescapeString("%zz").isOk());
  auto hex = fromHex(toHex(all));
  ASSERT_TRUE(hex.isOk());
  EXPECT_EQ(*hex, all);
  EXPECT_FALSE(fromHex("abc").isOk());
  EXPECT_FALSE(fromHex("zz").isOk());
}

TEST(StateCodecTest, RecordsRoundTrip) {
  Job job;
  job.id = "job\x01";
  job.token = "t%k";
  job.world_size = 3;
  job.state = coord::RUNNING;
  job.generation = 1;
  job.created_wall_ms = 1700000000000;
  job.members.push_back({"a1", agent("a1", "h1"), 1, false});
  job.members.push_back({"a2", agent("a2", "h2"), 2, true});
  coord::AgentSlot slot;
  *slot.mutable_agent() = agent("a1", "h1");
  slot.set_local_size(1);
  slot.set_rank_offset(0);
  slot.set_cross_rank(0);
  job.slots.push_back(slot);

  PersistedState want;
  want.agents["a1"] = agent("a1", "h1");
  want.jobs[job.id] = job;
  want.kv[{job.id, "k\n"}] = std::string("\x00v", 2);

  PersistedState got;
  uint64_t seq = 0;
  for (Record r : {Record::agentRegistered(agent("a1", "h1")),
                   Record::agentRegistered(agent("x", "h")), Record::agentLost("x"),
                   Record::jobState(job), Record::kvPut(job.id, "k\n", std::string("\x00v", 2))}) {
    r.seq = ++seq;
    std::string line = encodeRecord(r);
    EXPECT_EQ(line.find('\n'), std::string::npos);
    auto decoded = decodeRecord(line);
    ASSERT_TRUE(decoded.isOk()) << decoded.status().message() << " in " << line;
    EXPECT_EQ(decoded->seq, seq);
    ASSERT_TRUE(applyRecord(*decoded, &got).isOk());
  }
  EXPECT_TRUE(got == want);

  // A removed job takes its keys with it.
  ASSERT_TRUE(applyRecord(Record::jobRemoved(job.id), &got).isOk());
  EXPECT_TRUE(got.jobs.empty());
  EXPECT_TRUE(got.kv.empty());
}

// A slot names its agent by id when a member carries the same agent, so a
// large job's record holds each agent's fields once: a slot whose agent
// differs from its member's keeps them; an older record (every slot with
// its agent) still loads; a slot naming no member is refused with a reason.
TEST(StateCodecTest, SlotsNameTheirMembersAgentsByIdAndOlderRecordsStillLoad) {
  Job job;
  job.id = "big";
  job.token = "t";
  job.state = coord::RUNNING;
  job.generation = 1;
  const int n = 4096;
  job.world_size = n;
  for (int i = 0; i < n; ++i) {
    const std::string id = "agent-" + std::to_string(i);
    job.members.push_back({id, agent(id, "host-" + std::to_string(i)), 1, false});
    coord::AgentSlot slot;
    *slot.mutable_agent() = job.members.back().info;
    slot.set_local_size(1);
    slot.set_rank_offset(i);
    slot.set_cross_rank(i);
    job.slots.push_back(slot);
  }
  // One slot whose agent re-registered with another address since: kept whole.
  job.slots[7].mutable_agent()->set_rpc_address("elsewhere:1");
  Record r = Record::jobState(job);
  r.seq = 1;
  const std::string line = encodeRecord(r);
  EXPECT_EQ(line.find("elsewhere:1"), line.rfind("elsewhere:1"));
  EXPECT_NE(line.find("\"agent\":{\"data\""), std::string::npos);
  // Against the same job with every slot's agent written out (each slot's
  // agent made to differ from its member's): more than a quarter smaller.
  Job whole = job;
  for (coord::AgentSlot& s : whole.slots)
    s.mutable_agent()->set_data_address(s.agent().data_address() + "!");
  Record w = Record::jobState(whole);
  w.seq = 1;
  const std::string whole_line = encodeRecord(w);
  EXPECT_LT(line.size() * 4, whole_line.size() * 3) << line.size() << " vs " << whole_line.size();
  auto back = decodeRecord(line);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  ASSERT_EQ(back->job.slots.size(), job.slots.size());
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(back->job.slots[i].SerializeAsString(), job.slots[i].SerializeAsString()) << i;
  }
  PersistedState want, got;
  want.jobs[job.id] = job;
  ASSERT_TRUE(applyRecord(*back, &got).isOk());
  EXPECT_TRUE(got == want);

  // Older records carry every slot's agent.
  const std::string old_line =
      R"({"seq":2,"type":"job","job":{"id":"j","token":"t","world_size":1,"state":"RUNNING","generation":1,)"
      R"("reason":"","created_unix_ms":1,"ended_unix_ms":-1,"members":[{"agent_id":"a","agent":{"id":"a",)"
      R"("host":"h","rpc":"h:1","data":""},"local_size":1,"left":false}],"slots":[{"agent":{"id":"a","host":"h",)"
      R"("rpc":"h:1","data":""},"local_size":1,"rank_offset":0,"cross_rank":0}]}})";
  auto old = decodeRecord(old_line, /*legacy_ok=*/true);
  ASSERT_TRUE(old.isOk()) << old.status().message();
  ASSERT_EQ(old->job.slots.size(), 1u);
  EXPECT_EQ(old->job.slots[0].agent().rpc_address(), "h:1");

  std::string stray = old_line;
  stray.replace(
      stray.find(R"("slots":[{"agent":{"id":"a","host":"h","rpc":"h:1","data":""},)"),
      std::string(R"("slots":[{"agent":{"id":"a","host":"h","rpc":"h:1","data":""},)").size(),
      R"("slots":[{"agent_id":"nobody",)");
  auto bad = decodeRecord(stray, /*legacy_ok=*/true);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(
      bad.status().message().find("a slot names agent 'nobody', which is not a member of job 'j'"),
      std::string::npos)
      << bad.status().message();
}

// A record with members_from keeps the first members of the job's previous
// record and lists the rest; one that continues past what the previous
// record had is a corrupt journal, named by its line.
TEST(StateCodecTest, AJobRecordCanListOnlyTheMembersAfterThePreviousOnes) {
  Job job;
  job.id = "j";
  job.token = "t";
  job.world_size = 5;
  for (int i = 0; i < 3; ++i)
    job.members.push_back({"a" + std::to_string(i), agent("a" + std::to_string(i), "h"), 1, false});
  Record first = Record::jobState(job);
  first.seq = 1;
  for (int i = 3; i < 5; ++i)
    job.members.push_back({"a" + std::to_string(i), agent("a" + std::to_string(i), "h"), 1, false});
  Record next = Record::jobState(job);
  next.seq = 2;
  next.members_from = 3;
  const std::string line = encodeRecord(next);
  EXPECT_EQ(line.find("\"a0\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"a4\""), std::string::npos) << line;
  const std::string journal = encodeRecord(first) + "\n" + line + "\n";
  auto loaded = loadState("", journal);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  PersistedState want;
  want.jobs["j"] = job;
  EXPECT_TRUE(loaded->state == want);

  // Continuing from member 4 when the previous record had 3 (a record lost
  // in between: not a journal this coordinator writes).
  Record past = next;
  past.members_from = 4;
  auto bad = loadState("", encodeRecord(first) + "\n" + encodeRecord(past) + "\n");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find(
                "journal line 2: job 'j' continues from member 4 but its previous record has 3"),
            std::string::npos)
      << bad.status().message();
}

TEST(StateCodecTest, MalformedRecordsAreRejectedWithAReason) {
  for (const char* bad :
       {"", "{", "[]", "{\"seq\":1}", "{\"seq\":1,\"type\":\"nope\"}",
        "{\"seq\":-1,\"type\":\"agent_lost\",\"id\":\"a\"}",
        "{\"seq\":1,\"type\":\"kv\",\"job\":\"j\",\"key\":\"k\",\"value\":\"xyz\"}",
        "{\"seq\":1,\"type\":\"job\",\"job\":{\"id\":\"j\"}}",
        "{\"seq\":1,\"type\":\"agent\",\"agent\":{\"id\":\"\",\"host\":\"\",\"rpc\":\"\","
        "\"data\":\"\"}}"}) {
    auto r = decodeRecord(bad, /*legacy_ok=*/true);
    EXPECT_FALSE(r.isOk()) << bad;
    if (!r.isOk()) {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
}

TEST(StateCodecTest, LoadSkipsJournalRecordsInTheSnapshotAndDropsATornTail) {
  PersistedState base;
  base.agents["a"] = agent("a", "h");
  std::string snapshot = encodeSnapshot(base, 5);

  auto line = [](Record r, uint64_t seq) {
    r.seq = seq;
    return encodeRecord(r) + "\n";
  };
  std::string journal = line(Record::agentLost("a"), 4)  // older than the snapshot: skipped
                        + line(Record::agentRegistered(agent("b", "h")), 6) +
                        line(Record::kvPut("j", "k", "v"), 7);
  std::string torn = line(Record::agentRegistered(agent("c", "h")), 8);
  torn.pop_back();
  torn.resize(torn.size() / 2);

  auto loaded = loadState(snapshot, journal + torn);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  EXPECT_EQ(loaded->last_seq, 7u);
  EXPECT_EQ(loaded->journal_records, 2u);
  EXPECT_TRUE(loaded->torn_tail);
  EXPECT_EQ(loaded->valid_journal_bytes, journal.size());
  EXPECT_EQ(loaded->state.agents.count("a"), 1u);
  EXPECT_EQ(loaded->state.agents.count("b"), 1u);
  EXPECT_EQ(loaded->state.agents.count("c"), 0u);
  EXPECT_EQ(loaded->state.kv.size(), 1u);

  // A bad whole line is corruption, not a torn write: refuse, naming it.
  auto corrupt = loadState(snapshot, "garbage\n" + journal);
  ASSERT_FALSE(corrupt.isOk());
  EXPECT_NE(corrupt.status().message().find("journal line 1"), std::string::npos)
      << corrupt.status().message();
  auto backwards = loadState("", line(Record::agentLost("a"), 9) + line(Record::agentLost("a"), 8));
  ASSERT_FALSE(backwards.isOk());
  auto newer = loadState("{\"type\":\"snapshot\",\"version\":99,\"seq\":1}\n", "");
  ASSERT_FALSE(newer.isOk());
  EXPECT_NE(newer.status().message().find("newer"), std::string::npos);
}

// Every record carries a CRC-32C of its text: a token edited by hand (or a
// flipped bit) stops the load, naming the line.
TEST(StateCodecTest, AnAlteredRecordFailsItsChecksumNamingTheLine) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  Job job;
  job.id = "train";
  job.token = "s3cret-token";
  job.world_size = 1;
  Record r = Record::jobState(job);
  r.seq = 2;
  std::string good = encodeRecord(r);
  ASSERT_NE(good.rfind(",\"crc\":\""), std::string::npos) << good;
  std::string altered = good;
  altered.replace(altered.find("s3cret-token"), 12, "attacker-tok");

  auto decoded = decodeRecord(altered);
  ASSERT_FALSE(decoded.isOk());
  EXPECT_NE(decoded.status().message().find("checksum mismatch"), std::string::npos)
      << decoded.status().message();

  Record first = Record::agentRegistered(agent("a", "h"), "agent-secret");
  first.seq = 1;
  std::string journal = encodeRecord(first) + "\n" + altered + "\n";
  auto loaded = loadState("", journal, "snapshot", "/state/journal");
  ASSERT_FALSE(loaded.isOk());
  EXPECT_NE(loaded.status().message().find("/state/journal line 2: checksum mismatch"),
            std::string::npos)
      << loaded.status().message();
  // The same in a snapshot.
  PersistedState state;
  state.jobs[job.id] = job;
  std::string snapshot = encodeSnapshot(state, 3);
  snapshot.replace(snapshot.find("s3cret-token"), 12, "attacker-tok");
  auto from_snapshot = loadState(snapshot, "");
  ASSERT_FALSE(from_snapshot.isOk());
  EXPECT_NE(from_snapshot.status().message().find("snapshot line 2: checksum mismatch"),
            std::string::npos)
      << from_snapshot.status().message();
  // Unaltered, both load, the agent's secret with them.
  auto fine = loadState("", encodeRecord(first) + "\n" + good + "\n");
  ASSERT_TRUE(fine.isOk()) << fine.status().message();
  EXPECT_EQ(fine->state.agent_secrets.at("a"), "agent-secret");
  EXPECT_EQ(fine->state.jobs.at("train").token, "s3cret-token");
}

// A state written before checksums (format version 1) still loads; lines
// without a checksum are not accepted once checksummed ones came before.
TEST(StateCodecTest, VersionOneStateStillLoads) {
  std::string v1_snapshot =
      "{\"seq\":4,\"type\":\"snapshot\",\"version\":1}\n"
      "{\"agent\":{\"data\":\"\",\"host\":\"h\",\"id\":\"a\",\"rpc\":\"\"},\"seq\":4,"
      "\"type\":\"agent\"}\n";
  std::string v1_line = "{\"id\":\"a\",\"seq\":5,\"type\":\"agent_lost\"}\n";
  auto loaded = loadState(v1_snapshot, v1_line);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  EXPECT_TRUE(loaded->state.agents.empty());
  EXPECT_EQ(loaded->last_seq, 5u);

  Record r = Record::agentRegistered(agent("b", "h"), "s");
  r.seq = 6;
  std::string v2_line = encodeRecord(r) + "\n";
  std::string v1_after = "{\"id\":\"b\",\"seq\":7,\"type\":\"agent_lost\"}\n";
  auto mixed = loadState(v1_snapshot, v1_line + v2_line);
  ASSERT_TRUE(mixed.isOk()) << mixed.status().message();
  auto stripped = loadState(v1_snapshot, v1_line + v2_line + v1_after);
  ASSERT_FALSE(stripped.isOk());
  EXPECT_NE(stripped.status().message().find("journal line 3: no checksum"), std::string::npos)
      << stripped.status().message();
  // After a version 2 snapshot, every journal line needs one.
  auto after_v2 = loadState(encodeSnapshot(PersistedState{}, 4), v1_line);
  ASSERT_FALSE(after_v2.isOk());
  EXPECT_NE(after_v2.status().message().find("journal line 1: no checksum"), std::string::npos)
      << after_v2.status().message();
}

TEST(JournalTest, AppendsAreDurableAndSurviveAReopen) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::string state_dir = dir.path() + "/state";
  {
    LoadedState loaded;
    auto journal = Journal::open({state_dir, 1000}, &loaded);
    ASSERT_TRUE(journal.isOk()) << journal.status().message();
    EXPECT_EQ(loaded.last_seq, 0u);
    EXPECT_EQ((std::filesystem::status(state_dir).permissions() & std::filesystem::perms::all),
              std::filesystem::perms::owner_all)
        << "the state dir holds job tokens: 0700";

    // The lock keeps a second coordinator out of the same directory.
    LoadedState other;
    auto second = Journal::open({state_dir, 1000}, &other);
    ASSERT_FALSE(second.isOk());
    EXPECT_NE(second.status().message().find("in use by another"), std::string::npos)
        << second.status().message();

    (*journal)->append(Record::agentRegistered(agent("a", "h")));
    uint64_t seq = (*journal)->append(Record::kvPut("j", "k", "v"));
    EXPECT_EQ(seq, 2u);
    ASSERT_TRUE((*journal)->waitDurable(seq, milliseconds(10000)).isOk());
    // Durable means in the file now, before any close.
    std::string text = readFile(state_dir + "/journal");
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  }
  LoadedState loaded;
  auto journal = Journal::open({state_dir, 1000}, &loaded);
  ASSERT_TRUE(journal.isOk()) << journal.status().message();
  EXPECT_EQ(loaded.last_seq, 2u);
  EXPECT_EQ(loaded.state.agents.count("a"), 1u);
  EXPECT_EQ(loaded.state.kv.size(), 1u);
  EXPECT_EQ((*journal)->append(Record::agentLost("a")), 3u) << "seqs go on after a restart";
}

TEST(JournalTest, CompactionReplacesTheJournalWithASnapshot) {
  TempDir dir;
  std::string state_dir = dir.path() + "/state";
  PersistedState live;
  {
    LoadedState loaded;
    auto journal = Journal::open({state_dir, 3}, &loaded);
    ASSERT_TRUE(journal.isOk()) << journal.status().message();
    uint64_t seq = 0;
    for (int i = 0; i < 3; ++i) {
      Record r = Record::agentRegistered(agent("a" + std::to_string(i), "h"));
      ASSERT_TRUE(applyRecord(r, &live).isOk());
      seq = (*journal)->append(r);
    }
    EXPECT_TRUE((*journal)->wantsCompaction());
    (*journal)->compact(live);
    EXPECT_FALSE((*journal)->wantsCompaction()) << "one compaction at a time";
    Record after = Record::kvPut("j", "k", "after the snapshot");
    ASSERT_TRUE(applyRecord(after, &live).isOk());
    seq = (*journal)->append(after);
    ASSERT_TRUE((*journal)->waitDurable(seq, milliseconds(10000)).isOk());
    std::string journal_text = readFile(state_dir + "/journal");
    EXPECT_EQ(std::count(journal_text.begin(), journal_text.end(), '\n'), 1)
        << "only the record after the snapshot is left: " << journal_text;
    EXPECT_NE(readFile(state_dir + "/snapshot").find("\"seq\":3"), std::string::npos);
  }
  LoadedState loaded;
  auto journal = Journal::open({state_dir, 3}, &loaded);
  ASSERT_TRUE(journal.isOk()) << journal.status().message();
  EXPECT_TRUE(loaded.state == live);
  EXPECT_EQ(loaded.last_seq, 4u);
}

TEST(JournalTest, ATornLastRecordIsCutOffAndACorruptOneRefusesToStart) {
  TempDir dir;
  std::string state_dir = dir.path() + "/state";
  {
    LoadedState loaded;
    auto journal = Journal::open({state_dir, 1000}, &loaded);
    ASSERT_TRUE(journal.isOk());
    uint64_t seq = (*journal)->append(Record::agentRegistered(agent("a", "h")));
    ASSERT_TRUE((*journal)->waitDurable(seq, milliseconds(10000)).isOk());
  }
  std::string good = readFile(state_dir + "/journal");
  writeFile(state_dir + "/journal", good + "{\"seq\":2,\"type\":\"ag");  // a crash mid-write
  {
    LoadedState loaded;
    auto journal = Journal::open({state_dir, 1000}, &loaded);
    ASSERT_TRUE(journal.isOk()) << journal.status().message();
    EXPECT_TRUE(loaded.torn_tail);
    EXPECT_EQ(loaded.state.agents.size(), 1u);
    uint64_t seq = (*journal)->append(Record::agentRegistered(agent("b", "h")));
    ASSERT_TRUE((*journal)->waitDurable(seq, milliseconds(10000)).isOk());
  }
  {
    LoadedState loaded;
    auto journal = Journal::open({state_dir, 1000}, &loaded);
    ASSERT_TRUE(journal.isOk()) << journal.status().message()
                                << " (the torn tail must be cut before appending)";
    EXPECT_FALSE(loaded.torn_tail);
    EXPECT_EQ(loaded.state.agents.size(), 2u);
  }
  writeFile(state_dir + "/journal", "not json\n" + good);
  LoadedState loaded;
  auto journal = Journal::open({state_dir, 1000}, &loaded);
  ASSERT_FALSE(journal.isOk());
  EXPECT_NE(journal.status().message().find("journal line 1"), std::string::npos)
      << journal.status().message();
}

// The Core's records, replayed, must equal its live state after every kind
// of change; and a Core restored from that state must answer the same.
class CoreRecordsTest : public ::testing::Test {
 protected:
  CoreRecordsTest()
      : loop_("test-loop"),
        core_(&loop_, MembershipOptions{5000, 1000, 60 * 1000}, &clock_, &sink_) {}

  void registerAgent(const std::string& id, const std::string& host) {
    coord::RegisterAgentRequest req;
    *req.mutable_agent() = agent(id, host);
    coord::RegisterAgentReply reply;
    ASSERT_TRUE(core_.registerAgentOnLoop(req, &reply).ok());
    secrets_[id] = reply.agent_secret();
  }
  grpc::Status join(const std::string& job, const std::string& a, int local, int world) {
    coord::JoinJobRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_agent_id(a);
    req.set_agent_secret(secrets_[a]);
    req.set_local_size(local);
    req.set_world_size(world);
    return core_.joinJobOnLoop(req);
  }
  grpc::Status leave(const std::string& job, const std::string& a, bool failed) {
    coord::LeaveJobRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_agent_id(a);
    req.set_agent_secret(secrets_[a]);
    req.set_failed(failed);
    req.set_reason(failed ? "boom" : "");
    return core_.leaveJobOnLoop(req);
  }
  grpc::Status kvPut(const std::string& job, const std::string& key, const std::string& value) {
    coord::KvPutRequest req;
    req.set_job_id(job);
    req.set_token("tok");
    req.set_key(key);
    req.set_value(value);
    return core_.kvPutOnLoop(req);
  }
  void expectReplayMatches(const char* after) {
    EXPECT_TRUE(sink_.errors().empty()) << sink_.errors();
    EXPECT_TRUE(sink_.state() == core_.persistedStateOnLoop()) << "replay differs after " << after;
  }

  ManualClock clock_;
  MemorySink sink_;
  EventLoop loop_;  // never started: the test is the loop thread
  Core core_;
  std::map<std::string, std::string> secrets_;  // agent id -> its registration's secret
};

// A job forming writes each member once: every join's record lists only
// the members its last record did not have (members_from), and every leave
// only the member it marks (members_changed), so the journal of a job of N
// agents grows as N, not N^2 / 2; replayed, it is the live state after
// every join and leave.
TEST_F(CoreRecordsTest, AJobJournalsEachJoinAndLeaveOnce) {
  const int n = 300;
  for (int i = 0; i < n; ++i)
    registerAgent("agent-" + std::to_string(i), "host-" + std::to_string(i));
  const uint64_t before = sink_.bytes();
  for (int i = 0; i < n - 1; ++i) {
    ASSERT_TRUE(join("big", "agent-" + std::to_string(i), 1, n).ok());
    if (i % 50 == 0) expectReplayMatches("a join");
  }
  expectReplayMatches("the joins");
  const uint64_t forming = sink_.bytes() - before;
  ASSERT_TRUE(join("big", "agent-" + std::to_string(n - 1), 1, n).ok());  // seals
  expectReplayMatches("the seal");
  EXPECT_EQ(sink_.state().jobs.at("big").state, coord::RUNNING);
  Record whole = Record::jobState(*core_.membership().findJob("big"));
  whole.seq = 1;
  const size_t record = encodeRecord(whole).size();
  // Whole records at every join would be about n / 2 such records.
  EXPECT_LT(forming, 3 * record) << forming << " bytes for " << n - 1
                                 << " joins; one whole record: " << record;
  // Its agents leave one by one: each leave marks one member.
  const uint64_t sealed = sink_.bytes();
  for (int i = 0; i < n - 1; ++i) {
    ASSERT_TRUE(leave("big", "agent-" + std::to_string(i), false).ok());
    if (i % 50 == 0) expectReplayMatches("a leave");
  }
  expectReplayMatches("the leaves");
  EXPECT_LT(sink_.bytes() - sealed, 3 * record)
      << sink_.bytes() - sealed << " bytes for " << n - 1 << " leaves";
  ASSERT_TRUE(leave("big", "agent-" + std::to_string(n - 1), false).ok());
  expectReplayMatches("the last leave");
  EXPECT_EQ(sink_.state().jobs.at("big").state, coord::FINISHED);
}

TEST_F(CoreRecordsTest, EveryChangeIsRecordedAndARestoredCoreAnswersTheSame) {
  registerAgent("a1", "node-b");
  registerAgent("a2", "node-a");
  registerAgent("a3", "node-c");
  expectReplayMatches("register");
  ASSERT_TRUE(join("run", "a1", 2, 3).ok());
  expectReplayMatches("join");
  ASSERT_TRUE(join("run", "a2", 1, 3).ok());
  expectReplayMatches("seal");
  ASSERT_TRUE(kvPut("run", "nccl-id", std::string("\x00\x01", 2)).ok());
  expectReplayMatches("kv");
  ASSERT_TRUE(join("forming", "a3", 1, 2).ok());
  ASSERT_TRUE(join("gone", "a3", 1, 2).ok());
  ASSERT_TRUE(kvPut("gone", "k", "v").ok());
  ASSERT_TRUE(leave("gone", "a3", false).ok());  // the last one leaves a FORMING job: removed
  expectReplayMatches("removal");
  ASSERT_TRUE(join("fail", "a3", 1, 1).ok());
  ASSERT_TRUE(leave("fail", "a3", true).ok());
  expectReplayMatches("failure");
  ASSERT_TRUE(join("done", "a2", 1, 1).ok());
  ASSERT_TRUE(leave("done", "a2", false).ok());
  expectReplayMatches("finish");
  EXPECT_EQ(sink_.state().jobs.at("done").state, coord::FINISHED);

  // Restore into a fresh Core at a later time: same jobs, offsets, keys.
  ManualClock later;
  later.advance(10 * 60 * 1000);
  EventLoop loop2("test-loop-2");
  Core restored(&loop2, MembershipOptions{5000, 1000, 60 * 1000}, &later);
  restored.restoreOnLoop(sink_.state());
  EXPECT_EQ(restored.listJobsOnLoop().SerializeAsString(),
            core_.listJobsOnLoop().SerializeAsString());
  coord::WatchJobRequest wreq;
  wreq.set_job_id("run");
  wreq.set_token("tok");
  auto queue = std::make_shared<WatchQueue>();
  ASSERT_TRUE(restored.watchOnLoop(wreq, queue).ok());
  coord::World world;
  ASSERT_EQ(queue->next(&world, milliseconds(0)), WatchQueue::Next::kWorld)
      << "a re-opened watch gets the current World at once";
  EXPECT_EQ(world.state(), coord::RUNNING);
  EXPECT_EQ(world.generation(), 1u);
  ASSERT_EQ(world.agents_size(), 2);
  EXPECT_EQ(world.agents(0).agent().agent_id(), "a2");
  EXPECT_EQ(world.agents(0).rank_offset(), 0);
  EXPECT_EQ(world.agents(1).rank_offset(), 1);
  coord::KvGetRequest kreq;
  kreq.set_job_id("run");
  kreq.set_token("tok");
  kreq.set_key("nccl-id");
  std::optional<std::string> value;
  ASSERT_TRUE(restored.kvGetOnLoop(kreq, [&](std::optional<std::string> v) { value = v; }).ok());
  EXPECT_EQ(value, std::string("\x00\x01", 2));
  coord::HeartbeatRequest hb;
  hb.set_agent_id("a1");
  hb.set_agent_secret(secrets_["a1"]);
  coord::HeartbeatReply hb_reply;
  ASSERT_TRUE(restored.heartbeatOnLoop(hb, &hb_reply).ok()) << "the secret survives a restart";
  EXPECT_TRUE(hb_reply.known()) << "agents come back";

  // Restored agents have one fresh lease: a silent one is lost after it.
  later.advance(5000);
  restored.expireLeasesOnLoop();
  coord::ListJobsReply jobs = restored.listJobsOnLoop();
  for (const auto& j : jobs.jobs()) {
    if (j.job_id() == "run") {
      EXPECT_EQ(j.state(), coord::FAILED) << "its agents stayed silent";
    }
  }
  // Ended jobs age by the wall clock across the restart: "fail" ended 10
  // minutes before, beyond the 60 s retention.
  restored.collectEndedJobsOnLoop();
  EXPECT_EQ(restored.membership().findJob("fail"), nullptr);
}

TEST_F(CoreRecordsTest, LeaseExpiryIsRecorded) {
  registerAgent("a1", "h1");
  registerAgent("a2", "h2");
  ASSERT_TRUE(join("job", "a1", 1, 2).ok());
  ASSERT_TRUE(join("job", "a2", 1, 2).ok());
  clock_.advance(5000);
  core_.expireLeasesOnLoop();
  expectReplayMatches("expiry");
  EXPECT_TRUE(sink_.state().agents.empty());
  EXPECT_EQ(sink_.state().jobs.at("job").state, coord::FAILED);
  clock_.advance(60 * 1000);
  core_.collectEndedJobsOnLoop();
  expectReplayMatches("retention");
  EXPECT_TRUE(sink_.state().jobs.empty());
}

}  // namespace
}  // namespace kolo::coordinator::persist
