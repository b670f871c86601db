// The metrics registry: exposition format (golden text), escaping, handle
// identity, misuse, and concurrent updates.
#include "common/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace kolo::metrics {
namespace {

TEST(MetricsFormat, GoldenCounterGaugeHistogram) {
  Registry reg;
  Counter& c = reg.counter("kolo_test_requests_total", "Requests handled.");
  c.inc();
  c.inc(41);
  Gauge& g = reg.gauge("kolo_test_temperature", "Temperature with \\ and\nnewline.",
                       {{"zone", "a\"b\\c\nd"}, {"host", "n1"}});
  g.set(-2.5);
  Histogram& h = reg.histogram("kolo_test_latency_seconds", "Latency.", {{"op", "allreduce"}},
                               {0.001, 0.25, 0.5, 1});
  h.observe(0.0009765625);  // <= 0.001 (2^-10: every sum below is exact)
  h.observe(0.25);          // <= 0.25 (inclusive bound)
  h.observe(0.75);          // <= 1
  h.observe(3);             // +Inf

  const std::string expected =
      "# HELP kolo_test_latency_seconds Latency.\n"
      "# TYPE kolo_test_latency_seconds histogram\n"
      "kolo_test_latency_seconds_bucket{op=\"allreduce\",le=\"0.001\"} 1\n"
      "kolo_test_latency_seconds_bucket{op=\"allreduce\",le=\"0.25\"} 2\n"
      "kolo_test_latency_seconds_bucket{op=\"allreduce\",le=\"0.5\"} 2\n"
      "kolo_test_latency_seconds_bucket{op=\"allreduce\",le=\"1\"} 3\n"
      "kolo_test_latency_seconds_bucket{op=\"allreduce\",le=\"+Inf\"} 4\n"
      "kolo_test_latency_seconds_sum{op=\"allreduce\"} 4.0009765625\n"
      "kolo_test_latency_seconds_count{op=\"allreduce\"} 4\n"
      "# HELP kolo_test_requests_total Requests handled.\n"
      "# TYPE kolo_test_requests_total counter\n"
      "kolo_test_requests_total 42\n"
      "# HELP kolo_test_temperature Temperature with \\\\ and\\nnewline.\n"
      "# TYPE kolo_test_temperature gauge\n"
      "kolo_test_temperature{host=\"n1\",zone=\"a\\\"b\\\\c\\nd\"} -2.5\n";
  EXPECT_EQ(reg.render(), expected);
}

TEST(MetricsFormat, EmptyRegistryRendersNothing) {
  Registry reg;
  EXPECT_EQ(reg.render(), "");
}

TEST(MetricsFormat, FamilyWithoutObservationsAndSeveralSeries) {
  Registry reg;
  reg.counter("kolo_collectives_total", "Collectives.", {{"op", "allreduce"}, {"status", "ok"}})
      .inc(3);
  reg.counter("kolo_collectives_total", "Collectives.", {{"op", "broadcast"}, {"status", "ok"}})
      .inc(1);
  reg.histogram("kolo_negotiation_seconds", "Negotiation.", {}, {0.5});
  EXPECT_EQ(reg.render(),
            "# HELP kolo_collectives_total Collectives.\n"
            "# TYPE kolo_collectives_total counter\n"
            "kolo_collectives_total{op=\"allreduce\",status=\"ok\"} 3\n"
            "kolo_collectives_total{op=\"broadcast\",status=\"ok\"} 1\n"
            "# HELP kolo_negotiation_seconds Negotiation.\n"
            "# TYPE kolo_negotiation_seconds histogram\n"
            "kolo_negotiation_seconds_bucket{le=\"0.5\"} 0\n"
            "kolo_negotiation_seconds_bucket{le=\"+Inf\"} 0\n"
            "kolo_negotiation_seconds_sum 0\n"
            "kolo_negotiation_seconds_count 0\n");
}

TEST(MetricsFormat, Values) {
  EXPECT_EQ(formatValue(0), "0");
  EXPECT_EQ(formatValue(42), "42");
  EXPECT_EQ(formatValue(-7), "-7");
  EXPECT_EQ(formatValue(0.25), "0.25");
  EXPECT_EQ(formatValue(0.00005), "5e-05");
  EXPECT_EQ(formatValue(1e300), "1e+300");
  EXPECT_EQ(formatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(formatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(formatValue(std::nan("")), "NaN");
  // Round trip of an awkward fraction.
  EXPECT_EQ(std::stod(formatValue(0.1 + 0.2)), 0.1 + 0.2);
}

TEST(MetricsFormat, NamesAndEscaping) {
  EXPECT_TRUE(isValidMetricName("kolo_collectives_total"));
  EXPECT_TRUE(isValidMetricName("job:kolo_bytes:rate5m"));
  EXPECT_FALSE(isValidMetricName(""));
  EXPECT_FALSE(isValidMetricName("1abc"));
  EXPECT_FALSE(isValidMetricName("kolo-bytes"));
  EXPECT_TRUE(isValidLabelName("dtype"));
  EXPECT_FALSE(isValidLabelName("__name__"));
  EXPECT_FALSE(isValidLabelName("a:b"));
  EXPECT_EQ(escapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(escapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

TEST(MetricsRegistry, SameSeriesSameHandleWhateverTheLabelOrder) {
  Registry reg;
  Counter& a = reg.counter("kolo_collective_bytes_total", "Bytes.",
                           {{"op", "allreduce"}, {"dtype", "float32"}});
  Counter& b = reg.counter("kolo_collective_bytes_total", "Bytes.",
                           {{"dtype", "float32"}, {"op", "allreduce"}});
  Counter& other = reg.counter("kolo_collective_bytes_total", "Bytes.",
                               {{"dtype", "float16"}, {"op", "allreduce"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
  a.inc(10);
  b.inc(5);
  EXPECT_EQ(a.value(), 15u);
  EXPECT_NE(reg.render().find(
                "kolo_collective_bytes_total{dtype=\"float32\",op=\"allreduce\"} 15\n"),
            std::string::npos);
}

TEST(MetricsRegistry, MisuseGivesAWorkingHandleThatIsNotExported) {
  Registry reg;
  reg.counter("kolo_jobs", "Jobs.").inc();
  Gauge& wrong_type = reg.gauge("kolo_jobs", "Jobs as a gauge.");
  wrong_type.set(5);  // works, not rendered
  Counter& bad_name = reg.counter("kolo-bad", "Bad.");
  bad_name.inc();
  Counter& bad_label = reg.counter("kolo_ok_total", "Ok.", {{"__reserved", "x"}});
  bad_label.inc();
  Counter& dup_label = reg.counter("kolo_ok2_total", "Ok.", {{"a", "x"}, {"a", "y"}});
  dup_label.inc();
  Histogram& le_label = reg.histogram("kolo_h_seconds", "H.", {{"le", "1"}}, {1});
  le_label.observe(1);
  Histogram& bad_bounds = reg.histogram("kolo_h2_seconds", "H.", {}, {1, 0.5});
  bad_bounds.observe(1);
  reg.histogram("kolo_h3_seconds", "H.", {}, {1, 2});
  Histogram& other_bounds = reg.histogram("kolo_h3_seconds", "H.", {{"x", "y"}}, {1, 3});
  other_bounds.observe(2);
  EXPECT_EQ(other_bounds.snapshot().count(), 1u);

  std::string text = reg.render();
  EXPECT_NE(text.find("# TYPE kolo_jobs counter\nkolo_jobs 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("kolo-bad"), std::string::npos);
  EXPECT_EQ(text.find("kolo_ok_total"), std::string::npos);
  EXPECT_EQ(text.find("kolo_ok2_total"), std::string::npos);
  EXPECT_EQ(text.find("kolo_h_seconds"), std::string::npos);
  EXPECT_EQ(text.find("kolo_h2_seconds"), std::string::npos);
  EXPECT_EQ(text.find("x=\"y\""), std::string::npos);
}

TEST(MetricsHistogram, BucketsAndSnapshot) {
  Histogram h({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 100.0}) h.observe(v);
  h.observe(std::nan(""));  // counted in +Inf
  auto s = h.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 4, 6, 8}));
  EXPECT_EQ(s.count(), 8u);
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(MetricsHistogram, BucketHelpers) {
  EXPECT_EQ(exponentialBuckets(0.25, 2, 4), (std::vector<double>{0.25, 0.5, 1, 2}));
  EXPECT_EQ(linearBuckets(1, 2, 3), (std::vector<double>{1, 3, 5}));
  EXPECT_TRUE(exponentialBuckets(0, 2, 3).empty());
  const auto& d = defaultLatencyBuckets();
  ASSERT_FALSE(d.empty());
  for (size_t i = 1; i < d.size(); ++i) EXPECT_LT(d[i - 1], d[i]);
  // Empty bounds in histogram(): the default latency buckets.
  Registry reg;
  EXPECT_EQ(reg.histogram("kolo_collective_latency_seconds", "L.").bounds(), d);
}

TEST(MetricsConcurrency, ManyThreadsUpdateAndRegisterWhileScraping) {
  Registry reg;
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  Counter& shared = reg.counter("kolo_collectives_total", "C.", {{"op", "allreduce"}});
  Gauge& gauge = reg.gauge("kolo_clients", "G.");
  Histogram& hist = reg.histogram("kolo_collective_latency_seconds", "H.", {}, {0.5, 1.5});

  std::atomic<bool> writers_done{false};
  std::thread scraper([&] {
    // Every rendering while writers run must stay well formed: the +Inf
    // bucket equals _count.
    while (!writers_done.load()) {
      std::string text = reg.render();
      auto inf = text.find("le=\"+Inf\"} ");
      auto cnt = text.find("kolo_collective_latency_seconds_count ");
      ASSERT_NE(inf, std::string::npos);
      ASSERT_NE(cnt, std::string::npos);
      uint64_t a = std::stoull(text.substr(inf + 11));
      uint64_t b = std::stoull(text.substr(cnt + 38));
      ASSERT_EQ(a, b);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      // Each thread also registers (and finds) series concurrently.
      Counter& mine = reg.counter("kolo_errors_total", "E.", {{"kind", t % 2 ? "k1" : "k0"}});
      for (int i = 0; i < kIters; ++i) {
        shared.inc();
        mine.inc();
        gauge.inc();
        gauge.dec(0.5);
        hist.observe((i % 2) ? 1.0 : 0.25);
      }
    });
  }
  for (auto& w : writers) w.join();
  writers_done = true;
  scraper.join();

  EXPECT_EQ(shared.value(), uint64_t{kThreads} * kIters);
  EXPECT_EQ(reg.counter("kolo_errors_total", "E.", {{"kind", "k0"}}).value(),
            uint64_t{kThreads / 2} * kIters);
  EXPECT_EQ(reg.counter("kolo_errors_total", "E.", {{"kind", "k1"}}).value(),
            uint64_t{kThreads / 2} * kIters);
  EXPECT_DOUBLE_EQ(gauge.value(), 0.5 * kThreads * kIters);
  auto s = hist.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{uint64_t{kThreads} * kIters / 2,
                                                 uint64_t{kThreads} * kIters,
                                                 uint64_t{kThreads} * kIters}));
  EXPECT_DOUBLE_EQ(s.sum, kThreads * (kIters / 2) * (0.25 + 1.0));
}

}  // namespace
}  // namespace kolo::metrics
