// The agent's check of a trainer's allreduce descriptor (ClientConn::
// validate): in place, and out of place with an output region of its own
// (zero copy out of place), with the refusals' texts.
#include <gtest/gtest.h>

#include <cstring>

#include "agent/ipc/client_conn.h"
#include "common/dtype.h"
#include "common/ipc_layout.h"

namespace kolo {
namespace {

constexpr uint64_t kArenaBytes = 1 << 20;

class ClientConnValidate : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(conn_.createArena(kArenaBytes, "kolo-test-arena").isOk()); }

  // An allreduce of 256 float32 at `in` (bytes into the data region), out of
  // place at `out` when out_bytes > 0.
  SubmitDesc allreduce(uint64_t in, uint64_t out, uint64_t out_bytes) const {
    SubmitDesc d{};
    d.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
    d.dtype = static_cast<uint8_t>(DataType::kFloat32);
    d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    d.ndim = 1;
    d.shape[0] = 256;
    d.prescale = d.postscale = 1.0;
    d.name_len = 1;
    std::memcpy(d.name, "t", 1);
    d.data_offset = base_ + in;
    d.data_bytes = 1024;
    d.out_offset = out_bytes > 0 ? base_ + out : 0;
    d.out_bytes = out_bytes;
    return d;
  }

  ClientConn conn_{1, UniqueFd(), 0, 0};
  const uint64_t base_ = ArenaLayout::compute(kArenaBytes).data_offset;
};

TEST_F(ClientConnValidate, InPlaceAndDisjointOutOfPlaceAreAccepted) {
  EXPECT_TRUE(conn_.validate(allreduce(0, 0, 0)).isOk());
  EXPECT_TRUE(conn_.validate(allreduce(0, 1024, 1024)).isOk());
  EXPECT_TRUE(conn_.validate(allreduce(4096, 0, 1024)).isOk());
}

TEST_F(ClientConnValidate, AnOutputOfAnotherSizeOrOverlappingTheInputIsMalformed) {
  Status st = conn_.validate(allreduce(0, 4096, 512));
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "malformed descriptor: allreduce output region of 512 bytes for 1024 bytes of input");
  st = conn_.validate(allreduce(0, 512, 1024));
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "malformed descriptor: allreduce output region overlaps its input");
  st = conn_.validate(allreduce(1024, 64, 1024));
  EXPECT_EQ(st.message(), "malformed descriptor: allreduce output region overlaps its input");
}

}  // namespace
}  // namespace kolo
