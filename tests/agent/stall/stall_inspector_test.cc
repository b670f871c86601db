#include <gtest/gtest.h>

#include "agent/stall/stall_inspector.h"

namespace kolo::stall {
namespace {

using namespace std::chrono_literals;

TimePoint t0() { return TimePoint{} + 1000s; }

TEST(StallInspector, ReportsOncePerWarningPeriodWithMissingRanks) {
  StallInspector si;  // 60 s warning, no shutdown
  si.setJobSize("job1", 4);
  si.recordSubmit("job1", "grad/a", 0, t0());
  si.recordSubmit("job1", "grad/a", 2, t0() + 5s);
  si.recordSubmit("job1", "grad/a", 2, t0() + 9s);  // repeat keeps the first time
  EXPECT_EQ(si.pendingCount("job1"), 1u);

  EXPECT_TRUE(si.check(t0() + 59s).empty());

  StallReport r = si.check(t0() + 61s);
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_TRUE(r.shutdown.empty());
  const JobStalls& js = r.jobs[0];
  EXPECT_EQ(js.job_id, "job1");
  EXPECT_FALSE(js.must_shut_down);
  ASSERT_EQ(js.tensors.size(), 1u);
  const PendingTensor& t = js.tensors[0];
  EXPECT_EQ(t.name, "grad/a");
  EXPECT_EQ(t.missing, (std::vector<int>{1, 3}));
  ASSERT_EQ(t.submitted.size(), 2u);
  EXPECT_EQ(t.submitted[0].rank, 0);
  EXPECT_EQ(t.submitted[0].waited, 61s);
  EXPECT_EQ(t.submitted[1].rank, 2);
  EXPECT_EQ(t.submitted[1].waited, 56s);
  EXPECT_EQ(t.age, 61s);
  EXPECT_NE(r.text.find("job1"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("grad/a"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("Missing ranks"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("1: [grad/a]"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("3: [grad/a]"), std::string::npos) << r.text;

  // Within the same warning period: quiet.
  EXPECT_TRUE(si.check(t0() + 62s).empty());
  EXPECT_TRUE(si.check(t0() + 120s).empty());
  // One period after the report: reported again.
  r = si.check(t0() + 121s);
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0].tensors[0].age, 121s);
}

TEST(StallInspector, DoneNamesAreForgotten) {
  StallInspector si;
  si.setJobSize("j", 2);
  si.recordSubmit("j", "x", 0, t0());
  si.recordDone("j", "x");
  EXPECT_EQ(si.pendingCount("j"), 0u);
  EXPECT_TRUE(si.check(t0() + 1h).empty());
  // A later round of the same name starts a fresh clock.
  si.recordSubmit("j", "x", 1, t0() + 1h);
  EXPECT_TRUE(si.check(t0() + 1h + 30s).empty());
  EXPECT_EQ(si.check(t0() + 1h + 61s).jobs.size(), 1u);
}

TEST(StallInspector, ShutdownTimeNamesTheJobOnce) {
  StallOptions o;
  o.warning_time = 10s;
  o.shutdown_time = 30s;
  StallInspector si(o);
  si.setJobRanks("j", {4, 5, 6});
  si.setJobSize("other", 2);
  si.recordSubmit("j", "late", 4, t0());
  si.recordSubmit("j", "recent", 4, t0() + 25s);
  si.recordSubmit("j", "recent", 5, t0() + 25s);
  si.recordSubmit("other", "fine", 0, t0() + 25s);

  StallReport r = si.check(t0() + 25s);
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_TRUE(r.shutdown.empty());
  EXPECT_EQ(r.text.find('!'), std::string::npos) << r.text;

  r = si.check(t0() + 31s);
  EXPECT_EQ(r.shutdown, (std::vector<std::string>{"j"}));
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_TRUE(r.jobs[0].must_shut_down);
  // "late" was reported at 25 s, but the shutdown names everything stalled
  // (its text ends the job on every rank); "recent" is only 6 s old.
  ASSERT_EQ(r.jobs[0].tensors.size(), 1u);
  EXPECT_EQ(r.jobs[0].tensors[0].name, "late");
  EXPECT_NE(r.text.find("Missing ranks:"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("Shutting the job down"), std::string::npos) << r.text;

  r = si.check(t0() + 41s);
  EXPECT_TRUE(r.shutdown.empty()) << "a job is named for shutdown once";
  // Jobs are independent: "other" now has a stall of its own, below shutdown.
  ASSERT_EQ(r.jobs.size(), 2u);
  EXPECT_EQ(r.jobs[1].job_id, "other");
  EXPECT_FALSE(r.jobs[1].must_shut_down);
  EXPECT_EQ(r.jobs[1].tensors.size(), 1u);
  ASSERT_EQ(r.jobs[0].tensors.size(), 2u);
  EXPECT_EQ(r.jobs[0].tensors[0].name, "late");
  EXPECT_TRUE(r.jobs[0].tensors[0].past_shutdown);
  EXPECT_EQ(r.jobs[0].tensors[0].missing, (std::vector<int>{5, 6}));
  EXPECT_FALSE(r.jobs[0].tensors[1].past_shutdown);
  // Rank 5 misses only "late"; rank 6 misses both. Both are marked: each
  // misses a name that is past the shutdown time.
  EXPECT_NE(r.text.find("6!: [late, recent]"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("5!: [late]"), std::string::npos) << r.text;
}

TEST(StallInspector, MissingRanksNameTheirHostAndWhatToDo) {
  StallInspector si;  // 60 s
  si.setJobRanks("j", {0, 1}, "node-a");
  si.recordSubmit("j", "x", 0, t0());
  StallReport r = si.check(t0() + 61s);
  EXPECT_NE(r.text.find("1 (host node-a): [x]"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("py-spy dump --pid"), std::string::npos) << r.text;
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(StallInspector::formatJob(r.jobs[0], si.options()), r.text);
}

TEST(StallInspector, DisabledReportsNothingButStillTracks) {
  StallOptions o;
  o.disabled = true;
  o.shutdown_time = 1s;
  StallInspector si(o);
  si.setJobSize("j", 3);
  si.recordSubmit("j", "x", 1, t0());
  EXPECT_TRUE(si.check(t0() + 1h).empty());
  auto p = si.pending("j", t0() + 2s);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].missing, (std::vector<int>{0, 2}));
  EXPECT_EQ(p[0].age, 2s);
  EXPECT_TRUE(si.pending("nope", t0()).empty());
  si.removeJob("j");
  EXPECT_EQ(si.pendingCount("j"), 0u);
}

}  // namespace
}  // namespace kolo::stall
