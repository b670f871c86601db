// EtcdSink against a real etcd (started by the test on loopback; skipped
// when /usr/bin/etcd is missing): records and snapshots round-trip to the
// same PersistedState the journal would load, and a sink whose election key
// is gone cannot write (fencing).
#include "coordinator/persist/etcd_sink.h"

#include <gtest/gtest.h>

#include <atomic>

#include "coordinator/ha/etcd_client.h"
#include "coordinator/persist/record_sink.h"
#include "tests/coordinator/etcd_process.h"

namespace kolo::coordinator::persist {
namespace {

using std::chrono::milliseconds;
using testing::EtcdProcess;

coord::AgentInfo agent(const std::string& id) {
  coord::AgentInfo a;
  a.set_agent_id(id);
  a.set_hostname("host-" + id);
  a.set_rpc_address("host-" + id + ":7471");
  a.set_data_address(std::string("\x00\xff ucx\n", 7) + id);
  return a;
}

Job runningJob(const std::string& id) {
  Job job;
  job.id = id;
  job.token = "tok%" + id;
  job.world_size = 2;
  job.state = coord::RUNNING;
  job.generation = 1;
  job.created_wall_ms = 1700000000000;
  job.members.push_back({"a1", agent("a1"), 1, false});
  job.members.push_back({"a2", agent("a2"), 1, false});
  for (int i = 0; i < 2; ++i) {
    coord::AgentSlot slot;
    *slot.mutable_agent() = agent("a" + std::to_string(i + 1));
    slot.set_local_size(1);
    slot.set_rank_offset(i);
    slot.set_cross_rank(i);
    job.slots.push_back(slot);
  }
  return job;
}

TEST(EtcdClientTest, EndpointsAndPrefixRanges) {
  auto e = ha::parseEndpoints("a:1,http://b:2");
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_EQ(*e, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_FALSE(ha::parseEndpoints("").isOk());
  EXPECT_FALSE(ha::parseEndpoints("a:1,").isOk());
  EXPECT_FALSE(ha::parseEndpoints("nohost").isOk());
  auto tls = ha::parseEndpoints("https://a:1");
  ASSERT_FALSE(tls.isOk());
  EXPECT_NE(tls.status().message().find("TLS to etcd is not supported"), std::string::npos);
  EXPECT_EQ(ha::prefixRangeEnd("/kolo/a/"), "/kolo/a0");
  EXPECT_EQ(ha::prefixRangeEnd(std::string("a\xff", 2)), "b");
}

class EtcdSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) {
      GTEST_SKIP() << "no etcd binary (/usr/bin/etcd, or set KOLO_ETCD_BIN): apt-get install "
                      "etcd-server";
    }
    std::string error;
    ASSERT_TRUE(etcd_.start(milliseconds(15000), &error)) << error;
    ha::EtcdOptions o;
    o.endpoints = {etcd_.endpoint()};
    auto c = ha::EtcdClient::create(o);
    ASSERT_TRUE(c.isOk());
    client_ = std::move(*c);
  }

  // Creates the election key as a leader would; its create_revision.
  int64_t elect(const std::string& key) {
    auto put = client_->put(key, "127.0.0.1:1");
    EXPECT_TRUE(put.isOk()) << put.status().message();
    return put.isOk() ? put->header().revision() : 0;
  }

  size_t countKeys(const std::string& prefix) {
    auto r = client_->range(prefix, ha::prefixRangeEnd(prefix));
    EXPECT_TRUE(r.isOk());
    return r.isOk() ? static_cast<size_t>(r->kvs_size()) : 0;
  }

  EtcdProcess etcd_;
  std::unique_ptr<ha::EtcdClient> client_;
};

TEST_F(EtcdSinkTest, RecordsAndCompactionReloadToTheSameState) {
  const std::string prefix = "/kolo/sink-test/";
  int64_t rev = elect(prefix + "leader");
  MemorySink expected;  // the same records replayed in memory
  EtcdSinkOptions so;
  so.prefix = prefix;
  so.compact_records = 1000;
  uint64_t last = 0;
  {
    EtcdSink sink(client_.get(), so);
    auto empty = sink.load();
    ASSERT_TRUE(empty.isOk()) << empty.status().message();
    EXPECT_EQ(empty->last_seq, 0u);
    sink.arm(prefix + "leader", rev, 0);
    auto both = [&](Record r) {
      expected.append(r);
      return sink.append(std::move(r));
    };
    // Enough records for several Txns (64 a Txn).
    for (int i = 0; i < 150; ++i)
      both(Record::agentRegistered(agent("x" + std::to_string(i)), "s"));
    both(Record::jobState(runningJob("job/1")));
    both(Record::kvPut("job/1", "nccl\n", std::string("\x00id", 3)));
    last = both(Record::agentLost("x7"));
    ASSERT_TRUE(sink.waitDurable(last, milliseconds(10000)).isOk());
    EXPECT_EQ(countKeys(prefix + "records/"), 153u);

    // Compaction: a snapshot replaces the records it holds.
    sink.compact(expected.state());
    for (int i = 0; i < 5; ++i) last = both(Record::kvPut("job/1", "k" + std::to_string(i), "v"));
    ASSERT_TRUE(sink.waitDurable(last, milliseconds(10000)).isOk());
    EXPECT_EQ(countKeys(prefix + "records/"), 5u) << "records up to the snapshot are deleted";
    EXPECT_EQ(countKeys(prefix + "snapshot"), 2u) << "the pointer and one chunk";
    sink.close();
  }
  EXPECT_TRUE(expected.errors().empty()) << expected.errors();
  EtcdSink reader(client_.get(), so);
  auto loaded = reader.load();
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  EXPECT_EQ(loaded->last_seq, last);
  EXPECT_EQ(loaded->journal_records, 5u);
  EXPECT_TRUE(loaded->state == expected.state());
  EXPECT_EQ(loaded->state.agents.size(), 149u);
  EXPECT_EQ(loaded->state.kv.size(), 6u);

  // A second compaction (a new leader starts with one) drops the old chunks.
  reader.arm(prefix + "leader", rev, loaded->last_seq);
  reader.compact(loaded->state);
  uint64_t seq = reader.append(Record::agentLost("x8"));
  EXPECT_EQ(seq, last + 1) << "seqs go on after a reload";
  ASSERT_TRUE(reader.waitDurable(seq, milliseconds(10000)).isOk());
  EXPECT_EQ(countKeys(prefix + "snapshot"), 2u);
  EXPECT_EQ(countKeys(prefix + "records/"), 1u);
}

TEST_F(EtcdSinkTest, ACorruptRecordRefusesToLoadNamingIt) {
  const std::string prefix = "/kolo/corrupt/";
  int64_t rev = elect(prefix + "leader");
  EtcdSinkOptions so;
  so.prefix = prefix;
  EtcdSink sink(client_.get(), so);
  sink.arm(prefix + "leader", rev, 0);
  uint64_t seq = sink.append(Record::kvPut("j", "k", "v"));
  ASSERT_TRUE(sink.waitDurable(seq, milliseconds(10000)).isOk());
  auto r = client_->range(sink.recordKey(seq));
  ASSERT_TRUE(r.isOk());
  ASSERT_EQ(r->kvs_size(), 1);
  std::string line = r->kvs(0).value();
  line.replace(line.find("\"k\""), 3, "\"K\"");
  ASSERT_TRUE(client_->put(sink.recordKey(seq), line).isOk());
  auto loaded = EtcdSink(client_.get(), so).load();
  ASSERT_FALSE(loaded.isOk());
  EXPECT_NE(loaded.status().message().find("checksum mismatch"), std::string::npos)
      << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("etcd /kolo/corrupt/records/"), std::string::npos)
      << loaded.status().message();
}

TEST_F(EtcdSinkTest, ASinkWhoseElectionKeyIsGoneCannotWrite) {
  const std::string prefix = "/kolo/fenced/";
  const std::string key = prefix + "leader";
  int64_t rev = elect(key);
  EtcdSinkOptions so;
  so.prefix = prefix;
  EtcdSink sink(client_.get(), so);
  std::atomic<int> fenced{0};
  sink.arm(key, rev, 0, [&](const Status&) { fenced++; });
  uint64_t seq = sink.append(Record::kvPut("j", "before", "v"));
  ASSERT_TRUE(sink.waitDurable(seq, milliseconds(10000)).isOk());

  // Another coordinator won: the key is deleted and created again.
  ASSERT_TRUE(client_->deleteRange(key).isOk());
  ASSERT_TRUE(client_->put(key, "127.0.0.1:2").isOk());
  seq = sink.append(Record::kvPut("j", "after", "v"));
  Status st = sink.waitDurable(seq, milliseconds(10000));
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kAborted);
  EXPECT_EQ(st.message().rfind("fenced: ", 0), 0u) << st.message();
  EXPECT_EQ(fenced.load(), 1);
  EXPECT_EQ(countKeys(prefix + "records/"), 1u) << "the deposed leader's record is not in etcd";
  // And it stays fenced: a snapshot is refused too.
  sink.compact(PersistedState{});
  seq = sink.append(Record::agentLost("a"));
  EXPECT_FALSE(sink.waitDurable(seq, milliseconds(2000)).isOk());
  EXPECT_EQ(countKeys(prefix + "snapshot"), 0u);
}

}  // namespace
}  // namespace kolo::coordinator::persist
