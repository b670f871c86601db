// The agent's bounds on what trainers and peer agents send it
// (agent/ipc/limits.h, docs/security.md "Bounds and quotas on the socket"):
// every Hello size, the per-rank quotas, bounded status snapshots and the
// peer agents' request lists, with the refusals' texts.
#include "agent/ipc/limits.h"

#include <gtest/gtest.h>

#include <cstring>

#include "agent/core/tensor_table.h"
#include "agent/cross/negotiation_state.h"

namespace kolo {
namespace {

ipc::Hello goodHello() {
  ipc::Hello h;
  h.set_protocol_version(kIpcProtocolVersion);
  h.set_job_id("job");
  h.set_token("secret");
  h.set_local_rank(0);
  h.set_local_size(2);
  h.set_world_size(2);
  return h;
}

TEST(HelloBounds, AnHonestHelloPasses) {
  EXPECT_TRUE(checkHelloBounds(goodHello(), AgentLimits{}).isOk());
}

TEST(HelloBounds, AHugeLocalSizeIsRefusedNamingTheFieldValueAndKnob) {
  ipc::Hello h = goodHello();
  h.set_local_size(2147483647);
  h.set_world_size(2147483647);
  Status st = checkHelloBounds(h, AgentLimits{});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(
      st.message(),
      "Hello: local_size 2147483647 is out of range [1, 256] (limit set by --max-local-size)");
}

TEST(HelloBounds, EverySizeHasALimit) {
  AgentLimits l;
  auto refused = [&](const std::function<void(ipc::Hello&)>& change) {
    ipc::Hello h = goodHello();
    change(h);
    return checkHelloBounds(h, l).message();
  };
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_job_id(std::string(129, 'j')); }),
            "Hello: job id of 129 bytes is longer than the limit of 128 bytes");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_job_id(""); }),
            "Hello: job id is empty (KOLO_JOB_ID)");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_token(std::string(5000, 't')); }),
            "Hello: token of 5000 bytes is longer than the limit of 1024 bytes");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_hostname(std::string(300, 'h')); }),
            "Hello: hostname of 300 bytes is longer than the limit of 255 bytes");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_gpu_uuid(std::string(65, 'u')); }),
            "Hello: gpu_uuid of 65 bytes is longer than the limit of 64 bytes");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_device_events(std::string(64 * 65, 'e')); }),
            "Hello: device_events of 4160 bytes is longer than the limit of 4096 bytes");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_local_rank(2); }),
            "local rank 2 is not in [0, local size 2)");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_world_size(1 << 30); }),
            "Hello: world_size 1073741824 is out of range [2, 16777216]");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_min_size(-1); }),
            "Hello: min_size -1 is out of range [0, 16777216]");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_arena_bytes(1ull << 40); }),
            "Hello: arena_bytes 1099511627776 is out of range [0, 68719476736] (limit set by "
            "--max-arena-mb)");
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_device_arena_bytes(~0ull); }),
            "Hello: device_arena_bytes 18446744073709551615 is out of range [0, 68719476736] "
            "(limit set by "
            "--max-device-arena-mb)");
  l.max_local_size = 8;
  EXPECT_EQ(refused([](ipc::Hello& h) { h.set_local_size(9); }),
            "Hello: local_size 9 is out of range [1, 8] (limit set by --max-local-size)");
}

TEST(SubmitQuota, NamesAndBytesInFlightPerRank) {
  AgentLimits l;
  l.max_names_in_flight = 3;
  EXPECT_TRUE(checkSubmitQuota({2, 0}, 100, 1000, l, 5, "j").isOk());
  Status st = checkSubmitQuota({3, 0}, 100, 1000, l, 5, "j");
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_EQ(st.message(),
            "rank 5 of job j has 3 collectives in flight on this agent (limit 3, "
            "--max-names-in-flight): wait for "
            "some to complete before submitting more");
  // Bytes: the rank's arenas by default, the knob when set.
  EXPECT_TRUE(checkSubmitQuota({0, 900}, 100, 1000, l, 5, "j").isOk());
  st = checkSubmitQuota({0, 901}, 100, 1000, l, 5, "j");
  EXPECT_EQ(st.message(),
            "rank 5 of job j would have 1001 bytes in flight on this agent (limit 1000 bytes, "
            "--max-bytes-in-flight-mb=0: the size of its arenas): wait for some collectives to "
            "complete before "
            "submitting more");
  l.max_bytes_in_flight = 1 << 20;
  EXPECT_TRUE(checkSubmitQuota({0, 901}, 100, 1000, l, 5, "j").isOk());
  EXPECT_FALSE(checkSubmitQuota({0, 0}, ~0ull, 1000, l, 5, "j").isOk());  // no wrap-around
}

TEST(SubmitQuota, AnInPlaceOutputIsCountedOnce) {
  SubmitDesc d{};
  d.data_offset = 4096;
  d.data_bytes = 100;
  EXPECT_EQ(submitDescBytes(d), 100u);
  d.out_offset = 4096;
  d.out_bytes = 100;
  EXPECT_EQ(submitDescBytes(d), 100u);
  d.out_offset = 8192;
  d.out_bytes = 300;
  EXPECT_EQ(submitDescBytes(d), 400u);
}

SubmitDesc named(const std::string& name) {
  SubmitDesc d{};
  d.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
  d.dtype = static_cast<uint8_t>(DataType::kFloat32);
  d.ndim = 1;
  d.shape[0] = 1;
  d.data_bytes = 4;
  d.name_len = static_cast<uint32_t>(name.size());
  std::memcpy(d.name, name.data(), name.size());
  return d;
}

TEST(TensorTableSnapshot, IsBoundedOldestFirstAndCountsTheRest) {
  TensorTable t(2);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    std::optional<ReadyOp> ready;
    ASSERT_TRUE(t.submit(0, named("n" + std::to_string(i)),
                         start + std::chrono::milliseconds(50 - i), &ready)
                    .isOk());
  }
  size_t omitted = 0;
  auto snap = t.snapshot(10, &omitted);
  ASSERT_EQ(snap.size(), 10u);
  EXPECT_EQ(omitted, 40u);
  EXPECT_EQ(snap[0].name, "n49");  // the oldest first
  EXPECT_EQ(snap[9].name, "n40");
  EXPECT_EQ(snap[0].waiting, std::vector<int>{1});
  EXPECT_EQ(t.snapshot().size(), 50u);
}

TEST(PeerRequests, ACountTheBytesCannotHoldIsRefusedBeforeAllocating) {
  std::string bytes(4, '\0');
  uint32_t n = 0xFFFFFFFFu;
  std::memcpy(bytes.data(), &n, 4);
  bytes += std::string(100, 'x');
  auto r = decodeRequests(bytes);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("count 4294967295 does not fit in 100 bytes"),
            std::string::npos)
      << r.status().message();
  // An honest list still round-trips.
  CrossRequest req;
  req.name = "grad";
  req.params = named("grad");
  req.error = std::string(100 * 1024, 'e');  // sent truncated to the limit
  auto back = decodeRequests(encodeRequests({req}));
  ASSERT_TRUE(back.isOk()) << back.status().message();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].error.size(), kMaxRequestErrorBytes);
}

}  // namespace
}  // namespace kolo
