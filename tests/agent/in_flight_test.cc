// InFlight (agent/core/in_flight.h): a token counts its op once, whichever
// copy ends it, and a dropped token uncounts it.
#include "agent/core/in_flight.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "agent/core/job.h"

namespace kolo {
namespace {

TEST(InFlight, EndUncountsOnceWhateverCopyEndsIt) {
  InFlightCount n;
  InFlight a = n.begin();
  InFlight b = n.begin();
  EXPECT_EQ(n.value(), 2);
  InFlight a2 = a;  // a copy shares the claim
  EXPECT_EQ(n.value(), 2);
  a2.end();
  EXPECT_EQ(n.value(), 1);
  EXPECT_FALSE(a.counting());
  a.end();  // already ended through its copy
  EXPECT_EQ(n.value(), 1);
  EXPECT_TRUE(b.counting());
  b.end();
  b.end();
  EXPECT_EQ(n.value(), 0);
}

TEST(InFlight, DroppedTokenUncounts) {
  InFlightCount n;
  {
    std::function<void()> task = [t = n.begin()] { (void)t; };
    std::function<void()> copy = task;
    EXPECT_EQ(n.value(), 1);
  }
  EXPECT_EQ(n.value(), 0);
}

TEST(InFlight, MovesWithItsState) {
  InFlightCount n;
  InFlight a = n.begin();
  InFlight b = std::move(a);
  EXPECT_EQ(n.value(), 1);
  a.end();  // moved from: counts nothing
  EXPECT_EQ(n.value(), 1);
  InFlight c;
  c = std::move(b);
  EXPECT_EQ(n.value(), 1);
  c = InFlight();  // overwritten: the old claim ends
  EXPECT_EQ(n.value(), 0);
}

TEST(InFlight, TokenMayOutliveItsCountOwner) {
  InFlight t;
  {
    InFlightCount n;
    t = n.begin();
  }
  t.end();  // the count is shared with the token: nothing dangles
  EXPECT_FALSE(t.counting());
}

TEST(InFlight, LastCopyMayDieOnAnotherThread) {
  InFlightCount n;
  InFlight t = n.begin();
  std::thread th([t2 = std::move(t)]() mutable { t2 = InFlight(); });
  th.join();
  EXPECT_EQ(n.value(), 0);
}

TEST(InFlight, JobCountsCrossPendingTokens) {
  Job job("j", "tok", 2, 2);
  EXPECT_EQ(job.executing(), 0);
  Job::CrossPending p;
  p.in_flight = job.beginExecuting();
  job.cross_pending.insert_or_assign("x", std::move(p));
  EXPECT_EQ(job.executing(), 1);
  auto moved = std::move(job.cross_pending.at("x"));
  job.cross_pending.erase("x");
  EXPECT_EQ(job.executing(), 1);  // the token moved with the op's state
  moved.in_flight.end();
  EXPECT_EQ(job.executing(), 0);
}

}  // namespace
}  // namespace kolo
