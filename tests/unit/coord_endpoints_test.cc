// CoordEndpoints: the list of coordinator addresses, the leader hint of a
// standby, round robin and the bounded backoff (pure logic).
#include "common/coord_endpoints.h"

#include <gtest/gtest.h>

namespace kolo {
namespace {

using std::chrono::milliseconds;

TEST(CoordEndpoints, ParsesOneOrSeveralAddresses) {
  auto one = parseCoordinatorList("127.0.0.1:7470", "--coordinator");
  ASSERT_TRUE(one.isOk()) << one.status().message();
  EXPECT_EQ(one.value(), std::vector<std::string>{"127.0.0.1:7470"});
  auto three = parseCoordinatorList("a:1, b.example:2 ,[::1]:3", "--coordinator");
  ASSERT_TRUE(three.isOk()) << three.status().message();
  EXPECT_EQ(three.value(), (std::vector<std::string>{"a:1", "b.example:2", "[::1]:3"}));
}

TEST(CoordEndpoints, NamesTheBadEntry) {
  struct Case {
    const char* list;
    const char* says;
  };
  for (const Case& c :
       {Case{"a:1,b", "entry 2 (\"b\") is not host:port"},
        Case{"a:1,,b:2", "entry 2 (\"\") is empty"}, Case{"a:1,", "entry 2 (\"\") is empty"},
        Case{"a:0", "entry 1 (\"a:0\") has port 0, not 1..65535"},
        Case{"a:1,b:70000", "entry 2 (\"b:70000\") has port 70000"},
        Case{":5", "entry 1 (\":5\") has no host"},
        Case{"a:x", "entry 1 (\"a:x\") has no port number"},
        Case{"::1:5", "write an IPv6 address as [v6]:port"},
        Case{"a:1,a:1", "entry 2 (\"a:1\") is listed twice"}}) {
    auto r = parseCoordinatorList(c.list, "--coordinator");
    ASSERT_FALSE(r.isOk()) << c.list;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("--coordinator \"") + c.list + "\""),
              std::string::npos)
        << r.status().message();
  }
}

TEST(CoordEndpoints, ReadsTheLeaderHint) {
  EXPECT_EQ(leaderHint(
                "standby: this kolo-coordinator is not the leader; the leader is at 10.0.0.2:7470"),
            "10.0.0.2:7470");
  EXPECT_EQ(leaderHint("standby: the leader is at [fe80::1]:7470."), "[fe80::1]:7470");
  EXPECT_EQ(leaderHint("standby: the leader is at b:2 (elected 3 s ago)"), "b:2");
  EXPECT_EQ(leaderHint("standby: no leader elected yet"), std::nullopt);
  EXPECT_EQ(leaderHint("standby: the leader is at nowhere"), std::nullopt);
  EXPECT_TRUE(neverReachedLeader("standby: no leader"));
  EXPECT_TRUE(
      neverReachedLeader("failed to connect to all addresses; last error: Connection refused"));
  EXPECT_FALSE(neverReachedLeader("Socket closed"));
  EXPECT_FALSE(neverReachedLeader("could not persist: disk full"));
}

TEST(CoordEndpoints, RoundRobinWithoutAHint) {
  CoordEndpoints e({"a:1", "b:2", "c:3"});
  EXPECT_EQ(e.current(), "a:1");
  auto n = e.failed("a:1", "failed to connect to all addresses");
  EXPECT_EQ(n.address, "b:2");
  EXPECT_TRUE(n.switched);
  EXPECT_FALSE(n.hinted);
  EXPECT_EQ(e.current(), "b:2");
  EXPECT_EQ(e.failed("b:2", "Socket closed").address, "c:3");
  EXPECT_EQ(e.failed("c:3", "Connection refused").address, "a:1");
  EXPECT_EQ(e.joined(), "a:1, b:2, c:3");
}

TEST(CoordEndpoints, FollowsTheHintWhenListed) {
  CoordEndpoints e({"a:1", "b:2", "c:3"});
  auto n =
      e.failed("a:1", "standby: this kolo-coordinator is not the leader; the leader is at c:3");
  EXPECT_EQ(n.address, "c:3");
  EXPECT_TRUE(n.hinted);
  // A leader outside the list: round robin.
  n = e.failed("c:3", "standby: the leader is at d:4");
  EXPECT_EQ(n.address, "a:1");
  EXPECT_FALSE(n.hinted);
  // A hint naming the address that answered: round robin too.
  n = e.failed("a:1", "standby: the leader is at a:1");
  EXPECT_EQ(n.address, "b:2");
}

TEST(CoordEndpoints, AStaleFailureDoesNotMoveAgain) {
  CoordEndpoints e({"a:1", "b:2"});
  EXPECT_EQ(e.failed("a:1", "refused").address, "b:2");
  // Another thread's call to a:1 fails later: b:2 stays in use, no wait.
  auto n = e.failed("a:1", "refused");
  EXPECT_EQ(n.address, "b:2");
  EXPECT_EQ(n.wait, milliseconds(0));
  EXPECT_EQ(e.current(), "b:2");
}

TEST(CoordEndpoints, BackoffPerRoundIsBoundedAndResets) {
  CoordEndpoints e({"a:1", "b:2"}, CoordBackoff{milliseconds(50), milliseconds(300)});
  std::vector<milliseconds> waits;
  for (int i = 0; i < 12; ++i) waits.push_back(e.failed(e.current(), "refused").wait);
  // Nothing mid-round; 50, 100, 200, then 300 at most after each full round.
  std::vector<milliseconds> want = {milliseconds(0),   milliseconds(50),  milliseconds(0),
                                    milliseconds(100), milliseconds(0),   milliseconds(200),
                                    milliseconds(0),   milliseconds(300), milliseconds(0),
                                    milliseconds(300), milliseconds(0),   milliseconds(300)};
  EXPECT_EQ(waits, want);
  e.succeeded(e.current());
  EXPECT_EQ(e.failed(e.current(), "refused").wait, milliseconds(0));
  EXPECT_EQ(e.failed(e.current(), "refused").wait, milliseconds(50));
}

TEST(CoordEndpoints, OneAddressBacksOffEveryTry) {
  CoordEndpoints e({"a:1"});
  auto n = e.failed("a:1", "refused");
  EXPECT_EQ(n.address, "a:1");
  EXPECT_FALSE(n.switched);
  EXPECT_EQ(n.wait, milliseconds(50));
  EXPECT_EQ(e.failed("a:1", "refused").wait, milliseconds(100));
}

}  // namespace
}  // namespace kolo
