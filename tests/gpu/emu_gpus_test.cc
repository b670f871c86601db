// The host emulation's several GPUs (agent/gpu/emu/host_gpus.h) and the
// node-local NCCL communicator over them (agent/backends/nccl/node_comm.h),
// in process: KOLO_DEVICE_EMU_GPUS=3 with peer access (set before the
// first device call; the emulation reads it once).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "agent/backends/nccl/node_comm.h"
#include "agent/gpu/device_api.h"
#include "agent/gpu/emu/host_gpus.h"

namespace kolo::gpu {
namespace {

TEST(EmuGpusParse, ValuesAndTexts) {
  auto g = emu::parseEmuGpus(nullptr, nullptr);
  ASSERT_TRUE(g.isOk());
  EXPECT_EQ(g->count, 1);
  EXPECT_TRUE(g->p2p);
  g = emu::parseEmuGpus("4", "none");
  ASSERT_TRUE(g.isOk());
  EXPECT_EQ(g->count, 4);
  EXPECT_FALSE(g->p2p);
  for (const char* bad : {"0", "17", "two", "3x", "-1"}) {
    g = emu::parseEmuGpus(bad, "all");
    ASSERT_FALSE(g.isOk()) << bad;
    EXPECT_EQ(g.status().message(), std::string("KOLO_DEVICE_EMU_GPUS='") + bad +
                                        "': a number of emulated GPUs in 1..16");
  }
  g = emu::parseEmuGpus("2", "some");
  ASSERT_FALSE(g.isOk());
  EXPECT_EQ(g.status().message(), "KOLO_DEVICE_EMU_P2P='some': all or none");
}

class EmuGpus : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("KOLO_DEVICE_EMU_GPUS", "3", 1);
    ::setenv("KOLO_DEVICE_EMU_P2P", "all", 1);
  }
  void SetUp() override {
    if (!deviceEmulationBuilt()) GTEST_SKIP() << "skipped: no host emulation in this build";
    ASSERT_TRUE(selectDeviceApi(DeviceKind::kHostEmulated).isOk());
    api_ = deviceApi();
    ASSERT_NE(api_, nullptr);
  }
  void* alloc(int dev, size_t bytes) {
    EXPECT_TRUE(api_->setDevice(dev).isOk());
    auto p = api_->allocDevice(bytes);
    EXPECT_TRUE(p.isOk());
    bufs_.push_back(*p);
    return *p;
  }
  void TearDown() override {
    for (void* p : bufs_) api_->freeDevice(p);
  }
  DeviceApi* api_ = nullptr;
  std::vector<void*> bufs_;
};

TEST_F(EmuGpus, DistinctOrdinalsUuidsAndMemoryTags) {
  ASSERT_EQ(api_->deviceCount().value(), 3);
  std::set<std::string> uuids;
  for (int d = 0; d < 3; ++d) {
    auto u = api_->deviceUuid(d);
    ASSERT_TRUE(u.isOk());
    EXPECT_EQ(u->size(), 16u);
    uuids.insert(*u);
  }
  EXPECT_EQ(uuids.size(), 3u);
  Status st = api_->setDevice(3);
  EXPECT_EQ(st.message(),
            "cudaSetDevice: cudaErrorInvalidDevice: device 3 is not one of the emulation's 3 "
            "(KOLO_DEVICE_EMU_GPUS)");
  void* a = alloc(1, 64);
  EXPECT_EQ(api_->currentDevice().value(), 1);
  void* b = alloc(2, 64);
  EXPECT_EQ(api_->pointerInfo(a).ordinal, 1);
  EXPECT_EQ(api_->pointerInfo(static_cast<char*>(b) + 10).ordinal, 2);
  EXPECT_TRUE(api_->pointerInfo(b).device);
  auto arena = api_->createArena(2, 1);
  ASSERT_TRUE(arena.isOk());
  EXPECT_EQ(api_->pointerInfo((*arena)->data()).ordinal, 2);
  int host = 0;
  EXPECT_FALSE(api_->pointerInfo(&host).device);
  EXPECT_FALSE(api_->canAccessPeer(1, 1).value());
  EXPECT_TRUE(api_->canAccessPeer(0, 2).value());
}

// A kernel on GPU 0 reading GPU 1's memory is refused until peer access is
// enabled, then reduces bit for bit.
TEST_F(EmuGpus, AKernelReadsAPeerOnlyWithPeerAccess) {
  const size_t n = 1000;
  void* x = alloc(0, n * 4);
  void* y = alloc(1, n * 4);
  std::vector<float> hx(n), hy(n), got(n);
  for (size_t i = 0; i < n; ++i) {
    hx[i] = static_cast<float>(i);
    hy[i] = static_cast<float>(3 * i + 1);
  }
  ASSERT_TRUE(api_->setDevice(0).isOk());
  auto s = api_->createStream();
  ASSERT_TRUE(s.isOk());
  void* st = (*s)->get();
  ASSERT_TRUE(api_->copyAsync(x, hx.data(), n * 4, st).isOk());
  ASSERT_TRUE(api_->copyAsync(y, hy.data(), n * 4, st).isOk());
  const void* srcs[2] = {x, y};
  void* dst = x;
  Status r =
      api_->launchReduce(DataType::kFloat32, ReduceOp::kSum, srcs, 2, &dst, 1, n, 1.0, 1.0, st);
  EXPECT_EQ(r.message(),
            "launchReduce on device 0 touches device 1's memory without peer access "
            "(cudaDeviceEnablePeerAccess): cudaErrorIllegalAddress");
  ASSERT_TRUE(api_->enablePeerAccess(0, 1).isOk());
  ASSERT_TRUE(
      api_->launchReduce(DataType::kFloat32, ReduceOp::kSum, srcs, 2, &dst, 1, n, 1.0, 1.0, st)
          .isOk());
  ASSERT_TRUE(api_->copyAsync(got.data(), x, n * 4, st).isOk());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], hx[i] + hy[i]) << i;
}

#ifdef KOLO_TEST_NCCL
// One NCCL rank per emulated GPU in this process: allreduce (every op on
// int32) and a broadcast from each root, bit for bit.
TEST_F(EmuGpus, NodeCommAllreduceAndBroadcastOverThreeGpus) {
  auto comm = nccl::createNodeComm({0, 1, 2}, std::chrono::seconds(20));
  ASSERT_TRUE(comm.isOk()) << comm.status().toString();
  const size_t n = 777;
  std::vector<void*> bufs, streams;
  std::vector<std::unique_ptr<DevStream>> keep;
  for (int d = 0; d < 3; ++d) {
    bufs.push_back(alloc(d, n * 4));
    auto s = api_->createStream();
    ASSERT_TRUE(s.isOk());
    streams.push_back((*s)->get());
    keep.push_back(std::move(*s));
  }
  auto input = [&](int d, size_t i) { return static_cast<int32_t>((i * 7 + d * 13) % 101) - 50; };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    for (int d = 0; d < 3; ++d) {
      std::vector<int32_t> h(n);
      for (size_t i = 0; i < n; ++i)
        h[i] = op == ReduceOp::kProduct ? input(d, i) % 3 : input(d, i);
      ASSERT_TRUE(api_->setDevice(d).isOk());
      ASSERT_TRUE(api_->copyAsync(bufs[d], h.data(), n * 4, streams[d]).isOk());
    }
    ASSERT_TRUE((*comm)->allreduce(bufs, streams, n, DataType::kInt32, op).isOk());
    for (int d = 0; d < 3; ++d) {
      std::vector<int32_t> got(n);
      ASSERT_TRUE(api_->copyAsync(got.data(), bufs[d], n * 4, streams[d]).isOk());
      for (size_t i = 0; i < n; ++i) {
        int32_t v[3];
        for (int k = 0; k < 3; ++k) v[k] = op == ReduceOp::kProduct ? input(k, i) % 3 : input(k, i);
        const int32_t want = op == ReduceOp::kSum   ? v[0] + v[1] + v[2]
                             : op == ReduceOp::kMin ? std::min({v[0], v[1], v[2]})
                             : op == ReduceOp::kMax ? std::max({v[0], v[1], v[2]})
                                                    : v[0] * v[1] * v[2];
        ASSERT_EQ(got[i], want) << "op " << static_cast<int>(op) << " gpu " << d << " at " << i;
      }
    }
  }
  for (int root = 0; root < 3; ++root) {
    for (int d = 0; d < 3; ++d) {
      std::vector<int32_t> h(n, d * 1000 + root);
      ASSERT_TRUE(api_->copyAsync(bufs[d], h.data(), n * 4, streams[d]).isOk());
    }
    ASSERT_TRUE((*comm)->broadcast(bufs, streams, n * 4, root).isOk());
    for (int d = 0; d < 3; ++d) {
      std::vector<int32_t> got(n);
      ASSERT_TRUE(api_->copyAsync(got.data(), bufs[d], n * 4, streams[d]).isOk());
      EXPECT_EQ(got, std::vector<int32_t>(n, root * 1000 + root)) << "root " << root;
    }
  }
  EXPECT_TRUE((*comm)->asyncError().isOk());
}
#endif

}  // namespace
}  // namespace kolo::gpu
