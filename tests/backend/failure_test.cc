// Failure behaviour of every compiled backend, peers as threads: creation
// when a peer never shows up, a peer that never answers, abort(), shutdown
// with queued work, bad arguments, and ranks that disagree on a collective.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <sstream>
#include <thread>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"
#include "common/config.h"
#include "common/fd.h"
#include "tests/backend/test_util.h"

namespace kolo::testing_backend {
namespace {

using Clock = std::chrono::steady_clock;

long msSince(Clock::time_point t) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

class FailureTest : public ::testing::TestWithParam<std::string> {
 protected:
  BackendOptions options(std::chrono::milliseconds timeout) {
    BackendOptions o;
    o.timeout = timeout;
    return o;
  }
};

TEST_P(FailureTest, CreationFailsWhenAPeerNeverShowsUp) {
  InMemoryKvStore kv;
  BackendOptions o = options(500ms);
  o.rank = 0;
  o.size = 2;
  const auto t0 = Clock::now();
  auto b = createBackend(GetParam(), o, kv);
  const long ms = msSince(t0);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kPeerFailure) << b.status().toString();
  EXPECT_NE(b.status().message().find("rank 1"), std::string::npos) << b.status().toString();
  EXPECT_LE(ms, 500 + 2000);
}

// Rank 1 publishes its address, then takes 3 s to learn rank 0's (a slow
// store): rank 2 dials rank 1 meanwhile and must wait for its answer rather
// than give up and leave it a hello from a closed connection. All three
// connect and allreduce.
TEST_P(FailureTest, CreationWaitsForAListenerThatAcceptsLate) {
  class SlowKv final : public KvStore {
   public:
    SlowKv(KvStore& inner, std::string slow_key) : inner_(inner), slow_key_(std::move(slow_key)) {}
    Status put(const std::string& key, std::string_view value) override { return inner_.put(key, value); }
    StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
      if (key == slow_key_) std::this_thread::sleep_for(3s);  // the slow reply under test
      return inner_.get(key, timeout);
    }

   private:
    KvStore& inner_;
    std::string slow_key_;
  };
  InMemoryKvStore kv;
  std::vector<std::unique_ptr<KvStore>> stores;
  std::vector<StatusOr<std::unique_ptr<Backend>>> made;
  for (int r = 0; r < 3; ++r) made.emplace_back(aborted("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    BackendOptions o = options(20000ms);
    o.rank = r;
    o.size = 3;
    o.key_prefix = "late";
    stores.push_back(std::make_unique<SlowKv>(kv, r == 1 ? "late/0" : "-"));
    threads.emplace_back([&, r, o] { made[r] = createBackend(GetParam(), o, *stores[r]); });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(made[r].isOk()) << "rank " << r << ": " << made[r].status().toString();
  std::vector<std::vector<int32_t>> bufs(3, std::vector<int32_t>(1000));
  std::vector<std::promise<Status>> done(3);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 1000; ++i) bufs[r][i] = r + i;
    (*made[r])->allreduce(bufs[r].data(), 1000, DataType::kInt32, ReduceOp::kSum,
                          [&done, r](Status s) { done[r].set_value(std::move(s)); });
  }
  for (int r = 0; r < 3; ++r) {
    auto f = done[r].get_future();
    ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "rank " << r;
    ASSERT_TRUE(f.get().isOk()) << "rank " << r;
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(bufs[r][i], 3 + 3 * i) << "rank " << r << " element " << i;
  }
}

TEST_P(FailureTest, BadOptionsAreInvalidArgument) {
  InMemoryKvStore kv;
  BackendOptions o = options(500ms);
  o.rank = 2;
  o.size = 2;
  auto b = createBackend(GetParam(), o, kv);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
}

// Ranks 0 and 1 enter an allreduce that rank 2 never joins: both fail with
// PeerFailure within the timeout (+2 s), and the backend stays broken.
TEST_P(FailureTest, APeerThatNeverAnswersFailsTheCollectiveWithinTheTimeout) {
  auto g = PeerGroup::create(GetParam(), 3, options(1000ms));
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  auto& group = **g;
  const size_t count = 1 << 16;  // 256 KiB: the ring
  std::vector<Bytes> bufs;
  for (int r = 0; r < 3; ++r)
    bufs.push_back(makeInput(DataType::kFloat32, ReduceOp::kSum, r, count));
  auto c = std::make_shared<Completions>(2);
  const auto t0 = Clock::now();
  for (int r = 0; r < 2; ++r) {
    group.at(r).allreduce(bufs[r].data(), count, DataType::kFloat32, ReduceOp::kSum, c->slot(r, c));
  }
  auto statuses = c->wait(1000ms + 2500ms);
  const long ms = msSince(t0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), Code::kPeerFailure)
        << "rank " << r << ": " << statuses[r].toString();
    EXPECT_NE(statuses[r].message().find("unreachable"), std::string::npos)
        << statuses[r].toString();
  }
  EXPECT_LE(ms, 1000 + 2000);

  // Later collectives on a broken backend fail at once with the same code.
  auto later = std::make_shared<Completions>(1);
  const auto t1 = Clock::now();
  group.at(0).barrier(later->slot(0, later));
  auto s = later->wait(2000ms);
  EXPECT_EQ(s[0].code(), Code::kPeerFailure) << s[0].toString();
  EXPECT_LE(msSince(t1), 500);

  // The silent rank's own late collective cannot succeed either.
  auto late = std::make_shared<Completions>(1);
  group.at(2).allreduce(bufs[2].data(), count, DataType::kFloat32, ReduceOp::kSum,
                        late->slot(0, late));
  auto ls = late->wait(1000ms + 2500ms);
  EXPECT_FALSE(ls[0].isOk());
  EXPECT_NE(ls[0].code(), Code::kTimedOut) << "no completion within timeout + 2.5 s";
}

// An agent whose ranks have shut down leaves as soon as its own part of the
// last collective is done, which can be before a slower peer has even
// started that collective. The root here sends its broadcast, completes and
// is destroyed; the other rank posts the same broadcast only after it has
// seen the root go, and still gets the root's data. A later collective that
// needs the gone rank fails with PeerFailure naming it, within the timeout.
TEST_P(FailureTest, APeerThatLeavesAfterItsPartFailsNothingThatItFinished) {
  auto g = PeerGroup::create(GetParam(), 2, options(2000ms));
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  auto& group = **g;
  const size_t bytes = 4096;  // sent eagerly: the root's send completes without the receiver
  Bytes root_buf(bytes), buf(bytes);
  for (size_t i = 0; i < bytes; ++i) root_buf[i] = static_cast<std::byte>(i * 7 + 3);
  auto first = std::make_shared<Completions>(1);
  group.at(0).broadcast(root_buf.data(), bytes, /*root=*/0, first->slot(0, first));
  auto s0 = first->wait(5000ms);
  ASSERT_TRUE(s0[0].isOk()) << s0[0].toString();
  group.destroy(0);
  std::this_thread::sleep_for(300ms);  // rank 1 has seen rank 0's connection end
  auto second = std::make_shared<Completions>(1);
  group.at(1).broadcast(buf.data(), bytes, /*root=*/0, second->slot(0, second));
  auto s1 = second->wait(5000ms);
  ASSERT_TRUE(s1[0].isOk()) << s1[0].toString();
  EXPECT_EQ(buf, root_buf);

  auto later = std::make_shared<Completions>(1);
  const auto t0 = Clock::now();
  group.at(1).barrier(later->slot(0, later));
  auto s2 = later->wait(2000ms + 2500ms);
  EXPECT_EQ(s2[0].code(), Code::kPeerFailure) << s2[0].toString();
  EXPECT_NE(s2[0].message().find("agent rank 0 unreachable"), std::string::npos) << s2[0].toString();
  EXPECT_LE(msSince(t0), 2000 + 2000);
}

TEST_P(FailureTest, AbortFailsTheRunningAndLaterCollectives) {
  auto g = PeerGroup::create(GetParam(), 2, options(30s));
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  auto& group = **g;
  Bytes buf = makeInput(DataType::kInt32, ReduceOp::kSum, 0, 1000);
  auto c = std::make_shared<Completions>(2);
  group.at(0).allreduce(buf.data(), 1000, DataType::kInt32, ReduceOp::kSum, c->slot(0, c));
  group.at(0).barrier(c->slot(1, c));  // queued behind it
  const auto t0 = Clock::now();
  group.at(0).abort(aborted("generation 3 is over"));
  auto statuses = c->wait(5s);
  EXPECT_LE(msSince(t0), 2500);
  for (const auto& s : statuses) {
    EXPECT_EQ(s.code(), Code::kAborted) << s.toString();
    EXPECT_NE(s.message().find("generation 3 is over"), std::string::npos) << s.toString();
  }
}

TEST_P(FailureTest, DestroyingABackendCompletesItsQueuedCollectives) {
  auto g = PeerGroup::create(GetParam(), 2, options(30s));
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  auto& group = **g;
  std::vector<Bytes> bufs(3, makeInput(DataType::kFloat64, ReduceOp::kMax, 0, 5000));
  auto c = std::make_shared<Completions>(3);
  for (int i = 0; i < 3; ++i) {
    group.at(0).allreduce(bufs[i].data(), 5000, DataType::kFloat64, ReduceOp::kMax, c->slot(i, c));
  }
  group.destroy(0);
  auto statuses = c->wait(0ms);  // the destructor already ran every callback
  for (const auto& s : statuses) EXPECT_EQ(s.code(), Code::kAborted) << s.toString();
}

// Arguments every rank rejects the same way do not break the backend.
TEST_P(FailureTest, RejectedArgumentsLeaveTheBackendUsable) {
  auto g = PeerGroup::create(GetParam(), 2, options(10s));
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  auto& group = **g;
  Bytes buf(16);
  auto statuses = group.run(
      [&](int r, Backend& b, Backend::Done done) {
        b.broadcast(buf.data(), 16, /*root=*/7, std::move(done));
      },
      10s);
  for (const auto& s : statuses) EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.toString();
  statuses = group.run(
      [&](int r, Backend& b, Backend::Done done) {
        b.allgatherv(buf.data(), 3, buf.data(), {1, 1}, std::move(done));  // 3 != its block of 1
      },
      10s);
  for (const auto& s : statuses) EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.toString();

  std::vector<Bytes> bufs;
  for (int r = 0; r < 2; ++r) bufs.push_back(makeInput(DataType::kInt64, ReduceOp::kSum, r, 10));
  statuses = group.run(
      [&](int r, Backend& b, Backend::Done done) {
        b.allreduce(bufs[r].data(), 10, DataType::kInt64, ReduceOp::kSum, std::move(done));
      },
      10s);
  ASSERT_TRUE(allOk(statuses));
  Bytes want = makeReference(DataType::kInt64, ReduceOp::kSum, 2, 10);
  EXPECT_TRUE(sameBytes(bufs[0].data(), want.data(), want.size()));
}

// Ranks that disagree on the count: an error on every rank, never a hang.
TEST_P(FailureTest, RanksThatDisagreeOnTheCountFail) {
  auto g = PeerGroup::create(GetParam(), 2, options(1000ms));
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  auto& group = **g;
  std::vector<Bytes> bufs = {Bytes(400), Bytes(480)};
  const auto t0 = Clock::now();
  auto statuses = group.run(
      [&](int r, Backend& b, Backend::Done done) {
        b.allreduce(bufs[r].data(), r == 0 ? 100 : 120, DataType::kFloat32, ReduceOp::kSum,
                    std::move(done));
      },
      5s);
  EXPECT_LE(msSince(t0), 1000 + 2000);
  bool named = false;
  for (const auto& s : statuses) {
    EXPECT_FALSE(s.isOk());
    EXPECT_NE(s.code(), Code::kTimedOut) << s.toString();
    if (s.message().find("disagree") != std::string::npos) named = true;
  }
  EXPECT_TRUE(named) << statuses[0].toString() << " / " << statuses[1].toString();
}

INSTANTIATE_TEST_SUITE_P(Backends, FailureTest, ::testing::ValuesIn(compiledBackends()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FailureTest);

TEST(BackendFactory, UnknownBackendIsInvalidArgument) {
  InMemoryKvStore kv;
  auto b = createBackend("carrier-pigeon", BackendOptions{}, kv);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
}

TEST(BackendFactory, ABackendLeftOutOfTheBuildIsNotViable) {
  const auto built = compiledBackends();
  if (std::find(built.begin(), built.end(), "ucx") != built.end()) {
    GTEST_SKIP() << "ucx is built in";
  }
  InMemoryKvStore kv;
  auto b = createBackend("ucx", BackendOptions{}, kv);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kUnavailable);
  EXPECT_EQ(b.status().message().rfind("not viable: ", 0), 0u) << b.status().toString();
}

TEST(BackendOptionsConfig, KnobsReachTheOptions) {
  Config config("test");
  defineBackendKnobs(config);
  const char* argv[] = {"test", "--small-message-bytes", "1024", "--backend-chunk-bytes=4096"};
  ASSERT_TRUE(
      config
          .loadWithEnv(4, argv,
                       {{"KOLO_BACKEND_TIMEOUT_MS", "1234"}, {"KOLO_BACKEND_PIPELINE_DEPTH", "8"}})
          .isOk());
  BackendOptions o = backendOptionsFromConfig(config);
  EXPECT_EQ(o.small_message_bytes, 1024u);
  EXPECT_EQ(o.chunk_bytes, 4096u);
  EXPECT_EQ(o.timeout, 1234ms);
  EXPECT_EQ(o.pipeline_depth, 8);
  EXPECT_EQ(o.reduce_thread, reduceThreadByDefault());  // "auto"
  EXPECT_EQ(o.spin_us, 50);
  EXPECT_EQ(o.ucx_tcp_tx_seg_bytes, 256u * 1024);
  EXPECT_EQ(o.ucx_tcp_rx_seg_bytes, 1024u * 1024);
  EXPECT_TRUE(validateBackendOptions(o).isOk());
}

TEST(BackendOptionsConfig, ReduceThreadIsAutoTrueOrFalse) {
  // auto: a helper thread only with 4 or more CPUs in the affinity mask.
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(reduceThreadByDefault(), CPU_COUNT(&set) >= 4);
  for (auto [text, want] : {std::pair<const char*, bool>{"true", true}, {"false", false}}) {
    Config config("test");
    defineBackendKnobs(config);
    const char* argv[] = {"test", "--backend-reduce-thread", text};
    ASSERT_TRUE(config.loadWithEnv(3, argv, {}).isOk());
    EXPECT_EQ(backendOptionsFromConfig(config).reduce_thread, want) << text;
  }
  auto bad = parseReduceThread("sometimes");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "backend-reduce-thread must be auto, true or false, got 'sometimes'");
}

TEST(BackendOptionsConfig, TcpSegmentKnobsAndTheirCheck) {
  Config config("test");
  defineBackendKnobs(config);
  const char* argv[] = {"test", "--ucx-tcp-tx-seg-bytes", "131072"};
  ASSERT_TRUE(config.loadWithEnv(3, argv, {{"KOLO_UCX_TCP_RX_SEG_BYTES", "65536"}, {"KOLO_BACKEND_SPIN_US", "0"}}).isOk());
  BackendOptions o = backendOptionsFromConfig(config);
  EXPECT_EQ(o.spin_us, 0);
  EXPECT_EQ(o.ucx_tcp_tx_seg_bytes, 131072u);
  EXPECT_EQ(o.ucx_tcp_rx_seg_bytes, 65536u);
  Status st = validateBackendOptions(o);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "ucx-tcp-rx-seg-bytes (65536) must be at least ucx-tcp-tx-seg-bytes (131072)");
  o.ucx_tcp_rx_seg_bytes = 0;  // UCX's own default: nothing to check against
  EXPECT_TRUE(validateBackendOptions(o).isOk());
}

// backend-tcp-address that is not this host's: refused at once, naming it
// (bind only: nothing is sent anywhere).
TEST(TcpBackendWire, AnAddressThisHostDoesNotHaveIsNotViable) {
  InMemoryKvStore kv;
  BackendOptions o;
  o.timeout = 5000ms;
  o.size = 2;
  o.tcp_address = "192.0.2.1";  // TEST-NET-1, on no interface here
  const auto t0 = Clock::now();
  auto b = createBackend("tcp", o, kv);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kUnavailable) << b.status().toString();
  EXPECT_NE(b.status().message().find("not viable: cannot listen on 192.0.2.1"), std::string::npos)
      << b.status().toString();
  EXPECT_LT(msSince(t0), 1000);
}

// The tcp backend's wire, from a hostile or broken peer: this test plays
// rank 1 of a 2-agent generation, says a correct hello (the nonce read from
// the store), then writes a frame header without the magic. Rank 0's
// creation barrier must fail at once with PeerFailure naming rank 1 and the
// malformed frame, not wait for its deadline.
TEST(TcpBackendWire, AFrameWithoutTheMagicFailsThePeerNamingIt) {
  InMemoryKvStore kv;
  BackendOptions o;
  o.timeout = 20000ms;
  o.rank = 0;
  o.size = 2;
  o.key_prefix = "wire";
  const auto t0 = Clock::now();
  auto made = std::async(std::launch::async, [&] { return createBackend("tcp", o, kv); });
  auto record = kv.get("wire/0", 5000ms);
  ASSERT_TRUE(record.isOk()) << record.status().toString();
  std::istringstream in(*record);
  std::string tag;
  uint64_t nonce = 0;
  int port = 0;
  in >> tag >> nonce >> port;
  ASSERT_EQ(tag, "kolo-tcp1") << *record;
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  struct {
    uint32_t magic, version;
    uint64_t nonce;
    uint32_t rank, size;
  } hello{0x6b6f6c6f, 1, nonce, 1, 2};
  ASSERT_EQ(::send(fd.get(), &hello, sizeof hello, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof hello));
  uint32_t answer = 99;
  ASSERT_EQ(::recv(fd.get(), &answer, sizeof answer, MSG_WAITALL), static_cast<ssize_t>(sizeof answer));
  EXPECT_EQ(answer, 0u);
  const uint8_t garbage[16] = {0xde, 0xad, 0xbe, 0xef};
  ASSERT_EQ(::send(fd.get(), garbage, sizeof garbage, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof garbage));
  ASSERT_EQ(made.wait_for(10s), std::future_status::ready) << "rank 0 hangs on a malformed frame";
  auto b = made.get();
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kPeerFailure) << b.status().toString();
  EXPECT_NE(b.status().message().find("agent rank 1 unreachable: malformed frame (bad magic"), std::string::npos)
      << b.status().toString();
  EXPECT_LT(msSince(t0), 5000) << "failed by its deadline, not by the frame";
}

}  // namespace
}  // namespace kolo::testing_backend
