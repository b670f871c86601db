// The header-only C++ API (kolo/kolo.hpp) against the FakeAgent.
#include "kolo/kolo.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "fake_agent.h"
#include "test_env.h"

namespace {

using namespace std::chrono_literals;
using kolo::testing::FakeAgent;
using kolo::testing::FakeAgentOptions;
using kolo::testing::ScopedEnv;

static_assert(kolo::dataTypeOf<float>() == kolo::DataType::kFloat32);
static_assert(kolo::dataTypeOf<const int64_t>() == kolo::DataType::kInt64);
static_assert(static_cast<int>(kolo::ReduceOp::kProduct) == KOLO_PRODUCT);

void doubleInts(const kolo::SubmitDesc& d, char* slot) {
  if (d.dtype == KOLO_INT32) {
    auto* v = reinterpret_cast<int32_t*>(slot);
    for (uint64_t i = 0; i < d.data_bytes / 4; ++i) v[i] *= 2;
  }
}

class CppApi : public ::testing::Test {
 protected:
  void start(bool hold) {
    FakeAgentOptions o;
    o.auto_complete = !hold;
    o.reduce = doubleInts;
    o.world.set_rank(2);
    o.world.set_size(4);
    o.world.set_local_rank(0);
    o.world.set_local_size(2);
    o.world.set_cross_rank(1);
    o.world.set_cross_size(2);
    agent_ = std::make_unique<FakeAgent>(std::move(o));
    ASSERT_TRUE(agent_->ok());
    env_.setJob(agent_->socketPath());
    env_.set("KOLO_SIZE", "4");
    env_.set("KOLO_LOCAL_SIZE", "2");
    kolo::Result r = kolo::init();
    ASSERT_TRUE(r.ok()) << r.toString();
  }
  void TearDown() override {
    kolo::shutdown();
    agent_.reset();
  }
  ScopedEnv env_;
  std::unique_ptr<FakeAgent> agent_;
};

TEST_F(CppApi, WorldAndTypedAllreduce) {
  ASSERT_NO_FATAL_FAILURE(start(false));
  EXPECT_TRUE(kolo::isInitialized());
  EXPECT_EQ(kolo::rank(), 2);
  EXPECT_EQ(kolo::size(), 4);
  EXPECT_EQ(kolo::localRank(), 0);
  EXPECT_EQ(kolo::localSize(), 2);
  EXPECT_EQ(kolo::crossRank(), 1);
  EXPECT_EQ(kolo::crossSize(), 2);
  std::vector<int32_t> v = {1, 2, 3};
  kolo::Result r = kolo::allreduce("ints", v.data(), v.size());
  ASSERT_TRUE(r) << r.toString();
  EXPECT_EQ(v, (std::vector<int32_t>{2, 4, 6}));
  EXPECT_EQ(agent_->submissions().at(0).reduce_op, KOLO_SUM);
}

TEST_F(CppApi, AsyncHandlePollWaitAndMove) {
  ASSERT_NO_FATAL_FAILURE(start(true));
  std::vector<int32_t> in = {5, 6}, out = {0, 0};
  kolo::Expected<kolo::Handle> h = kolo::allreduceAsync(
      "pair", in.data(), out.data(), {2}, kolo::DataType::kInt32, kolo::ReduceOp::kSum);
  ASSERT_TRUE(h.ok()) << h.result().toString();
  kolo::Handle handle = std::move(h).value();
  EXPECT_TRUE(handle.valid());
  EXPECT_EQ(kolo::poll(handle).code, KOLO_IN_PROGRESS);
  EXPECT_EQ(handle.wait(10).code, KOLO_ERR_TIMED_OUT);
  EXPECT_TRUE(handle.valid());  // a timed-out wait keeps it
  kolo::Handle moved = std::move(handle);
  EXPECT_FALSE(handle.valid());  // NOLINT(bugprone-use-after-move)
  ASSERT_TRUE(agent_->waitForSubmissions(1, 10s));
  agent_->completeAll();
  kolo::Result r = kolo::synchronize(moved);
  EXPECT_TRUE(r.ok()) << r.toString();
  EXPECT_FALSE(moved.valid());
  EXPECT_EQ(out, (std::vector<int32_t>{10, 12}));
  EXPECT_EQ(moved.wait().code, KOLO_ERR_INVALID_ARGUMENT);  // empty handle
}

TEST_F(CppApi, ErrorsComeBackAsResults) {
  ASSERT_NO_FATAL_FAILURE(start(true));
  int32_t x = 1;
  auto first = kolo::allreduceAsync("dup", &x, &x, {}, kolo::DataType::kInt32,
                                    kolo::ReduceOp::kMax);
  ASSERT_TRUE(first.ok());
  auto second = kolo::allreduceAsync("dup", &x, &x, {}, kolo::DataType::kInt32,
                                     kolo::ReduceOp::kMax);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.result().code, KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_NE(second.result().message.find("'dup'"), std::string::npos);
  EXPECT_EQ(second.result().toString().rfind("KOLO_ERR_INVALID_ARGUMENT: ", 0), 0u);
}

TEST_F(CppApi, DroppedHandleReleasesTheOperation) {
  ASSERT_NO_FATAL_FAILURE(start(true));
  int32_t in = 3, out = 0;
  kolo_handle_t id = 0;
  {
    auto h = kolo::allreduceAsync("dropped", &in, &out, {}, kolo::DataType::kInt32,
                                  kolo::ReduceOp::kSum);
    ASSERT_TRUE(h.ok());
    id = h->id();
  }
  ASSERT_TRUE(agent_->waitForSubmissions(1, 10s));
  agent_->completeAll();
  // Completions arrive in order: once a later op is done, so is "dropped".
  int32_t y = 1;
  auto later = kolo::allreduceAsync("later", &y, &y, {}, kolo::DataType::kInt32,
                                    kolo::ReduceOp::kSum);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE(agent_->waitForSubmissions(2, 10s));
  agent_->completeAll();
  ASSERT_TRUE(later->wait().ok());
  EXPECT_EQ(y, 2);
  EXPECT_EQ(kolo_poll(id), KOLO_ERR_INVALID_ARGUMENT);  // forgotten once drained
  EXPECT_EQ(out, 0);
}

TEST_F(CppApi, SharedBufferIsRaiiAndZeroCopy) {
  ASSERT_NO_FATAL_FAILURE(start(false));
  void* first = nullptr;
  {
    auto buf = kolo::SharedBuffer::allocate(4 * sizeof(int32_t));
    ASSERT_TRUE(buf.ok()) << buf.result().toString();
    first = buf->data();
    int32_t* v = buf->as<int32_t>();
    for (int i = 0; i < 4; ++i) v[i] = i + 1;
    kolo::Result r = kolo::allreduce("shared", v, 4, kolo::ReduceOp::kSum);
    ASSERT_TRUE(r) << r.toString();
    EXPECT_EQ(v[3], 8);
    EXPECT_EQ(buf->size(), 16u);
  }
  auto again = kolo::SharedBuffer::allocate(16);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);  // the destructor gave the space back
  auto too_big = kolo::allocShared(size_t{1} << 40);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.result().code, KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_NE(too_big.result().message.find("KOLO_ARENA_MB"), std::string::npos);
}

}  // namespace

namespace {

// C ABI revision 2 through the C++ layer: ScopedStream names the thread's
// stream and restores the previous one; a refused one leaves it as it was.
TEST(CppApiStream, ScopedStreamSetsAndRestores) {
  int a = 0, b = 0;  // stand-ins for cudaStream_t values (never dereferenced)
  {
    kolo::ScopedStream outer(&a, 0);
    ASSERT_TRUE(outer.result().ok()) << outer.result().toString();
    {
      kolo::ScopedStream inner(&b);
      ASSERT_TRUE(inner.result().ok());
      kolo_stream_t s = KOLO_STREAM_INIT;
      ASSERT_EQ(kolo_get_stream(&s), KOLO_OK);
      EXPECT_EQ(s.stream, &b);
      EXPECT_EQ(s.device, KOLO_DEVICE_ANY);
    }
    kolo_stream_t s = KOLO_STREAM_INIT;
    ASSERT_EQ(kolo_get_stream(&s), KOLO_OK);
    EXPECT_EQ(s.stream, &a);
    EXPECT_EQ(s.device, 0);
    kolo::ScopedStream bad(&b, -5);
    EXPECT_EQ(bad.result().code, KOLO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(bad.result().message.find("device is -5"), std::string::npos) << bad.result().message;
  }
  kolo_stream_t s = KOLO_STREAM_INIT;
  ASSERT_EQ(kolo_get_stream(&s), KOLO_OK);
  EXPECT_EQ(s.stream, nullptr);
  auto d = kolo::devicePath();  // not initialized
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(d.result().code, KOLO_ERR_INVALID_ARGUMENT);
}

}  // namespace
