// The default backend choice (agent/backends/backend_choice.h): the pure rule,
// the node probe and the agreement over a KvStore with agents as threads.
#include "agent/backends/backend_choice.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>

namespace kolo {
namespace {

using std::chrono::milliseconds;

BackendOffer rdma(const std::string& setting = "auto") {
  return {setting, "ucx", "RDMA device mlx5_0"};
}
BackendOffer plain(const std::string& setting = "auto") {
  return {setting, "tcp", "no RDMA device"};
}

TEST(BackendChoice, AutoTakesUcxOnlyWhenEveryAgentHasRdma) {
  auto all = agreeBackend({rdma(), rdma(), rdma()});
  ASSERT_TRUE(all.isOk()) << all.status().toString();
  EXPECT_EQ(all.value().backend, "ucx");
  EXPECT_EQ(all.value().reason, "auto: every agent has RDMA (RDMA device mlx5_0 on agent rank 0)");

  auto one_without = agreeBackend({rdma(), rdma(), plain()});
  ASSERT_TRUE(one_without.isOk());
  EXPECT_EQ(one_without.value().backend, "tcp");
  EXPECT_EQ(one_without.value().reason, "auto: agent rank 2 offers tcp (no RDMA device)");

  auto none = agreeBackend({plain(), plain()});
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(none.value().backend, "tcp");
  EXPECT_EQ(none.value().reason, "auto: agent rank 0 offers tcp (no RDMA device)");
}

TEST(BackendChoice, AnAgentThatNamesABackendDecidesAndTwoThatDisagreeFail) {
  auto forced = agreeBackend({plain(), plain("ucx"), rdma()});
  ASSERT_TRUE(forced.isOk());
  EXPECT_EQ(forced.value().backend, "ucx");
  EXPECT_EQ(forced.value().reason, "set by agent rank 1");

  auto same = agreeBackend({rdma("tcp"), rdma(), rdma("tcp")});
  ASSERT_TRUE(same.isOk());
  EXPECT_EQ(same.value().backend, "tcp");

  auto clash = agreeBackend({rdma("tcp"), rdma(), rdma("ucx")});
  ASSERT_FALSE(clash.isOk());
  EXPECT_EQ(clash.status().code(), Code::kInvalidArgument);
  EXPECT_NE(clash.status().message().find("agent rank 0 is set to tcp, agent rank 2 to ucx"),
            std::string::npos)
      << clash.status().message();
  EXPECT_FALSE(agreeBackend({}).isOk());
}

TEST(BackendChoice, TheNodeOffersUcxOnlyWithUcxBuiltInAndAnRdmaDevice) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kolo-rdma-" + std::to_string(getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(localBackendOffer("auto", true, dir.string()).offer, "tcp");  // no such directory
  fs::create_directories(dir);
  BackendOffer empty = localBackendOffer("auto", true, dir.string());
  EXPECT_EQ(empty.offer, "tcp");
  EXPECT_EQ(empty.reason, "no RDMA device");
  fs::create_directories(dir / "rxe0");
  fs::create_directories(dir / "mlx5_1");
  BackendOffer dev = localBackendOffer("tcp", true, dir.string());
  EXPECT_EQ(dev.setting, "tcp");
  EXPECT_EQ(dev.offer, "ucx");
  EXPECT_EQ(dev.reason, "RDMA device mlx5_1");
  BackendOffer no_ucx = localBackendOffer("auto", false, dir.string());
  EXPECT_EQ(no_ucx.offer, "tcp");
  EXPECT_EQ(no_ucx.reason, "built without UCX");
  fs::remove_all(dir);
}

TEST(BackendChoice, OffersRoundTripAndMalformedLinesAreRefused) {
  BackendOffer o{"auto", "ucx", "RDMA device mlx5_0"};
  auto back = decodeBackendOffer(encodeBackendOffer(o));
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value().setting, "auto");
  EXPECT_EQ(back.value().offer, "ucx");
  EXPECT_EQ(back.value().reason, "RDMA device mlx5_0");
  for (const char* bad : {"", "kolo-backend1", "kolo-backend1 auto", "kolo-backend1 nccl tcp x",
                          "kolo-backend1 auto gloo x", "kolo-backend2 auto tcp x"}) {
    auto st = decodeBackendOffer(bad);
    EXPECT_FALSE(st.isOk()) << bad;
    if (!st.isOk())
      EXPECT_NE(st.status().message().find("malformed backend offer"), std::string::npos);
  }
  EXPECT_TRUE(isBackendSetting("auto") && isBackendSetting("ucx") && isBackendSetting("tcp"));
  EXPECT_FALSE(isBackendSetting("nccl") || isBackendSetting("") || isBackendSetting("TCP"));
}

TEST(BackendChoice, AgentsAgreeOverTheStoreAndAMissingAgentIsNamedWithinTheTimeout) {
  InMemoryKvStore kv;
  std::vector<BackendOffer> mine = {rdma(), plain(), rdma()};
  std::vector<std::future<StatusOr<BackendChoice>>> f;
  for (int r = 0; r < 3; ++r) {
    f.push_back(std::async(std::launch::async, [&kv, &mine, r] {
      return agreeBackendOverKv(kv, "g1/backend-offer", r, 3, mine[r], milliseconds(5000));
    }));
  }
  for (auto& x : f) {
    auto c = x.get();
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_EQ(c.value().backend, "tcp");
    EXPECT_EQ(c.value().reason, "auto: agent rank 1 offers tcp (no RDMA device)");
  }

  InMemoryKvStore lonely;
  auto t0 = std::chrono::steady_clock::now();
  auto c = agreeBackendOverKv(lonely, "g1/backend-offer", 0, 2, rdma(), milliseconds(200));
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), Code::kPeerFailure);
  EXPECT_NE(
      c.status().message().find("agent rank 1 unreachable: no backend offer from it within 200 ms"),
      std::string::npos)
      << c.status().message();
  EXPECT_LT(took, milliseconds(2000));
  EXPECT_FALSE(agreeBackendOverKv(lonely, "p", 2, 2, rdma(), milliseconds(10)).isOk());
}

}  // namespace
}  // namespace kolo
