// The device path's wire rules (agent/gpu/device_ipc.h): every build.
#include "agent/gpu/device_ipc.h"

#include "client_lib/src/device_client.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "common/dtype.h"

namespace kolo::gpu {
namespace {

SubmitDesc deviceDesc(uint64_t off, uint64_t bytes, uint32_t event) {
  SubmitDesc d{};
  d.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
  d.dtype = static_cast<uint8_t>(DataType::kUint8);
  d.ndim = 1;
  d.shape[0] = static_cast<int64_t>(bytes);
  d.data_offset = off;
  d.data_bytes = bytes;
  d.name_len = 3;
  std::memcpy(d.name, "t.w", 3);
  markDevice(&d, event);
  return d;
}

TEST(DeviceIpc, DescriptorEncoding) {
  SubmitDesc d{};
  EXPECT_FALSE(isDevice(d));
  markDevice(&d, 17);
  EXPECT_TRUE(isDevice(d));
  EXPECT_EQ(d.flags, kSubmitFlagDevice);
  EXPECT_EQ(d.device_event, 17u);
  // The field took the old `reserved` word: the layout did not change.
  EXPECT_EQ(sizeof(SubmitDesc) % 8, 0u);
  EXPECT_EQ(offsetof(SubmitDesc, device_event), offsetof(SubmitDesc, group_size) + sizeof(uint32_t));
  // The elastic generation follows it, then the split epoch, and the device
  // header's offset (protocol 6) ends the descriptor.
  EXPECT_EQ(offsetof(SubmitDesc, generation), offsetof(SubmitDesc, device_event) + sizeof(uint32_t));
  EXPECT_EQ(offsetof(SubmitDesc, split_epoch), offsetof(SubmitDesc, generation) + sizeof(uint64_t));
  EXPECT_EQ(offsetof(SubmitDesc, meta_offset),
            offsetof(SubmitDesc, split_epoch) + sizeof(uint64_t));
  EXPECT_EQ(offsetof(SubmitDesc, meta_offset) + sizeof(uint64_t), sizeof(SubmitDesc));
}

TEST(DeviceIpc, EventSlotPoolHandsOutEachSlotOnceAndReusesFreedOnes) {
  EventSlotPool p(4);
  std::set<uint32_t> got;
  for (int i = 0; i < 4; ++i) {
    auto s = p.acquire();
    ASSERT_TRUE(s.has_value());
    EXPECT_LT(*s, 4u);
    EXPECT_TRUE(got.insert(*s).second) << "slot " << *s << " handed out twice";
  }
  EXPECT_EQ(p.inUse(), 4u);
  EXPECT_FALSE(p.acquire().has_value());
  EXPECT_TRUE(p.release(2));
  EXPECT_FALSE(p.release(2)) << "double release";
  EXPECT_FALSE(p.release(9)) << "out of range";
  auto s = p.acquire();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, 2u);
  EXPECT_EQ(p.inUse(), 4u);
}

TEST(DeviceIpc, EventHandleCounts) {
  EXPECT_EQ(countEventHandles(64).value(), 1u);
  EXPECT_EQ(countEventHandles(64 * kMaxDeviceEvents).value(), kMaxDeviceEvents);
  for (size_t bad : {size_t{0}, size_t{63}, size_t{65}, size_t{64} * (kMaxDeviceEvents + 1)}) {
    auto r = countEventHandles(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "device_events is " + std::to_string(bad) +
                                        " bytes; it must hold 1..64 event handles of 64 bytes");
  }
}

TEST(DeviceIpc, ValidationTexts) {
  // No grant: the reason the agent kept, or the hint when the trainer asked for none.
  Status s = validateDeviceDesc(deviceDesc(0, 16, 0), 0, 0, "the kolo agent could not grant a device arena: no CUDA device: x");
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.message(),
            "allreduce of device tensor 't.w': this rank has no device arena on the kolo agent (the kolo agent could "
            "not grant a device arena: no CUDA device: x); hand kolo host tensors instead");
  s = validateDeviceDesc(deviceDesc(0, 16, 0), 0, 0, "");
  EXPECT_NE(s.message().find("(it did not ask for one: KOLO_DEVICE_ARENA_MB unset, or no usable GPU in the trainer)"),
            std::string::npos)
      << s.message();
  // Granted: offsets and events are checked against the grant.
  EXPECT_TRUE(validateDeviceDesc(deviceDesc(0, 1 << 20, 63), 1 << 20, 64, "").isOk());
  EXPECT_TRUE(validateDeviceDesc(deviceDesc(1 << 20, 0, 0), 1 << 20, 64, "").isOk());
  s = validateDeviceDesc(deviceDesc(1, 1 << 20, 0), 1 << 20, 64, "");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "malformed descriptor: device data [1, +1048576) is outside the device arena of 1048576 bytes");
  s = validateDeviceDesc(deviceDesc(UINT64_MAX - 3, 8, 0), 1 << 20, 64, "");
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << "offset overflow must not wrap";
  s = validateDeviceDesc(deviceDesc(0, 16, 64), 1 << 20, 64, "");
  EXPECT_EQ(s.message(), "malformed descriptor: device event 64 is not one of the 64 registered at Hello");
  SubmitDesc g = deviceDesc(0, 16, 0);
  g.collective = static_cast<uint8_t>(CollectiveType::kJoin);
  s = validateDeviceDesc(g, 1 << 20, 64, "");
  EXPECT_EQ(
      s.message(),
      "join of device tensor 't.w': device tensors are wired for allreduce, broadcast, allgather, "
      "reducescatter and alltoall; copy the tensor to the host for this collective (docs/gpu.md)");
  for (auto c : {CollectiveType::kBroadcast, CollectiveType::kAllgather,
                 CollectiveType::kReducescatter, CollectiveType::kAlltoall}) {
    g.collective = static_cast<uint8_t>(c);
    EXPECT_TRUE(validateDeviceDesc(g, 1 << 20, 64, "").isOk()) << collectiveName(c);
  }
}

TEST(DeviceIpc, PlanRoutes) {
  auto p = planDeviceOp("x", {true, true, true}, {0, 0, 0}, 1);
  EXPECT_EQ(p.route, DeviceRoute::kLocalKernel);
  p = planDeviceOp("x", {true}, {1}, 3);
  EXPECT_EQ(p.route, DeviceRoute::kStagedCross);
  p = planDeviceOp("x", {true, false}, {0, -1}, 1);
  EXPECT_EQ(p.route, DeviceRoute::kRefuse);
  EXPECT_EQ(p.why,
            "tensor 'x': local rank 1 submitted a host tensor and another a device tensor; on one agent all ranks "
            "must hand the same kind (mixing is not wired yet)");
  p = planDeviceOp("x", {true, true}, {0, 1}, 1);
  EXPECT_EQ(p.route, DeviceRoute::kSeveralGpus);
  p = planDeviceOp("x", {true, true, true}, {1, 1, 0}, 1);
  EXPECT_EQ(p.route, DeviceRoute::kSeveralGpus);
  p = planDeviceOp("x", {true, true}, {0, 1}, 2);
  EXPECT_EQ(p.route, DeviceRoute::kRefuse);
  EXPECT_EQ(p.why,
            "tensor 'x': device tensors of ranks on several GPUs of one node are wired for jobs on "
            "one agent only "
            "so far (this job spans 2 agents); put a node's ranks on one GPU, or copy the tensor "
            "to the host");
  p = planDeviceOp("x", {true, true}, {0, -1}, 1);
  EXPECT_EQ(p.why, "tensor 'x': local rank 1's GPU is not known to the agent");
}

TEST(DeviceIpc, DeviceArenaMbParsing) {
  EXPECT_EQ(parseDeviceArenaMb(nullptr).value(), 0u);
  EXPECT_EQ(parseDeviceArenaMb("").value(), 0u);
  EXPECT_EQ(parseDeviceArenaMb("0").value(), 0u);
  EXPECT_EQ(parseDeviceArenaMb("64").value(), 64ull << 20);
  EXPECT_EQ(parseDeviceArenaMb("65536").value(), 65536ull << 20);
  for (const char* bad : {"-1", "lots", "12x", "65537", "99999999999999999999999"}) {
    auto r = parseDeviceArenaMb(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().message(), "KOLO_DEVICE_ARENA_MB is '" + std::string(bad) +
                                        "'; it must be a whole number of MiB from 0 (no device arena) to 65536");
  }
}

}  // namespace
}  // namespace kolo::gpu
