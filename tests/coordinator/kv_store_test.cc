#include "coordinator/kv_store.h"

#include <gtest/gtest.h>

namespace kolo::coordinator {
namespace {

TEST(KvStore, PutGetScopedByJob) {
  KvStore kv;
  kv.put("j1", "k", "v1");
  kv.put("j2", "k", "v2");
  EXPECT_EQ(kv.get("j1", "k").value(), "v1");
  EXPECT_EQ(kv.get("j2", "k").value(), "v2");
  EXPECT_FALSE(kv.get("j1", "other").has_value());
  kv.eraseJob("j1");
  EXPECT_FALSE(kv.get("j1", "k").has_value());
  EXPECT_EQ(kv.get("j2", "k").value(), "v2");
  EXPECT_EQ(kv.keyCount("j2"), 1u);
}

TEST(KvStore, WaitersRunOnceOnPutOrExpiry) {
  KvStore kv;
  std::vector<std::optional<std::string>> got;
  auto record = [&](std::optional<std::string> v) { got.push_back(std::move(v)); };
  auto w1 = kv.addWaiter("j", "k", record);
  kv.addWaiter("j", "k", record);
  auto w3 = kv.addWaiter("j", "other", record);
  EXPECT_EQ(kv.waiterCount(), 3u);
  kv.put("j", "k", "value");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].value(), "value");
  EXPECT_EQ(got[1].value(), "value");
  kv.expireWaiter(w1);  // already ran: no-op
  EXPECT_EQ(got.size(), 2u);
  kv.expireWaiter(w3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[2].has_value());
  EXPECT_EQ(kv.waiterCount(), 0u);
}

TEST(KvStore, EraseJobAndShutdownReleaseWaiters) {
  KvStore kv;
  int released = 0;
  kv.addWaiter("j1", "k", [&](std::optional<std::string> v) { released += !v.has_value(); });
  kv.addWaiter("j2", "k", [&](std::optional<std::string> v) { released += !v.has_value(); });
  kv.eraseJob("j1");
  EXPECT_EQ(released, 1);
  kv.failAllWaiters();
  EXPECT_EQ(released, 2);
  EXPECT_EQ(kv.waiterCount(), 0u);
}

}  // namespace
}  // namespace kolo::coordinator
