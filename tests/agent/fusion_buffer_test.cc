// FusionBuffer: what CrossJob's fused allreduces and fused allgathers /
// reducescatters pack into one staging block and read back.
#include "agent/cross/fusion_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace kolo {
namespace {

// Fused allreduce: parts at 64-byte aligned offsets, packed chunk by chunk;
// each chunk holds the parts' bytes that fall in it and zeros elsewhere,
// whatever the block held before (the pool hands used blocks back).
TEST(FusionBuffer, PackRangeCopiesThePartsAndZeroesTheGaps) {
  std::vector<uint8_t> a(40, 0xAA), b(100, 0xBB);
  FusionBuffer f(256, 256);
  std::memset(f.data(), 0x77, 256);
  f.add({"a", a.data(), 0, a.size(), -1, nullptr});
  f.add({"b", b.data(), 64, b.size(), -1, nullptr});
  f.packRange(0, 128);    // a, a's gap, b's first 64 bytes
  f.packRange(128, 256);  // b's last 36 bytes and the tail
  for (size_t i = 0; i < 256; ++i) {
    const uint8_t want = i < 40 ? 0xAA : i < 64 ? 0 : i < 164 ? 0xBB : 0;
    ASSERT_EQ(static_cast<uint8_t>(f.data()[i]), want) << "byte " << i;
  }
  EXPECT_EQ(f.size(), 256u);
  ASSERT_EQ(f.parts().size(), 2u);
  EXPECT_EQ(f.parts()[1].name, "b");
}

// Fused allgather / reducescatter: one part per tensor and agent, packed
// and unpacked by agent only.
TEST(FusionBuffer, PacksAndUnpacksTheSelectedAgentsParts) {
  // Two tensors, two agents: tensor t's block of agent a is t*10 + a.
  std::vector<std::vector<uint8_t>> tensors = {std::vector<uint8_t>(8), std::vector<uint8_t>(8)};
  for (int t = 0; t < 2; ++t) {
    for (int a = 0; a < 2; ++a) std::memset(tensors[t].data() + 4 * a, t * 10 + a, 4);
  }
  FusionBuffer f(16, 64);
  uint64_t off = 0;
  for (int a = 0; a < 2; ++a) {
    for (int t = 0; t < 2; ++t) {
      f.add({"t" + std::to_string(t), tensors[t].data() + 4 * a, off, 4, a, nullptr});
      off += 4;
    }
  }
  std::memset(f.data(), 0xFF, 16);
  f.packParts([](const FusionBuffer::Part& p) { return p.agent == 1; });
  const std::vector<uint8_t> packed(f.data(), f.data() + 16);
  EXPECT_EQ(packed, (std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 1, 1, 1,
                                          1, 11, 11, 11, 11}));
  // The collective's result lands in the buffer; only agent 0's parts are read back.
  std::memset(f.data(), 42, 16);
  f.unpackParts([](const FusionBuffer::Part& p) { return p.agent == 0; });
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(tensors[t][0], 42) << "tensor " << t;
    EXPECT_EQ(tensors[t][4], t * 10 + 1) << "tensor " << t;
  }
}

}  // namespace
}  // namespace kolo
