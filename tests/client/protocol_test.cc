// libkolo's side of the agent protocol, through the C ABI, against the
// in-process FakeAgent (tests/client/fake_agent.h).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/ipc_layout.h"
#include "fake_agent.h"
#include <sys/socket.h>
#include <sys/un.h>
#include "common/fd.h"
#include "kolo/kolo_c.h"
#include "test_env.h"

namespace kolo::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kWait = 10s;  // bound for things that should happen at once

bool contains(const char* haystack, const std::string& needle) {
  return std::string(haystack).find(needle) != std::string::npos;
}

// The fake "reduction": as if two ranks contributed the same float32 data.
void doubleFloats(const SubmitDesc& d, char* slot) {
  if (d.dtype != KOLO_FLOAT32) return;
  auto* f = reinterpret_cast<float*>(slot);
  for (uint64_t i = 0; i < d.data_bytes / sizeof(float); ++i) f[i] *= 2;
}

class Protocol : public ::testing::Test {
 protected:
  void start(FakeAgentOptions o = {}) {
    agent_ = std::make_unique<FakeAgent>(std::move(o));
    ASSERT_TRUE(agent_->ok()) << "fake agent could not listen";
    env_.setJob(agent_->socketPath());
  }
  void startHolding() {
    FakeAgentOptions o;
    o.auto_complete = false;
    o.reduce = doubleFloats;
    start(std::move(o));
  }
  void TearDown() override {
    kolo_shutdown();
    agent_.reset();
  }

  kolo_status_t submit(const char* name, const float* in, float* out, int64_t n,
                       kolo_handle_t* h) {
    int64_t shape[1] = {n};
    return kolo_allreduce_async(name, in, out, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0, h);
  }

  ScopedEnv env_;
  std::unique_ptr<FakeAgent> agent_;
};

TEST_F(Protocol, InitSendsHelloAndReportsTheWorld) {
  FakeAgentOptions o;
  o.world.set_generation(3);
  o.world.set_rank(5);
  o.world.set_size(8);
  o.world.set_local_rank(1);
  o.world.set_local_size(2);
  o.world.set_cross_rank(2);
  o.world.set_cross_size(4);
  start(std::move(o));
  env_.set("KOLO_SIZE", "8");
  env_.set("KOLO_LOCAL_RANK", "1");
  env_.set("KOLO_LOCAL_SIZE", "2");
  env_.set("KOLO_ARENA_MB", "4");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  EXPECT_EQ(kolo_is_initialized(), 1);
  EXPECT_EQ(kolo_rank(), 5);
  EXPECT_EQ(kolo_size(), 8);
  EXPECT_EQ(kolo_local_rank(), 1);
  EXPECT_EQ(kolo_local_size(), 2);
  EXPECT_EQ(kolo_cross_rank(), 2);
  EXPECT_EQ(kolo_cross_size(), 4);
  ASSERT_TRUE(agent_->waitForHello(kWait));
  ipc::Hello h = agent_->lastHello();
  EXPECT_EQ(h.protocol_version(), kIpcProtocolVersion);
  EXPECT_EQ(h.job_id(), "job-test");
  EXPECT_EQ(h.token(), "secret-token");
  EXPECT_EQ(h.local_rank(), 1);
  EXPECT_EQ(h.local_size(), 2);
  EXPECT_EQ(h.world_size(), 8);
  EXPECT_EQ(h.pid(), static_cast<int32_t>(::getpid()));
  EXPECT_EQ(h.arena_bytes(), 4ull << 20);
  EXPECT_FALSE(h.hostname().empty());
  EXPECT_EQ(kolo_init(), KOLO_OK);  // a second init is a no-op
  EXPECT_EQ(agent_->connectionsAccepted(), 1);
}

TEST_F(Protocol, RefusedWelcomeCarriesTheAgentsCodeAndMessage) {
  FakeAgentOptions o;
  o.welcome_code = KOLO_ERR_PERMISSION_DENIED;
  o.welcome_message = "wrong token for job 'job-test'";
  start(std::move(o));
  EXPECT_EQ(kolo_init(), KOLO_ERR_PERMISSION_DENIED);
  EXPECT_STREQ(kolo_last_error(), "wrong token for job 'job-test'");
  EXPECT_EQ(kolo_is_initialized(), 0);
}

TEST_F(Protocol, MomentaryRefusalIsRetriedUntilAdmitted) {
  FakeAgentOptions o;
  o.refusals = 3;
  o.refusal_retry_after_ms = 20;
  start(std::move(o));
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  EXPECT_EQ(agent_->connectionsAccepted(), 4);
  EXPECT_EQ(kolo_shutdown(), KOLO_OK);
}

TEST_F(Protocol, FinalRefusalIsNotRetried) {
  FakeAgentOptions o;
  o.refusals = 3;
  o.refusal_retry_after_ms = 0;  // e.g. the uid's own connection limit
  start(std::move(o));
  EXPECT_EQ(kolo_init(), KOLO_ERR_UNAVAILABLE);
  EXPECT_TRUE(contains(kolo_last_error(), "the kolo agent refused the connection: the kolo agent is out "
                                          "of file descriptors"))
      << kolo_last_error();
  EXPECT_EQ(agent_->connectionsAccepted(), 1);
}

TEST_F(Protocol, MomentaryRefusalsStopAtTheStartTimeout) {
  FakeAgentOptions o;
  o.refusals = 1000000;
  o.refusal_retry_after_ms = 50;
  start(std::move(o));
  env_.set("KOLO_START_TIMEOUT", "1");
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_init(), KOLO_ERR_UNAVAILABLE);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_TRUE(contains(kolo_last_error(), "try again later")) << kolo_last_error();
}

// A socket whose listen queue is full (an agent that stopped accepting):
// connect() would block for good; init fails within KOLO_START_TIMEOUT.
TEST_F(Protocol, FullListenQueueFailsWithinTheStartTimeout) {
  char dir[] = "/tmp/kolo-full-queue-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/agent.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 0), 0);
  std::vector<UniqueFd> fillers;  // never accepted: they fill the queue
  for (int i = 0; i < 8; ++i) {
    UniqueFd f(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (::connect(f.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) break;
    fillers.push_back(std::move(f));
  }
  env_.setJob(path);
  env_.set("KOLO_START_TIMEOUT", "1");
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_init(), KOLO_ERR_UNAVAILABLE);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_TRUE(contains(kolo_last_error(), "accepted no connection within")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "its listen queue is full")) << kolo_last_error();
  fillers.clear();
  listener.reset();
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST_F(Protocol, JobFailedInsteadOfWorldFailsInit) {
  FakeAgentOptions o;
  o.job_failed_instead_of_world =
      std::make_pair(int32_t{KOLO_ERR_PEER_FAILURE}, std::string("rank 1 never started"));
  start(std::move(o));
  EXPECT_EQ(kolo_init(), KOLO_ERR_PEER_FAILURE);
  EXPECT_STREQ(kolo_last_error(), "rank 1 never started");
}

TEST_F(Protocol, MissingWorldTimesOutWithinTheStartTimeout) {
  FakeAgentOptions o;
  o.send_world = false;
  start(std::move(o));
  env_.set("KOLO_START_TIMEOUT", "1");
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_init(), KOLO_ERR_TIMED_OUT);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_START_TIMEOUT")) << kolo_last_error();
}

TEST_F(Protocol, AllreduceCopiesInAndOut) {
  FakeAgentOptions o;
  o.reduce = doubleFloats;
  start(std::move(o));
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  std::vector<float> in(1000), out(1000, -1.0f);
  std::iota(in.begin(), in.end(), 0.0f);
  int64_t shape[2] = {10, 100};
  kolo_handle_t h = 0;
  ASSERT_EQ(kolo_allreduce_async("layer1.weight.grad", in.data(), out.data(), 2, shape,
                                 KOLO_FLOAT32, KOLO_AVERAGE, 0.5, 2.0, &h),
            KOLO_OK)
      << kolo_last_error();
  EXPECT_NE(h, 0u);
  ASSERT_EQ(kolo_synchronize(h, -1), KOLO_OK) << kolo_last_error();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(out[i], 2.0f * i) << i;
    ASSERT_EQ(in[i], static_cast<float>(i)) << i;  // the input is not touched
  }
  auto subs = agent_->submissions();
  ASSERT_EQ(subs.size(), 1u);
  const SubmitDesc& d = subs[0];
  EXPECT_EQ(d.handle, h);
  EXPECT_EQ(d.collective, 0);
  EXPECT_EQ(d.dtype, KOLO_FLOAT32);
  EXPECT_EQ(d.reduce_op, KOLO_AVERAGE);  // passed as is; the agent divides
  EXPECT_EQ(d.ndim, 2);
  EXPECT_EQ(d.shape[0], 10);
  EXPECT_EQ(d.shape[1], 100);
  EXPECT_EQ(std::string(d.name, d.name_len), "layer1.weight.grad");
  EXPECT_EQ(d.prescale, 0.5);
  EXPECT_EQ(d.postscale, 2.0);
  EXPECT_EQ(d.data_bytes, 4000u);
  EXPECT_EQ(d.out_offset, 0u);
  EXPECT_EQ(d.data_offset % kDataAlignment, 0u);
  EXPECT_GE(d.data_offset, agent_->dataOffset());
  EXPECT_LE(d.data_offset + d.data_bytes, agent_->dataOffset() + agent_->dataBytes());
  // The slot was freed: the same bytes go to the same place next time.
  ASSERT_EQ(kolo_allreduce("again", in.data(), in.data(), 2, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1),
            KOLO_OK);
  EXPECT_EQ(in[7], 14.0f);
  EXPECT_EQ(agent_->submissions()[1].data_offset, d.data_offset);
}

TEST_F(Protocol, ZeroCopyReducesInPlaceInTheSharedBuffer) {
  FakeAgentOptions o;
  o.reduce = doubleFloats;
  start(std::move(o));
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  auto* buf = static_cast<float*>(kolo_alloc_shared(256 * sizeof(float)));
  ASSERT_NE(buf, nullptr) << kolo_last_error();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf) % 64, 0u);
  for (int i = 0; i < 256; ++i) buf[i] = static_cast<float>(i);
  int64_t shape[1] = {256};
  ASSERT_EQ(kolo_allreduce("shared", buf, buf, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1), KOLO_OK)
      << kolo_last_error();
  EXPECT_EQ(buf[255], 510.0f);
  const SubmitDesc d = agent_->submissions().at(0);
  // The agent was pointed at the user's buffer itself, not at a staging
  // slot: what the client writes there is what the agent sees.
  for (int i = 0; i < 256; ++i) buf[i] = -1.0f * i;
  EXPECT_EQ(agent_->readArena(d.data_offset, 256 * sizeof(float)),
            std::string(reinterpret_cast<const char*>(buf), 256 * sizeof(float)));
  EXPECT_EQ(d.data_bytes, 256 * sizeof(float));
  // Output elsewhere: the result is also copied out.
  std::vector<float> out(256);
  ASSERT_EQ(kolo_allreduce("shared.out", buf, out.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1),
            KOLO_OK);
  EXPECT_EQ(out[255], -510.0f);
  EXPECT_EQ(buf[255], -510.0f);  // reduced in place in the shared buffer as well
  EXPECT_EQ(agent_->submissions().at(1).data_offset, d.data_offset);
  // Part of a buffer is fine; running past its end is not.
  ASSERT_EQ(kolo_allreduce("shared.part", buf + 16, buf + 16, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1,
                           1),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_alloc_shared")) << kolo_last_error();
  int64_t half[1] = {128};
  EXPECT_EQ(kolo_allreduce("shared.half", buf + 128, buf + 128, 1, half, KOLO_FLOAT32, KOLO_SUM,
                           1, 1),
            KOLO_OK);
  kolo_free_shared(buf);
  kolo_free_shared(buf);  // double free: reported, nothing breaks
  EXPECT_EQ(kolo_last_status(), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_alloc_shared")) << kolo_last_error();
}

TEST_F(Protocol, ZeroCopyOffsetIsTheBuffersOffset) {
  start();
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  void* a = kolo_alloc_shared(100);
  void* b = kolo_alloc_shared(100);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  int64_t shape[1] = {25};
  ASSERT_EQ(kolo_allreduce("b", b, b, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1), KOLO_OK);
  // Both mappings show the same bytes: compare what the agent sees at the
  // submitted offset with what the client wrote.
  std::memset(b, 0x5a, 100);
  EXPECT_EQ(agent_->readArena(agent_->submissions().at(0).data_offset, 100),
            std::string(static_cast<const char*>(b), 100));
  EXPECT_NE(static_cast<char*>(a), static_cast<char*>(b));
  kolo_free_shared(a);
  kolo_free_shared(b);
}

TEST_F(Protocol, ScalarAndEmptyTensors) {
  FakeAgentOptions o;
  o.reduce = doubleFloats;
  start(std::move(o));
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float s = 21.0f, r = 0;
  ASSERT_EQ(kolo_allreduce("scalar", &s, &r, 0, nullptr, KOLO_FLOAT32, KOLO_SUM, 1, 1), KOLO_OK)
      << kolo_last_error();
  EXPECT_EQ(r, 42.0f);
  int64_t zero[2] = {3, 0};
  ASSERT_EQ(kolo_allreduce("empty", nullptr, nullptr, 2, zero, KOLO_FLOAT32, KOLO_SUM, 1, 1),
            KOLO_OK)
      << kolo_last_error();
  auto subs = agent_->submissions();
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[0].ndim, 0);
  EXPECT_EQ(subs[0].data_bytes, 4u);
  EXPECT_EQ(subs[1].data_bytes, 0u);  // submitted all the same: every rank must take part
  EXPECT_EQ(subs[1].ndim, 2);
}

TEST_F(Protocol, InvalidArgumentsAreRejectedBeforeSubmission) {
  start();
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[4] = {};
  int64_t shape[1] = {4};
  int64_t neg[1] = {-1};
  int64_t big[kMaxDims + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  std::string long_name(kMaxNameBytes + 1, 'n');
  kolo_handle_t h;
  struct Case {
    const char* what;
    kolo_status_t got;
  };
  std::vector<Case> cases = {
      {"empty name", kolo_allreduce_async("", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"null name",
       kolo_allreduce_async(nullptr, x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"long name",
       kolo_allreduce_async(long_name.c_str(), x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"ndim", kolo_allreduce_async("t", x, x, kMaxDims + 1, big, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"negative ndim",
       kolo_allreduce_async("t", x, x, -1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"negative dim", kolo_allreduce_async("t", x, x, 1, neg, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"null shape",
       kolo_allreduce_async("t", x, x, 1, nullptr, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"dtype", kolo_allreduce_async("t", x, x, 1, shape, static_cast<kolo_dtype_t>(42), KOLO_SUM,
                                     1, 1, &h)},
      {"adasum", kolo_allreduce_async("t", x, x, 1, shape, KOLO_FLOAT32,
                                      static_cast<kolo_op_t>(2), 1, 1, &h)},
      {"null input",
       kolo_allreduce_async("t", nullptr, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h)},
      {"nan scale", kolo_allreduce_async("t", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, NAN, 1, &h)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.got, KOLO_ERR_INVALID_ARGUMENT) << c.what;
  }
  EXPECT_TRUE(agent_->submissions().empty());
  // Nothing was left reserved by the failures.
  ASSERT_EQ(kolo_allreduce("t", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1), KOLO_OK);
}

TEST_F(Protocol, ErrorMessagesNameTheProblem) {
  start();
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[4] = {};
  int64_t shape[1] = {4};
  int64_t big[kMaxDims + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  std::string long_name(kMaxNameBytes + 1, 'n');
  kolo_handle_t h;
  auto expectError = [&](kolo_status_t got, const char* needle) {
    EXPECT_EQ(got, KOLO_ERR_INVALID_ARGUMENT) << needle;
    EXPECT_TRUE(contains(kolo_last_error(), needle)) << kolo_last_error();
  };
  expectError(kolo_allreduce_async("", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h),
              "name is empty");
  expectError(
      kolo_allreduce_async(long_name.c_str(), x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h),
      "limit is 255");
  expectError(kolo_allreduce_async("t", x, x, kMaxDims + 1, big, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h),
              "ndim is 9");
  expectError(kolo_allreduce_async("t", x, x, 1, shape, static_cast<kolo_dtype_t>(42), KOLO_SUM, 1,
                                   1, &h),
              "unknown dtype 42");
  expectError(kolo_allreduce_async("t", x, x, 1, shape, KOLO_FLOAT32, static_cast<kolo_op_t>(2), 1,
                                   1, &h),
              "Adasum is not supported");
  expectError(kolo_allreduce_async("t", nullptr, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h),
              "input is NULL");
  int64_t neg[1] = {-1};
  expectError(kolo_allreduce_async("t", x, x, 1, neg, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h),
              "tensor 't': dimension 0 is -1");
}

TEST_F(Protocol, DuplicateNameInFlightIsRejectedUntilItCompletes) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[4] = {1, 2, 3, 4};
  kolo_handle_t h1, h2;
  ASSERT_EQ(submit("fc.bias", x, x, 4, &h1), KOLO_OK);
  EXPECT_EQ(submit("fc.bias", x, x, 4, &h2), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "'fc.bias'")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "same name as another tensor")) << kolo_last_error();
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  agent_->completeAll();
  // Completed (not yet synchronized): the name is free again.
  ASSERT_EQ(submit("fc.bias", x, x, 4, &h2), KOLO_OK) << kolo_last_error();
  EXPECT_EQ(kolo_synchronize(h1, -1), KOLO_OK);
  EXPECT_EQ(x[3], 8.0f);
  ASSERT_TRUE(agent_->waitForSubmissions(2, kWait));
  agent_->completeAll();
  EXPECT_EQ(kolo_synchronize(h2, -1), KOLO_OK);
  EXPECT_EQ(x[3], 16.0f);
}

// The agent's bytes quota (Welcome.max_bytes_in_flight): a submission that
// would pass it waits for a completion instead of being sent to be refused,
// and says why when none comes within KOLO_OP_TIMEOUT. A lone tensor larger
// than the quota is sent (for the agent to refuse with its reason).
TEST_F(Protocol, SubmissionsWaitUnderTheAgentsBytesQuota) {
  FakeAgentOptions o;
  o.auto_complete = false;
  o.reduce = doubleFloats;
  o.max_bytes_in_flight = 1 << 20;
  ASSERT_NO_FATAL_FAILURE(start(std::move(o)));
  env_.set("KOLO_OP_TIMEOUT", "1");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  const int64_t n = (600 << 10) / sizeof(float);  // 600 KiB: two pass 1 MiB
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 3.0f);
  kolo_handle_t ha, hb, hc;
  ASSERT_EQ(submit("q.a", a.data(), a.data(), n, &ha), KOLO_OK) << kolo_last_error();
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  // No completion: q.b waits its KOLO_OP_TIMEOUT, then fails; nothing sent.
  auto t0 = Clock::now();
  EXPECT_EQ(submit("q.b", b.data(), b.data(), n, &hb), KOLO_ERR_TIMED_OUT);
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(contains(kolo_last_error(), "would pass the 1048576 this process may have in flight"))
      << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "--max-bytes-in-flight-mb")) << kolo_last_error();
  EXPECT_EQ(agent_->submissions().size(), 1u);
  EXPECT_EQ(b[0], 2.0f);  // untouched
  // Held until q.a completes (from another thread), then sent and exact.
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(200ms);
    agent_->completeAll();
  });
  ASSERT_EQ(submit("q.c", c.data(), c.data(), n, &hc), KOLO_OK) << kolo_last_error();
  later.get();
  EXPECT_EQ(kolo_synchronize(ha, -1), KOLO_OK) << kolo_last_error();
  EXPECT_EQ(a[n - 1], 2.0f);
  ASSERT_TRUE(agent_->waitForSubmissions(2, kWait));
  agent_->completeAll();
  EXPECT_EQ(kolo_synchronize(hc, -1), KOLO_OK) << kolo_last_error();
  EXPECT_EQ(c[n - 1], 6.0f);
  // A lone tensor over the quota is sent.
  std::vector<float> big((2 << 20) / sizeof(float), 1.0f);
  kolo_handle_t hbig;
  ASSERT_EQ(submit("q.big", big.data(), big.data(), static_cast<int64_t>(big.size()), &hbig),
            KOLO_OK)
      << kolo_last_error();
  ASSERT_TRUE(agent_->waitForSubmissions(3, kWait));
  agent_->completeAll();
  EXPECT_EQ(kolo_synchronize(hbig, -1), KOLO_OK) << kolo_last_error();
}

TEST_F(Protocol, PollAndSynchronizeTimeoutLeaveTheHandlePending) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  std::vector<float> in(64, 1.0f), out(64, 0.0f);
  kolo_handle_t h;
  ASSERT_EQ(submit("g", in.data(), out.data(), 64, &h), KOLO_OK);
  EXPECT_EQ(kolo_poll(h), KOLO_IN_PROGRESS);
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_synchronize(h, 50), KOLO_ERR_TIMED_OUT);
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 2s);
  EXPECT_TRUE(contains(kolo_last_error(), "'g'")) << kolo_last_error();
  EXPECT_EQ(kolo_poll(h), KOLO_IN_PROGRESS);  // still valid
  EXPECT_EQ(out[0], 0.0f);
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  agent_->completeAll();  // the completion is in the ring when this returns
  EXPECT_EQ(kolo_poll(h), KOLO_OK);
  EXPECT_EQ(out[0], 2.0f);  // copied out by the time poll says OK
  EXPECT_EQ(kolo_poll(h), KOLO_OK);  // the final status stays until synchronize
  EXPECT_EQ(kolo_synchronize(h, 0), KOLO_OK);
  EXPECT_EQ(kolo_synchronize(h, 0), KOLO_ERR_INVALID_ARGUMENT);  // released by synchronize
  EXPECT_TRUE(contains(kolo_last_error(), "unknown handle")) << kolo_last_error();
  EXPECT_EQ(kolo_poll(h), KOLO_ERR_INVALID_ARGUMENT);
}

TEST_F(Protocol, SynchronizeWakesOnCompletionFromAnotherThread) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[2] = {1, 2};
  kolo_handle_t h;
  ASSERT_EQ(submit("wake", x, x, 2, &h), KOLO_OK);
  auto waiter = std::async(std::launch::async, [&] {
    auto t0 = Clock::now();
    kolo_status_t s = kolo_synchronize(h, 20'000);
    return std::make_pair(s, Clock::now() - t0);
  });
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  agent_->completeAll();
  ASSERT_EQ(waiter.wait_for(kWait), std::future_status::ready);
  auto [s, took] = waiter.get();
  EXPECT_EQ(s, KOLO_OK);
  EXPECT_LT(took, 5s);  // woken by the eventfd, not by the 20 s timeout
  EXPECT_EQ(x[1], 4.0f);
}

TEST_F(Protocol, CompletionErrorKeepsTheAgentsMessageVerbatim) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[2] = {1, 2};
  kolo_handle_t h;
  ASSERT_EQ(submit("w", x, x, 2, &h), KOLO_OK);
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  const std::string msg =
      "Mismatched allreduce shapes for tensor 'w': rank 0 sent [2], rank 3 sent [4]";
  agent_->completeAll(KOLO_ERR_INVALID_ARGUMENT, msg);
  EXPECT_EQ(kolo_synchronize(h, -1), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(kolo_last_error()), msg);
  EXPECT_EQ(x[1], 2.0f);  // a failed op leaves the output alone
  // Only that op failed: the client goes on.
  ASSERT_EQ(submit("w", x, x, 2, &h), KOLO_OK);
}

TEST_F(Protocol, LostConnectionFailsPendingAndLaterOps) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[2] = {1, 2}, y[2] = {3, 4};
  kolo_handle_t h1, h2;
  ASSERT_EQ(submit("a", x, x, 2, &h1), KOLO_OK);
  ASSERT_EQ(submit("b", y, y, 2, &h2), KOLO_OK);
  ASSERT_TRUE(agent_->waitForSubmissions(2, kWait));
  agent_->dropConnection();
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_synchronize(h1, -1), KOLO_ERR_UNAVAILABLE);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_TRUE(contains(kolo_last_error(), "lost the connection to the kolo agent"))
      << kolo_last_error();
  EXPECT_EQ(kolo_poll(h2), KOLO_ERR_UNAVAILABLE);
  EXPECT_EQ(kolo_synchronize(h2, 0), KOLO_ERR_UNAVAILABLE);
  kolo_handle_t h3;
  EXPECT_EQ(submit("c", x, x, 2, &h3), KOLO_ERR_UNAVAILABLE);
  EXPECT_TRUE(contains(kolo_last_error(), "lost the connection")) << kolo_last_error();
  EXPECT_EQ(kolo_shutdown(), KOLO_OK);
}

TEST_F(Protocol, JobFailedFailsPendingAndLaterOps) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[2] = {1, 2};
  kolo_handle_t h;
  ASSERT_EQ(submit("a", x, x, 2, &h), KOLO_OK);
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  const std::string msg = "rank 3 (node b, pid 4242) exited with signal 9 (SIGKILL)";
  agent_->sendJobFailed(KOLO_ERR_PEER_FAILURE, msg);
  EXPECT_EQ(kolo_synchronize(h, -1), KOLO_ERR_PEER_FAILURE);
  EXPECT_EQ(std::string(kolo_last_error()), msg);
  kolo_handle_t h2;
  EXPECT_EQ(submit("b", x, x, 2, &h2), KOLO_ERR_PEER_FAILURE);
  EXPECT_EQ(std::string(kolo_last_error()), msg);
}

TEST_F(Protocol, ShutdownAbortsWaitersAndSaysGoodbye) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[2] = {1, 2};
  kolo_handle_t h;
  ASSERT_EQ(submit("a", x, x, 2, &h), KOLO_OK);
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  std::promise<void> waiting;
  auto waiter = std::async(std::launch::async, [&] {
    waiting.set_value();
    return kolo_synchronize(h, -1);
  });
  waiting.get_future().wait();
  ASSERT_EQ(kolo_shutdown(), KOLO_OK);
  ASSERT_EQ(waiter.wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(waiter.get(), KOLO_ERR_ABORTED);
  EXPECT_TRUE(agent_->waitForGoodbye(kWait));
  EXPECT_EQ(kolo_is_initialized(), 0);
  EXPECT_EQ(kolo_rank(), -1);
  EXPECT_EQ(kolo_synchronize(h, 0), KOLO_ERR_ABORTED);  // a handle of the old session
  EXPECT_EQ(kolo_shutdown(), KOLO_OK);
  EXPECT_EQ(x[1], 2.0f);
}

TEST_F(Protocol, ReinitAfterShutdownWorks) {
  FakeAgentOptions o;
  o.reduce = doubleFloats;
  start(std::move(o));
  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  for (int round = 1; round <= 2; ++round) {
    ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
    ASSERT_EQ(kolo_allreduce("x", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1), KOLO_OK)
        << kolo_last_error();
    ASSERT_EQ(kolo_shutdown(), KOLO_OK);
    ASSERT_TRUE(agent_->waitForGoodbye(kWait));
  }
  EXPECT_EQ(x[1], 8.0f);
  EXPECT_EQ(agent_->connectionsAccepted(), 2);
}

TEST_F(Protocol, TensorLargerThanTheArenaNamesKoloArenaMb) {
  start();
  env_.set("KOLO_ARENA_MB", "2");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  std::vector<float> big(1 << 20);  // 4 MiB
  int64_t shape[1] = {static_cast<int64_t>(big.size())};
  kolo_handle_t h;
  EXPECT_EQ(kolo_allreduce_async("huge", big.data(), big.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM,
                                 1, 1, &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_ARENA_MB")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "4194304")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "'huge'")) << kolo_last_error();
  // The advice is right: that arena size holds the tensor.
  EXPECT_TRUE(contains(kolo_last_error(), "at least 5.")) << kolo_last_error();
  EXPECT_GE(ArenaLayout::compute(5ull << 20).data_bytes, big.size() * sizeof(float));
}

// Every collective goes through one submit path; its errors name the
// collective that was asked for, not "allreduce".
TEST_F(Protocol, SynchronizeTimeoutsNameTheCollective) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  kolo_handle_t h;
  ASSERT_EQ(kolo_broadcast_async("bc", x, 1, shape, KOLO_FLOAT32, 0, &h), KOLO_OK)
      << kolo_last_error();
  EXPECT_EQ(kolo_synchronize(h, 50), KOLO_ERR_TIMED_OUT);
  EXPECT_TRUE(contains(kolo_last_error(), "broadcast of tensor 'bc' (handle ")) << kolo_last_error();
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  agent_->completeAll();
  ASSERT_EQ(kolo_synchronize(h, -1), KOLO_OK) << kolo_last_error();
  // Allgather and alltoall: the first phase (an allreduce of the first
  // dimensions / split matrix) completes, the collective itself is held.
  size_t seen = 1;
  auto twoPhase = [&](const char* name, auto call) {
    auto started = std::async(std::launch::async, [&] {
      kolo_handle_t hh = 0;
      kolo_status_t st = call(&hh);
      return std::make_pair(st, hh);
    });
    EXPECT_TRUE(agent_->waitForSubmissions(++seen, kWait)) << name;
    agent_->completeAll();
    EXPECT_EQ(started.wait_for(kWait), std::future_status::ready) << name;
    auto [st, hh] = started.get();
    EXPECT_EQ(st, KOLO_OK) << name << ": " << kolo_last_error();
    EXPECT_EQ(kolo_synchronize(hh, 50), KOLO_ERR_TIMED_OUT) << name;
    const std::string said = kolo_last_error();
    EXPECT_TRUE(agent_->waitForSubmissions(++seen, kWait)) << name;
    agent_->completeAll();
    EXPECT_EQ(kolo_synchronize(hh, -1), KOLO_OK) << name << ": " << kolo_last_error();
    return said;
  };
  std::string ag = twoPhase("ag", [&](kolo_handle_t* hh) {
    return kolo_allgather_async("ag", x, 1, shape, KOLO_FLOAT32, hh);
  });
  EXPECT_TRUE(contains(ag.c_str(), "allgather of tensor 'ag' (handle ")) << ag;
  std::string a2a = twoPhase("a2a", [&](kolo_handle_t* hh) {
    return kolo_alltoall_async("a2a", x, 1, shape, KOLO_FLOAT32, nullptr, hh);
  });
  EXPECT_TRUE(contains(a2a.c_str(), "alltoall of tensor 'a2a' (handle ")) << a2a;
}

TEST_F(Protocol, FullArenaErrorsNameTheCollective) {
  start();
  env_.set("KOLO_ARENA_MB", "2");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  const uint64_t cap = ArenaLayout::compute(2ull << 20).data_bytes;
  void* hog = kolo_alloc_shared(cap * 3 / 4);
  ASSERT_NE(hog, nullptr) << kolo_last_error();
  std::vector<float> t(cap / 2 / sizeof(float));
  int64_t shape[1] = {static_cast<int64_t>(t.size())};
  kolo_handle_t h;
  EXPECT_EQ(kolo_broadcast_async("bc", t.data(), 1, shape, KOLO_FLOAT32, 0, &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "broadcast of tensor 'bc': its ")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "do not fit in the shared arena")) << kolo_last_error();
  EXPECT_EQ(kolo_allgather_async("ag", t.data(), 1, shape, KOLO_FLOAT32, &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "allgather of tensor 'ag': its ")) << kolo_last_error();
  EXPECT_EQ(kolo_alltoall_async("a2a", t.data(), 1, shape, KOLO_FLOAT32, nullptr, &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "alltoall of tensor 'a2a': its ")) << kolo_last_error();
  EXPECT_EQ(kolo_reducescatter_async("rs", t.data(), t.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM,
                                     &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "reducescatter of tensor 'rs': its ")) << kolo_last_error();
  kolo_free_shared(hog);
}

TEST_F(Protocol, FullArenaWaitsForCompletionsToFreeSpace) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  env_.set("KOLO_ARENA_MB", "2");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  const uint64_t cap = ArenaLayout::compute(2ull << 20).data_bytes;
  const int64_t n = static_cast<int64_t>(cap * 6 / 10 / sizeof(float));  // two do not fit
  std::vector<float> a(n, 1.0f), b(n, 5.0f);
  kolo_handle_t ha;
  ASSERT_EQ(submit("a", a.data(), a.data(), n, &ha), KOLO_OK);
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  auto second = std::async(std::launch::async, [&] {
    kolo_handle_t hb = 0;
    kolo_status_t s = submit("b", b.data(), b.data(), n, &hb);
    if (s != KOLO_OK) return s;
    return kolo_synchronize(hb, -1);
  });
  // "b" cannot be submitted while "a" holds the space.
  EXPECT_FALSE(agent_->waitForSubmissions(2, 200ms));
  agent_->completeAll();  // frees "a"'s slot once the client drains it
  ASSERT_TRUE(agent_->waitForSubmissions(2, kWait));
  agent_->completeAll();
  ASSERT_EQ(second.wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(second.get(), KOLO_OK);
  EXPECT_EQ(kolo_synchronize(ha, -1), KOLO_OK);
  EXPECT_EQ(a[n - 1], 2.0f);
  EXPECT_EQ(b[n - 1], 10.0f);
}

TEST_F(Protocol, ArenaHeldByUserBuffersFailsFastInsteadOfWaiting) {
  start();
  env_.set("KOLO_ARENA_MB", "2");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  const uint64_t cap = ArenaLayout::compute(2ull << 20).data_bytes;
  void* hog = kolo_alloc_shared(cap * 3 / 4);
  ASSERT_NE(hog, nullptr) << kolo_last_error();
  EXPECT_EQ(kolo_alloc_shared(cap / 2), nullptr);  // no room for another big one
  EXPECT_EQ(kolo_last_status(), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_ARENA_MB")) << kolo_last_error();
  std::vector<float> t(cap / 2 / sizeof(float));
  int64_t shape[1] = {static_cast<int64_t>(t.size())};
  kolo_handle_t h;
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_allreduce_async("t", t.data(), t.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1,
                                 &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_alloc_shared")) << kolo_last_error();
  kolo_free_shared(hog);
  EXPECT_EQ(kolo_allreduce_async("t", t.data(), t.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1,
                                 &h),
            KOLO_OK)
      << kolo_last_error();
  EXPECT_EQ(kolo_synchronize(h, -1), KOLO_OK);
}

// Zero copy out of place (input and output both shared buffers): the
// descriptor names the output region, the client copies nothing (the
// agent writes the output), both buffers stay busy while the op is in
// flight, and an output that overlaps the input or runs past its buffer is
// refused before submission.
TEST_F(Protocol, ZeroCopyOutOfPlaceNamesTheOutputRegion) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  auto* in = static_cast<float*>(kolo_alloc_shared(64 * sizeof(float)));
  auto* out = static_cast<float*>(kolo_alloc_shared(64 * sizeof(float)));
  ASSERT_TRUE(in != nullptr && out != nullptr) << kolo_last_error();
  for (int i = 0; i < 64; ++i) {
    in[i] = static_cast<float>(i);
    out[i] = -7.0f;
  }
  kolo_handle_t h;
  ASSERT_EQ(submit("zo", in, out, 64, &h), KOLO_OK) << kolo_last_error();
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  const SubmitDesc d = agent_->submissions().at(0);
  EXPECT_EQ(d.data_bytes, 64 * sizeof(float));
  EXPECT_EQ(d.out_bytes, 64 * sizeof(float));
  EXPECT_NE(d.out_offset, d.data_offset);
  EXPECT_EQ(agent_->readArena(d.out_offset, 64 * sizeof(float)),
            std::string(reinterpret_cast<const char*>(out), 64 * sizeof(float)));
  kolo_free_shared(in);
  EXPECT_EQ(kolo_last_status(), KOLO_ERR_INVALID_ARGUMENT);
  kolo_free_shared(out);
  EXPECT_EQ(kolo_last_status(), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "'zo'")) << kolo_last_error();
  agent_->completeAll();
  ASSERT_EQ(kolo_synchronize(h, -1), KOLO_OK) << kolo_last_error();
  // The fake agent reduced the input slot (doubled it) and wrote nothing to
  // the output: the client copied nothing either way.
  EXPECT_EQ(out[5], -7.0f);
  EXPECT_EQ(in[5], 10.0f);
  // Overlapping output, and an output past the end of its buffer.
  EXPECT_EQ(submit("zo.overlap", in, in + 8, 16, &h), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "the output overlaps the input without being the same buffer"))
      << kolo_last_error();
  EXPECT_EQ(submit("zo.past", in, out + 32, 64, &h), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "its output's 256 bytes start inside the shared arena"))
      << kolo_last_error();
  EXPECT_EQ(agent_->submissions().size(), 1u);
  kolo_free_shared(in);
  kolo_free_shared(out);
}

TEST_F(Protocol, FreeingASharedBufferInFlightIsRefused) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  auto* buf = static_cast<float*>(kolo_alloc_shared(64));
  ASSERT_NE(buf, nullptr);
  kolo_handle_t h;
  ASSERT_EQ(submit("s", buf, buf, 16, &h), KOLO_OK);
  kolo_free_shared(buf);
  EXPECT_EQ(kolo_last_status(), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "'s'")) << kolo_last_error();
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  agent_->completeAll();
  EXPECT_EQ(kolo_synchronize(h, -1), KOLO_OK);
  kolo_free_shared(buf);  // now fine
  EXPECT_EQ(kolo_alloc_shared(64), static_cast<void*>(buf));  // the space came back
}

TEST_F(Protocol, ReleasedHandleIsForgottenAndItsOutputLeftAlone) {
  ASSERT_NO_FATAL_FAILURE(startHolding());
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float in[2] = {1, 2}, out[2] = {0, 0};
  kolo_handle_t h;
  ASSERT_EQ(submit("r", in, out, 2, &h), KOLO_OK);
  kolo_release(h);
  EXPECT_EQ(kolo_poll(h), KOLO_IN_PROGRESS);  // the op still runs
  ASSERT_TRUE(agent_->waitForSubmissions(1, kWait));
  agent_->completeAll();
  // A later op completes after it (the ring is ordered): by then "r" is done.
  kolo_handle_t h2;
  ASSERT_EQ(submit("after", in, in, 2, &h2), KOLO_OK);
  ASSERT_TRUE(agent_->waitForSubmissions(2, kWait));
  agent_->completeAll();
  ASSERT_EQ(kolo_synchronize(h2, -1), KOLO_OK);
  EXPECT_EQ(kolo_poll(h), KOLO_ERR_INVALID_ARGUMENT);  // forgotten
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST_F(Protocol, InFlightLimitWaitsThenTimesOutAfterTheOpTimeout) {
  FakeAgentOptions o;
  o.consume_submissions = false;  // a stuck agent
  start(std::move(o));
  env_.set("KOLO_OP_TIMEOUT", "1");
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x = 1;
  int64_t shape[1] = {1};
  kolo_handle_t h;
  for (uint64_t i = 0; i < kSubmitRingCapacity; ++i) {
    std::string name = std::string("t") + std::to_string(i);
    ASSERT_EQ(kolo_allreduce_async(name.c_str(), &x, &x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1,
                                   &h),
              KOLO_OK)
        << i << ": " << kolo_last_error();
  }
  auto t0 = Clock::now();
  EXPECT_EQ(kolo_allreduce_async("one-too-many", &x, &x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1,
                                 &h),
            KOLO_ERR_TIMED_OUT);
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 3s);
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_OP_TIMEOUT")) << kolo_last_error();
}

TEST_F(Protocol, ForkedChildNeitherUsesNorClosesItsParentsSession) {
  FakeAgentOptions o;
  o.reduce = doubleFloats;
  start(std::move(o));
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);  // never outlive a stuck test
    int bad = 0;
    if (kolo_allreduce("child", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1) !=
        KOLO_ERR_INVALID_ARGUMENT) {
      bad |= 1;
    }
    if (std::string(kolo_last_error()).find("forked child") == std::string::npos) bad |= 2;
    if (kolo_shutdown() != KOLO_OK) bad |= 4;
    ::_exit(bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's session is intact: no Goodbye was sent for it.
  ASSERT_EQ(kolo_allreduce("parent", x, x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1), KOLO_OK)
      << kolo_last_error();
  EXPECT_EQ(x[1], 4.0f);
  EXPECT_EQ(agent_->submissions().size(), 1u);
  EXPECT_FALSE(agent_->waitForGoodbye(0ms));
  ASSERT_EQ(kolo_shutdown(), KOLO_OK);
  EXPECT_TRUE(agent_->waitForGoodbye(kWait));
}

TEST_F(Protocol, ManyThreadsSubmitAndWaitConcurrently) {
  FakeAgentOptions o;
  o.reduce = doubleFloats;
  start(std::move(o));
  env_.set("KOLO_ARENA_MB", "2");  // small: forces waits for space too
  ASSERT_EQ(kolo_init(), KOLO_OK) << kolo_last_error();
  constexpr int kThreads = 4;
  constexpr int kOps = 150;
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  auto worker = [&](int t) {
    std::mt19937 rng(t);
    for (int i = 0; i < kOps; ++i) {
      size_t n = 1 + rng() % 100000;
      std::vector<float> in(n), out(n);
      for (size_t k = 0; k < n; ++k) in[k] = static_cast<float>(t * 1000 + i + k % 7);
      int64_t shape[1] = {static_cast<int64_t>(n)};
      std::string name = std::string("t") + std::to_string(t) + ".op" + std::to_string(i);
      kolo_handle_t h;
      kolo_status_t s = kolo_allreduce_async(name.c_str(), in.data(), out.data(), 1, shape,
                                             KOLO_FLOAT32, KOLO_SUM, 1, 1, &h);
      if (s == KOLO_OK) {
        if (i % 3 == 0) {  // poll, with short waits in between
          bool synced = false;
          while (!synced && (s = kolo_poll(h)) == KOLO_IN_PROGRESS) {
            s = kolo_synchronize(h, 1);
            synced = s != KOLO_ERR_TIMED_OUT;
          }
          if (!synced && s == KOLO_OK) s = kolo_synchronize(h, 0);
        } else {
          s = kolo_synchronize(h, 20'000);
        }
      }
      if (s != KOLO_OK) {
        errors[t] = kolo_last_error();
        ++failures;
        return;
      }
      for (size_t k = 0; k < n; ++k) {
        if (out[k] != 2 * in[k]) {
          errors[t] = name + ": wrong value at " + std::to_string(k);
          ++failures;
          return;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << errors[0] << errors[1] << errors[2] << errors[3];
  EXPECT_EQ(agent_->submissions().size(), static_cast<size_t>(kThreads * kOps));
}

}  // namespace
}  // namespace kolo::testing
