// The agent's check of a trainer's allreduce descriptor (ClientConn::
// validate): in place, and out of place with an output region of its own
// (zero copy out of place), with the refusals' texts; and its rings when the
// trainer rewrites their headers.
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

// A streamed copy-in (kSubmitFlagStreamed): accepted only from a trainer
// the Welcome allowed, for an allreduce of at least the size it was told,
// in the arena, with its count of bytes copied in the cache line before
// the input; every refusal says which.
TEST_F(ClientConnValidate, AStreamedInputIsRefusedUnlessAllowedLargeEnoughAndWithRoomForItsCount) {
  SubmitDesc d = allreduce(4096, 0, 0);
  d.flags = kSubmitFlagStreamed;
  Status st = conn_.validate(d);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "malformed descriptor: a streamed copy-in from a trainer the agent did not allow it");

  conn_.streamed_min_bytes = 1024;
  EXPECT_TRUE(conn_.validate(d).isOk()) << conn_.validate(d).message();

  conn_.streamed_min_bytes = 2048;  // 1024 bytes: too small
  EXPECT_EQ(conn_.validate(d).message(),
            "malformed descriptor: only a host allreduce of at least 2048 bytes may be streamed "
            "into the arena");
  conn_.streamed_min_bytes = 1024;
  SubmitDesc b = d;
  b.collective = static_cast<uint8_t>(CollectiveType::kBroadcast);
  b.root = 0;
  EXPECT_EQ(conn_.validate(b).message(),
            "malformed descriptor: only a host allreduce of at least 1024 bytes may be streamed "
            "into the arena");

  SubmitDesc first = allreduce(0, 0, 0);  // no cache line before it in the data region
  first.flags = kSubmitFlagStreamed;
  EXPECT_EQ(conn_.validate(first).message(),
            "malformed descriptor: a streamed input at " + std::to_string(base_) +
                " has no aligned copy count before it in the arena's data region");
  SubmitDesc odd = allreduce(4096 + 8, 0, 0);
  odd.flags = kSubmitFlagStreamed;
  EXPECT_EQ(conn_.validate(odd).code(), Code::kInvalidArgument);

  SubmitDesc direct = d;
  direct.flags |= kSubmitFlagUserMemory;
  EXPECT_EQ(conn_.validate(direct).message(),
            "malformed descriptor: only a tensor in the shared arena may be streamed into it");
}

// A split reduction (kSubmitFlagSplit): accepted only from a trainer the
// Welcome allowed, for an in-place allreduce of at least the size it was
// told, copied into the arena, with room for its SplitHeader before the
// input; every refusal says which.
TEST_F(ClientConnValidate,
       ASplitInputIsRefusedUnlessAllowedInPlaceLargeEnoughAndWithRoomForItsHeader) {
  SubmitDesc d = allreduce(4096, 0, 0);
  d.flags = kSubmitFlagSplit;
  Status st = conn_.validate(d);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "malformed descriptor: a split reduction from a trainer the agent did not allow it");

  conn_.split_min_bytes = 1024;
  EXPECT_TRUE(conn_.validate(d).isOk()) << conn_.validate(d).message();

  const std::string only = "malformed descriptor: only an in-place host allreduce of at least ";
  conn_.split_min_bytes = 2048;  // 1024 bytes: too small
  EXPECT_EQ(conn_.validate(d).message(), only + "2048 bytes may be split");
  conn_.split_min_bytes = 1024;
  SubmitDesc b = d;
  b.collective = static_cast<uint8_t>(CollectiveType::kBroadcast);
  b.root = 0;
  EXPECT_EQ(conn_.validate(b).message(), only + "1024 bytes may be split");
  SubmitDesc oop = allreduce(4096, 8192, 1024);
  oop.flags = kSubmitFlagSplit;
  EXPECT_EQ(conn_.validate(oop).message(), only + "1024 bytes may be split");

  SubmitDesc first = allreduce(64, 0, 0);  // less than a header before it in the data region
  first.flags = kSubmitFlagSplit;
  EXPECT_EQ(conn_.validate(first).message(),
            "malformed descriptor: a split input at " + std::to_string(base_ + 64) +
                " has no aligned header before it in the arena's data region");
  SubmitDesc odd = allreduce(4096 + 8, 0, 0);
  odd.flags = kSubmitFlagSplit;
  EXPECT_EQ(conn_.validate(odd).code(), Code::kInvalidArgument);

  for (uint32_t other : {kSubmitFlagUserMemory, kSubmitFlagStreamed}) {
    SubmitDesc both = d;
    both.flags |= other;
    conn_.streamed_min_bytes = 1024;
    EXPECT_EQ(conn_.validate(both).message(),
              "malformed descriptor: only a tensor copied into the shared arena may be split");
  }
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

namespace kolo {
namespace {

// The agent's side of a trainer's rings (ClientConn): the capacity and the
// agent's own indices are its own; a trainer index out of bounds breaks the
// rings for good, reported once through on_broken_ring.
class ClientConnRings : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(conn_.createArena(kArenaBytes, "kolo-test-arena").isOk());
    conn_.on_broken_ring = [this] { ++broken_calls_; };
  }
  RingHeader* header(uint64_t offset) const {
    return reinterpret_cast<RingHeader*>(conn_.arena()->data() + offset);
  }
  RingHeader* submitRing() const { return header(layout_.submit_ring_offset); }
  RingHeader* completionRing() const { return header(layout_.completion_ring_offset); }

  ClientConn conn_{1, UniqueFd(), 0, 0};
  ArenaLayout layout_ = ArenaLayout::compute(kArenaBytes);
  int broken_calls_ = 0;
};

TEST_F(ClientConnRings, ARewrittenCapacityChangesNothing) {
  submitRing()->capacity = 3;
  completionRing()->capacity = uint64_t{1} << 50;
  SubmitRing trainer(conn_.arena()->data() + layout_.submit_ring_offset, kSubmitRingCapacity);
  SubmitDesc d{};
  d.handle = 42;
  ASSERT_TRUE(trainer.tryPush(d));
  SubmitDesc got{};
  ASSERT_TRUE(conn_.popSubmission(&got));
  EXPECT_EQ(got.handle, 42u);
  for (int i = 0; i < 2000; ++i) conn_.complete(i, okStatus());  // 1024 fit, the rest wait
  EXPECT_EQ(completionRing()->tail.load(), kCompletionRingCapacity);
  EXPECT_TRUE(conn_.flushCompletions());
  EXPECT_FALSE(conn_.broken());
  EXPECT_EQ(broken_calls_, 0);
}

TEST_F(ClientConnRings, ATailPastTheCapacityBreaksTheConnectionOnce) {
  submitRing()->tail.store(kSubmitRingCapacity + 1);
  SubmitDesc d;
  EXPECT_FALSE(conn_.popSubmission(&d));
  EXPECT_TRUE(conn_.broken());
  EXPECT_EQ(
      conn_.ringError(),
      "broke its submission ring (the producer moved the tail: tail 1025, head 0: 1025 entries "
      "in a ring of 1024)");
  EXPECT_EQ(broken_calls_, 1);
  submitRing()->tail.store(1);  // too late
  EXPECT_FALSE(conn_.popSubmission(&d));
  EXPECT_FALSE(conn_.hasSubmissions());
  conn_.complete(1, okStatus());  // nothing more is written to a broken connection's rings
  EXPECT_EQ(completionRing()->tail.load(), 0u);
  EXPECT_EQ(broken_calls_, 1);
}

TEST_F(ClientConnRings, AHeadPastTheTailBreaksTheConnectionOnce) {
  conn_.complete(1, okStatus());
  completionRing()->head.store(5);
  conn_.complete(2, okStatus());
  EXPECT_TRUE(conn_.broken());
  EXPECT_EQ(
      conn_.ringError(),
      "broke its completion ring (the consumer moved the head: tail 1, head 5: -4 entries in a "
      "ring of 1024)");
  EXPECT_EQ(completionRing()->tail.load(), 1u);
  EXPECT_FALSE(conn_.flushCompletions());
  EXPECT_EQ(broken_calls_, 1);
}

}  // namespace
}  // namespace kolo
