// The pinned staging buffers of device tensors crossing agents
// (agent/core/device_staging.h) over the host emulation, in process: size
// classes, pinned memory (copies stay asynchronous), reuse only after the
// agent stream has passed the release, the idle cache bound.
#include "agent/core/device_staging.h"

#include <gtest/gtest.h>

#include <cstring>

#include "agent/gpu/device_api.h"

namespace kolo {
namespace {

class DeviceStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu::deviceEmulationBuilt()) GTEST_SKIP() << "skipped: no host emulation in this build";
    ASSERT_TRUE(gpu::selectDeviceApi(gpu::DeviceKind::kHostEmulated).isOk());
    api_ = gpu::deviceApi();
    ASSERT_NE(api_, nullptr);
    auto s = api_->createStream();
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    stream_ = std::move(s).value();
  }
  gpu::DeviceApi* api_ = nullptr;
  std::unique_ptr<gpu::DevStream> stream_;
};

TEST(DeviceStagingClass, PowersOfTwoFromOneMebibyte) {
  EXPECT_EQ(PinnedStaging::sizeClass(0), size_t{1} << 20);
  EXPECT_EQ(PinnedStaging::sizeClass(1), size_t{1} << 20);
  EXPECT_EQ(PinnedStaging::sizeClass(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(PinnedStaging::sizeClass((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(PinnedStaging::sizeClass(size_t{5} << 20), size_t{8} << 20);
}

TEST_F(DeviceStagingTest, ABufferIsReusedOnlyOnceTheStreamPassedItsRelease) {
  auto pool = PinnedStaging::create(*api_, 0, stream_->get(), size_t{64} << 20);
  auto a = pool->acquire(3000);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  char* first = a->get();
  EXPECT_FALSE(api_->pointerInfo(first).device);
  // A device-to-host copy into it is asynchronous (pinned): it returns on
  // this thread before the stream ran it.
  auto dev = api_->allocDevice(3000);
  ASSERT_TRUE(dev.isOk());
  std::memset(*dev, 7, 3000);
  ASSERT_TRUE(api_->copyAsync(first, *dev, 3000, stream_->get()).isOk());
  ASSERT_TRUE(api_->streamSynchronize(stream_->get(), 10'000).isOk());
  EXPECT_EQ(first[2999], 7);
  a->reset();
  ASSERT_TRUE(api_->streamSynchronize(stream_->get(), 10'000).isOk());
  EXPECT_EQ(pool->parkedCount(), 0u);
  EXPECT_EQ(pool->idleBytes(), size_t{1} << 20);
  auto b = pool->acquire(1000);  // same class: the same buffer again
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(b->get(), first);
  auto c = pool->acquire(1000);  // the first is taken: a new one
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->get(), first);
  api_->freeDevice(*dev);
}

TEST_F(DeviceStagingTest, IdleBuffersPastTheCacheBoundAreFreed) {
  auto pool = PinnedStaging::create(*api_, 0, stream_->get(), size_t{2} << 20);
  std::vector<std::shared_ptr<char>> held;
  for (int i = 0; i < 4; ++i) {
    auto b = pool->acquire(size_t{1} << 20);
    ASSERT_TRUE(b.isOk());
    held.push_back(std::move(b).value());
  }
  held.clear();
  ASSERT_TRUE(api_->streamSynchronize(stream_->get(), 10'000).isOk());
  EXPECT_EQ(pool->idleBytes(), size_t{2} << 20);  // two kept, two freed
  EXPECT_EQ(pool->parkedCount(), 0u);
}

}  // namespace
}  // namespace kolo
