// How device tensors cross agents: the mode flag, the KV capability record,
// the key prefixes and the choice every agent makes (agent/gpu/device_cross.h).
#include "agent/gpu/device_cross.h"

#include <gtest/gtest.h>

namespace kolo::gpu {
namespace {

using Caps = std::vector<std::optional<DeviceCrossCapability>>;

DeviceCrossCapability good(int gpu = 0) { return {true, gpu, ""}; }

TEST(DeviceCross, ParsesTheModeAndNamesIt) {
  for (auto m : {DeviceCrossMode::kAuto, DeviceCrossMode::kNccl, DeviceCrossMode::kStaged}) {
    auto p = parseDeviceCrossMode(deviceCrossModeName(m));
    ASSERT_TRUE(p.isOk());
    EXPECT_EQ(*p, m);
  }
  auto bad = parseDeviceCrossMode("ucx");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "--device-cross must be auto, nccl or staged (got 'ucx')");
}

TEST(DeviceCross, CapabilityRoundTripsThroughTheKvText) {
  for (const DeviceCrossCapability& c :
       {good(0), good(7), DeviceCrossCapability{false, -1, "built without NCCL"},
        DeviceCrossCapability{true, -1, "no CUDA device: cudaGetDeviceCount returned 0"}}) {
    auto d = decodeCapability(encodeCapability(c));
    ASSERT_TRUE(d.isOk()) << encodeCapability(c);
    EXPECT_EQ(d->nccl, c.nccl);
    EXPECT_EQ(d->gpu, c.gpu);
    EXPECT_EQ(d->lacks, c.lacks);
  }
  EXPECT_EQ(encodeCapability({true, 0, ""}), "nccl=1 gpu=0 lacks=");
  for (const char* t :
       {"", "nccl=", "nccl=2 gpu=0 lacks=", "nccl=1 gpu=x lacks=", "nccl=1 gpu=-2 lacks=",
        "nccl=1 gpu= lacks=", "nccl=1 lacks= gpu=0", "nccl=1 gpu=0"}) {
    auto d = decodeCapability(t);
    ASSERT_FALSE(d.isOk()) << t;
    EXPECT_EQ(d.status().message(), std::string("malformed device capability '") + t + "'");
  }
}

TEST(DeviceCross, LocalCapabilityFromTheBuildAndTheGrants) {
  auto c = localDeviceCapability(true, {0, 0, 0}, "");
  EXPECT_TRUE(c.nccl);
  EXPECT_EQ(c.gpu, 0);
  EXPECT_EQ(c.lacks, "");
  c = localDeviceCapability(false, {2}, "");
  EXPECT_FALSE(c.nccl);
  EXPECT_EQ(c.gpu, 2);
  EXPECT_EQ(c.lacks, "built without NCCL");
  c = localDeviceCapability(true, {}, "");
  EXPECT_EQ(c.gpu, -1);
  EXPECT_EQ(c.lacks, "no trainer of the job has a device arena on this agent");
  c = localDeviceCapability(true, {}, "no CUDA device: cudaGetDeviceCount returned 100");
  EXPECT_EQ(c.lacks, "no CUDA device: cudaGetDeviceCount returned 100");
  c = localDeviceCapability(false, {0, 1}, "");
  EXPECT_EQ(c.gpu, -1);
  EXPECT_EQ(c.lacks,
            "built without NCCL; the job's trainers on this agent use different GPUs (0 and 1)");
  // Through the KV text into the choice: the reason reaches the log line.
  auto d =
      decodeCapability(encodeCapability(localDeviceCapability(true, {}, "built without CUDA")));
  ASSERT_TRUE(d.isOk());
  auto choice = chooseDeviceCross(DeviceCrossMode::kNccl, {good(), *d});
  EXPECT_EQ(choice.kind, DeviceCrossChoiceKind::kFail);
  EXPECT_EQ(
      choice.why,
      "--device-cross=nccl but NCCL is not viable for this job: agent 1 has no GPU for the job "
      "(built without CUDA)");
}

TEST(DeviceCross, KeysArePerGeneration) {
  EXPECT_EQ(ncclKeyPrefix(0), "g0/nccl");
  EXPECT_EQ(ncclKeyPrefix(12), "g12/nccl");
  EXPECT_EQ(deviceCapabilityKey(3, 1), "g3/devcap/1");
  EXPECT_NE(deviceCapabilityKey(3, 1), deviceCapabilityKey(4, 1));
}

TEST(DeviceCross, StagedWhenForcedWhateverTheAgentsHave) {
  for (const Caps& caps : {Caps{good(), good()}, Caps{good(), std::nullopt}, Caps{}}) {
    auto c = chooseDeviceCross(DeviceCrossMode::kStaged, caps);
    EXPECT_EQ(c.kind, DeviceCrossChoiceKind::kStaged);
    EXPECT_EQ(c.why, "device tensors cross agents by host staging: --device-cross=staged");
  }
}

TEST(DeviceCross, NcclWhenEveryAgentHasNcclAndAGpu) {
  for (auto mode : {DeviceCrossMode::kAuto, DeviceCrossMode::kNccl}) {
    for (size_t n : {2u, 4u}) {
      Caps caps(n, good());
      caps[1] = good(1);  // the GPU ordinal need not match across agents
      auto c = chooseDeviceCross(mode, caps);
      EXPECT_EQ(c.kind, DeviceCrossChoiceKind::kNccl);
      EXPECT_EQ(c.why, "device tensors cross agents over NCCL: every one of the " +
                           std::to_string(n) + " agents has NCCL and a GPU (--device-cross=" +
                           deviceCrossModeName(mode) + ")");
    }
  }
}

// Every combination of three agents' states, in auto and forced nccl: the
// first agent by cross rank that lacks something names the reason.
TEST(DeviceCross, EveryCombinationNamesTheFirstAgentThatLacks) {
  const std::vector<std::optional<DeviceCrossCapability>> states = {
      good(), DeviceCrossCapability{false, 0, "built without NCCL"},
      DeviceCrossCapability{true, -1, "no CUDA device"}, std::nullopt};
  const std::vector<std::string> lack = {
      "", " has no NCCL (built without NCCL)", " has no GPU for the job (no CUDA device)",
      " did not publish its device capability within the backend timeout"};
  for (size_t a = 0; a < 4; ++a)
    for (size_t b = 0; b < 4; ++b)
      for (size_t d = 0; d < 4; ++d) {
        Caps caps = {states[a], states[b], states[d]};
        std::string expect;
        if (a != 0)
          expect = "agent 0" + lack[a];
        else if (b != 0)
          expect = "agent 1" + lack[b];
        else if (d != 0)
          expect = "agent 2" + lack[d];
        auto autoc = chooseDeviceCross(DeviceCrossMode::kAuto, caps);
        auto forced = chooseDeviceCross(DeviceCrossMode::kNccl, caps);
        if (expect.empty()) {
          EXPECT_EQ(autoc.kind, DeviceCrossChoiceKind::kNccl);
          EXPECT_EQ(forced.kind, DeviceCrossChoiceKind::kNccl);
          continue;
        }
        EXPECT_EQ(autoc.kind, DeviceCrossChoiceKind::kStaged) << a << b << d;
        EXPECT_EQ(autoc.why, "device tensors cross agents by host staging: " + expect);
        EXPECT_EQ(forced.kind, DeviceCrossChoiceKind::kFail) << a << b << d;
        EXPECT_EQ(forced.why, "--device-cross=nccl but NCCL is not viable for this job: " + expect);
      }
}

TEST(DeviceCross, LacksWithoutDetailHasNoParentheses) {
  auto c = chooseDeviceCross(DeviceCrossMode::kAuto, {good(), DeviceCrossCapability{false, 0, ""}});
  EXPECT_EQ(c.why, "device tensors cross agents by host staging: agent 1 has no NCCL");
}

TEST(DeviceCross, OneAgentIsNotACrossJob) {
  auto a = chooseDeviceCross(DeviceCrossMode::kAuto, {good()});
  EXPECT_EQ(a.kind, DeviceCrossChoiceKind::kStaged);
  EXPECT_EQ(a.why,
            "device tensors cross agents by host staging: the job has fewer than two agents");
  auto f = chooseDeviceCross(DeviceCrossMode::kNccl, {good()});
  EXPECT_EQ(f.kind, DeviceCrossChoiceKind::kFail);
}

TEST(DeviceCross, EveryAgentChoosesTheSameFromTheSameInputs) {
  Caps caps = {good(), DeviceCrossCapability{true, -1, "no CUDA device"}, good()};
  auto first = chooseDeviceCross(DeviceCrossMode::kAuto, caps);
  for (int agent = 0; agent < 3; ++agent) {
    auto c = chooseDeviceCross(DeviceCrossMode::kAuto, caps);
    EXPECT_EQ(c.kind, first.kind);
    EXPECT_EQ(c.why, first.why);
  }
}

}  // namespace
}  // namespace kolo::gpu
