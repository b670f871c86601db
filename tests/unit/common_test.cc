#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "common/config.h"
#include "common/event_loop.h"
#include "common/ipc_layout.h"
#include "common/log.h"
#include "common/shm.h"
#include "common/spsc_ring.h"

namespace kolo {
namespace {

TEST(SpscRing, PushPopWrapAndFull) {
  std::vector<char> mem(SpscRing<uint64_t>::bytesFor(8) + 64);
  SpscRing<uint64_t>::format(mem.data(), 8);
  SpscRing<uint64_t> r(mem.data());
  uint64_t v;
  EXPECT_FALSE(r.tryPop(&v));
  for (uint64_t round = 0; round < 5; ++round) {
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(r.tryPush(round * 100 + i));
    EXPECT_FALSE(r.tryPush(999)) << "full ring must refuse";
    for (uint64_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(r.tryPop(&v));
      EXPECT_EQ(v, round * 100 + i);
    }
    EXPECT_TRUE(r.empty());
  }
}

TEST(SpscRing, TwoThreadsAcrossSharedMemory) {
  auto region = SharedRegion::create("ring-test", 1 << 20);
  ASSERT_TRUE(region.isOk()) << region.status().toString();
  SpscRing<SubmitDesc>::format(region->data(), 64);
  SpscRing<SubmitDesc> prod(region->data()), cons(region->data());
  const uint64_t kN = 200000;
  std::thread t([&] {
    SubmitDesc d{};
    for (uint64_t i = 0; i < kN; ++i) {
      d.handle = i;
      while (!prod.tryPush(d)) std::this_thread::yield();
    }
  });
  SubmitDesc d;
  for (uint64_t i = 0; i < kN; ++i) {
    while (!cons.tryPop(&d)) std::this_thread::yield();
    ASSERT_EQ(d.handle, i);
  }
  t.join();
}

// The ring's peer is another, untrusted process (docs/security.md): what it
// writes into the header must never move our own index, our capacity, or an
// access outside the entries.
TEST(SpscRing, ConsumerRefusesATailMovedPastCapacityAndStaysRefusing) {
  std::vector<char> mem(SpscRing<uint64_t>::bytesFor(8));
  SpscRing<uint64_t>::format(mem.data(), 8);
  SpscRing<uint64_t> prod(mem.data(), 8), cons(mem.data(), 8);
  ASSERT_TRUE(prod.tryPush(7));
  auto* hdr = reinterpret_cast<RingHeader*>(mem.data());
  hdr->tail.store(5000);  // the producer claims 5000 entries in a ring of 8
  uint64_t v = 0;
  EXPECT_TRUE(cons.empty());
  EXPECT_EQ(cons.size(), 0u);
  EXPECT_FALSE(cons.tryPop(&v));
  ASSERT_TRUE(cons.corrupt());
  EXPECT_EQ(cons.corruption(),
            "the producer moved the tail: tail 5000, head 0: 5000 entries in a ring of 8");
  hdr->tail.store(1);  // putting it back does not mend the ring
  EXPECT_FALSE(cons.tryPop(&v));
}

TEST(SpscRing, ProducerRefusesAHeadPastItsTail) {
  std::vector<char> mem(SpscRing<uint64_t>::bytesFor(8));
  SpscRing<uint64_t>::format(mem.data(), 8);
  SpscRing<uint64_t> prod(mem.data(), 8);
  ASSERT_TRUE(prod.tryPush(1));
  reinterpret_cast<RingHeader*>(mem.data())->head.store(3);  // consumed 3 of the 1 entry there is
  EXPECT_FALSE(prod.tryPush(2));
  ASSERT_TRUE(prod.corrupt());
  EXPECT_EQ(prod.corruption(),
            "the consumer moved the head: tail 1, head 3: -2 entries in a ring of 8");
}

TEST(SpscRing, OwnIndexAndCapacityAreNotReadBackFromSharedMemory) {
  std::vector<char> mem(SpscRing<uint64_t>::bytesFor(8));
  SpscRing<uint64_t>::format(mem.data(), 8);
  SpscRing<uint64_t> prod(mem.data(), 8), cons(mem.data(), 8);
  auto* hdr = reinterpret_cast<RingHeader*>(mem.data());
  // A capacity rewritten in the header changes nothing: both sides keep
  // theirs, and the entries come out in order from inside the ring.
  for (uint64_t i = 0; i < 20; ++i) {
    hdr->capacity = uint64_t{1} << 40;
    ASSERT_TRUE(prod.tryPush(i));
    uint64_t v = 99;
    ASSERT_TRUE(cons.tryPop(&v));
    EXPECT_EQ(v, i);
  }
  EXPECT_EQ(prod.capacity(), 8u);
  EXPECT_FALSE(prod.corrupt());
  EXPECT_FALSE(cons.corrupt());
  // The consumer rewriting its own head backwards (to re-read entries) is
  // not the producer's business unless it leaves more than the capacity.
  hdr->head.store(18);
  EXPECT_TRUE(prod.tryPush(20));  // tail 21 - head 18 = 3 entries: fine
  hdr->head.store(0);
  EXPECT_FALSE(prod.tryPush(21));  // 21 entries in a ring of 8
  EXPECT_TRUE(prod.corrupt());
}

TEST(SpscRing, AttachRefusesABadHeader) {
  std::vector<char> mem(SpscRing<uint64_t>::bytesFor(8));
  SpscRing<uint64_t>::format(mem.data(), 8);
  reinterpret_cast<RingHeader*>(mem.data())->capacity = 6;
  SpscRing<uint64_t> r(mem.data());
  EXPECT_TRUE(r.corrupt());
  EXPECT_EQ(r.corruption(), "capacity 6 is not a power of two");
  uint64_t v;
  EXPECT_FALSE(r.tryPush(1));
  EXPECT_FALSE(r.tryPop(&v));
}

TEST(ArenaLayout, FitsAndAligns) {
  auto l = ArenaLayout::compute(kDefaultArenaBytes);
  EXPECT_EQ(l.data_offset % 4096, 0u);
  EXPECT_GT(l.data_bytes, kDefaultArenaBytes / 2);
  EXPECT_LT(l.submit_ring_offset, l.completion_ring_offset);
}

Config makeConfig() {
  Config c("test");
  c.define("fusion-threshold-mb", KnobType::kInt, "128", "fusion buffer size")
      .define("cycle-time-ms", KnobType::kDouble, "1", "cycle")
      .define("timeline", KnobType::kString, "", "trace file")
      .define("autotune", KnobType::kBool, "false", "tune");
  c.alias("fusion-threshold-mb", "HOROVOD_FUSION_THRESHOLD",
          [](const std::string& b) { return std::to_string(std::stoll(b) >> 20); });
  return c;
}

TEST(Config, PrecedenceFlagEnvFileDefault) {
  std::string path = ::testing::TempDir() + "/kolo-config-test.conf";
  {
    std::ofstream f(path);
    f << "# comment\nfusion-threshold-mb = 32\ncycle-time-ms = 7\ntimeline = \"/tmp/t.json\"\n";
  }
  Config c = makeConfig();
  const char* argv[] = {"prog", "--config", path.c_str(), "--cycle-time-ms=2.5", "--autotune"};
  ASSERT_TRUE(c.loadWithEnv(5, argv, {{"KOLO_FUSION_THRESHOLD_MB", "64"}, {"KOLO_CYCLE_TIME_MS", "9"}})
                  .isOk());
  EXPECT_EQ(c.getInt("fusion-threshold-mb"), 64);           // env beats file
  EXPECT_DOUBLE_EQ(c.getDouble("cycle-time-ms"), 2.5);       // flag beats env
  EXPECT_EQ(c.getString("timeline"), "/tmp/t.json");         // file beats default
  EXPECT_TRUE(c.getBool("autotune"));
  EXPECT_NE(c.dump().find("cycle-time-ms = 2.5  # flag"), std::string::npos) << c.dump();
}

TEST(Config, HorovodAliasAndErrors) {
  Config c = makeConfig();
  const char* argv[] = {"prog"};
  ASSERT_TRUE(c.loadWithEnv(1, argv, {{"HOROVOD_FUSION_THRESHOLD", "67108864"}}).isOk());
  EXPECT_EQ(c.getInt("fusion-threshold-mb"), 64);

  Config bad = makeConfig();
  const char* argv2[] = {"prog", "--fusion-threshold-mb=abc"};
  Status s = bad.loadWithEnv(2, argv2, {});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("expected an integer, got 'abc'"), std::string::npos) << s.message();

  Config unk = makeConfig();
  const char* argv3[] = {"prog", "--no-such-flag"};
  s = unk.loadWithEnv(2, argv3, {});
  EXPECT_NE(s.message().find("unknown flag --no-such-flag"), std::string::npos);
  EXPECT_NE(makeConfig().markdown().find("`KOLO_FUSION_THRESHOLD_MB`"), std::string::npos);
}

TEST(EventLoop, PostTimerAndCall) {
  EventLoop loop("test-loop");
  loop.start();
  std::atomic<int> fired{0};
  loop.post([&] {
    loop.addTimer(std::chrono::milliseconds(5), [&] { fired = 1; });
  });
  auto r = loop.call<int>([&] { return 41 + 1; }, std::chrono::seconds(5));
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r, 42);
  for (int i = 0; i < 500 && fired.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(fired.load(), 1);
  loop.stop();
}

TEST(RateLimiter, LetsABurstThroughPerPeriodAndCountsTheRest) {
  log::RateLimiter rl(std::chrono::seconds(10), 3);
  auto t0 = log::RateLimiter::Clock::time_point{} + std::chrono::hours(1);  // an injected clock
  EXPECT_EQ(rl.admit(t0), std::optional<uint64_t>(0));
  EXPECT_EQ(rl.admit(t0), std::optional<uint64_t>(0));
  EXPECT_EQ(rl.admit(t0 + std::chrono::seconds(1)), std::optional<uint64_t>(0));
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(rl.admit(t0 + std::chrono::seconds(2)).has_value());
  // The next period: the first line through reports how many were held back.
  EXPECT_EQ(rl.admit(t0 + std::chrono::seconds(10)), std::optional<uint64_t>(1000));
  EXPECT_EQ(rl.admit(t0 + std::chrono::seconds(10)), std::optional<uint64_t>(0));
  EXPECT_EQ(rl.suppressedTotal(), 1000u);
}

}  // namespace
}  // namespace kolo
