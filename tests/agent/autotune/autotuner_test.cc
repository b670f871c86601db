#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "agent/autotune/autotuner.h"
#include "agent/autotune/bayes_opt.h"
#include "agent/autotune/gaussian_process.h"

namespace kolo::autotune {
namespace {

namespace fs = std::filesystem;

// Synthetic throughput (bytes/s) with a known optimum near 24 MB, 0.8 ms,
// 128 KiB; smooth, with a floor, like a real system's curve.
double trueScore(const TunedParams& p) {
  double f = std::log2(p.fusion_threshold_mb + 1.0) - std::log2(25.0);
  double c = p.cycle_time_ms - 0.8;
  double s = std::log2(static_cast<double>(p.switch_point_bytes)) - 17.0;
  double g = std::exp(-f * f / (2 * 2.0 * 2.0)) * std::exp(-c * c / (2 * 1.5 * 1.5)) *
             std::exp(-s * s / (2 * 3.0 * 3.0));
  return 1e9 * (0.4 + 0.6 * g);
}

double bestGridScore() {
  double best = 0;
  for (double mb : {0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0}) {
    for (double ms = 0; ms <= 5.0; ms += 0.5) {
      for (uint64_t sw = 4096; sw <= 4u << 20; sw *= 4) best = std::max(best, trueScore({mb, ms, sw}));
    }
  }
  return best;
}

// Drives a tuner to completion with 5% multiplicative noise on every step.
std::unique_ptr<Autotuner> runTuner(AutotuneOptions o, uint64_t noise_seed, int* changes) {
  auto t = Autotuner::create(std::move(o));
  EXPECT_TRUE(t.isOk()) << t.status().toString();
  if (!t.isOk()) return nullptr;
  std::unique_ptr<Autotuner> tuner = std::move(t).value();
  std::mt19937_64 rng(noise_seed);
  std::normal_distribution<double> noise(0.0, 0.05);
  *changes = 0;
  for (int step = 0; step < 100000 && !tuner->done(); ++step) {
    const double seconds = 0.01;
    double score = trueScore(tuner->params()) * std::max(0.0, 1.0 + noise(rng));
    if (tuner->report(static_cast<uint64_t>(score * seconds), seconds)) ++(*changes);
  }
  EXPECT_TRUE(tuner->done());
  return tuner;
}

TEST(GaussianProcess, InterpolatesSmoothDataAndIsUnsureFarAway) {
  std::vector<Point> x;
  std::vector<double> y;
  for (int i = 0; i <= 8; ++i) {
    double v = i / 8.0;
    x.push_back({v});
    y.push_back(std::sin(3 * v));
  }
  GaussianProcess gp(0.05);
  ASSERT_TRUE(gp.fit(x, y).isOk());
  double mu, sd;
  gp.predict({0.3}, &mu, &sd);
  EXPECT_NEAR(mu, std::sin(0.9), 0.05);
  double far_mu, far_sd;
  gp.predict({3.0}, &far_mu, &far_sd);
  EXPECT_GT(far_sd, sd * 3);
  EXPECT_FALSE(gp.fit({}, {}).isOk());
  EXPECT_FALSE(gp.fit({{0.0}, {1.0, 2.0}}, {1, 2}).isOk());
}

TEST(BayesianOptimizer, FindsTheMaximumOfAOneDimensionalFunction) {
  BayesianOptimizer bo({{0.0, 1.0}});
  auto f = [](double v) { return -(v - 0.73) * (v - 0.73); };
  for (double v : {0.1, 0.5, 0.9}) bo.addSample({v}, f(v));
  Point p;
  for (int i = 0; i < 12; ++i) {
    p = bo.nextSample();
    ASSERT_EQ(p.size(), 1u);
    ASSERT_GE(p[0], 0.0);
    ASSERT_LE(p[0], 1.0);
    bo.addSample(p, f(p[0]));
  }
  EXPECT_NEAR(p[0], 0.73, 0.1);
}

TEST(Autotuner, EncodeDecodeRoundTripsOnTheLogScales) {
  auto t = Autotuner::create({});
  ASSERT_TRUE(t.isOk());
  Autotuner& tuner = **t;
  for (const TunedParams& p : {TunedParams{0.0, 0.0, 4096}, TunedParams{256.0, 5.0, 4u << 20},
                               TunedParams{24.0, 1.25, 131072}}) {
    TunedParams q = tuner.decode(tuner.encode(p));
    EXPECT_NEAR(q.fusion_threshold_mb, p.fusion_threshold_mb, 1e-6);
    EXPECT_NEAR(q.cycle_time_ms, p.cycle_time_ms, 1e-9);
    EXPECT_EQ(q.switch_point_bytes, p.switch_point_bytes);
  }
  Point mid = tuner.encode({15.03, 2.5, 65536});
  EXPECT_NEAR(mid[0], 0.5, 0.01);  // log scale: 0.5 is ~15 MB, not 128
  EXPECT_NEAR(mid[1], 0.5, 1e-9);
  EXPECT_NEAR(mid[2], 0.4, 1e-9);
  EXPECT_EQ(tuner.params(), TunedParams{});  // starts from the configured values
  EXPECT_EQ(TunedParams{}.fusionThresholdBytes(), 128ull << 20);
}

TEST(Autotuner, WarmupIsDiscardedAndStepsMakeSamples) {
  AutotuneOptions o;
  o.warmup_samples = 2;
  o.steps_per_sample = 4;
  o.max_samples = 3;
  auto t = Autotuner::create(o);
  ASSERT_TRUE(t.isOk());
  Autotuner& tuner = **t;
  const TunedParams first = tuner.params();
  for (int i = 0; i < 2 * 4; ++i) EXPECT_FALSE(tuner.report(1000, 0.001));
  EXPECT_EQ(tuner.warmupRemaining(), 0);
  EXPECT_TRUE(tuner.samples().empty());
  EXPECT_EQ(tuner.params(), first);
  EXPECT_FALSE(tuner.report(1000, 0.0)) << "no time: ignored";
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(tuner.report(1000, 0.001));
  // The median of the four steps: 1e6, 1e6, 1e6, 3e6 -> 1e6.
  EXPECT_TRUE(tuner.report(3000, 0.001)) << "a sample moves to the next point";
  ASSERT_EQ(tuner.samples().size(), 1u);
  EXPECT_DOUBLE_EQ(tuner.samples()[0].score, 1e6);
  EXPECT_EQ(tuner.samples()[0].params, first);
  EXPECT_NE(tuner.params(), first);
}

TEST(Autotuner, ConvergesNearTheBestGridSettingAndIsDeterministic) {
  const double grid_best = bestGridScore();
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    AutotuneOptions o;
    o.seed = seed;
    int changes = 0;
    auto tuner = runTuner(o, /*noise_seed=*/seed * 77, &changes);
    ASSERT_NE(tuner, nullptr);
    EXPECT_EQ(tuner->samples().size(), 20u);
    EXPECT_EQ(tuner->params(), tuner->best().params);
    EXPECT_GE(changes, 10);
    double chosen = trueScore(tuner->params());
    EXPECT_GE(chosen, 0.9 * grid_best)
        << "seed " << seed << ": chose " << tuner->params().fusion_threshold_mb << " MB, "
        << tuner->params().cycle_time_ms << " ms, " << tuner->params().switch_point_bytes
        << " B; grid best " << grid_best;
    // Once done, nothing changes any more.
    EXPECT_FALSE(tuner->report(1, 1.0));

    int changes2 = 0;
    auto again = runTuner(o, seed * 77, &changes2);
    ASSERT_NE(again, nullptr);
    ASSERT_EQ(again->samples().size(), tuner->samples().size());
    for (size_t i = 0; i < tuner->samples().size(); ++i) {
      EXPECT_EQ(again->samples()[i].params, tuner->samples()[i].params) << "sample " << i;
    }
    EXPECT_EQ(again->params(), tuner->params());
  }
}

TEST(Autotuner, FixedDimensionsAreNotTuned) {
  AutotuneOptions o;
  o.fixed_cycle_time_ms = 0.3;
  o.fixed_switch_point_bytes = 65536;
  o.max_samples = 8;
  o.warmup_samples = 0;
  o.steps_per_sample = 1;
  int changes = 0;
  auto tuner = runTuner(o, 9, &changes);
  ASSERT_NE(tuner, nullptr);
  std::set<double> fusion_values;
  for (const auto& s : tuner->samples()) {
    EXPECT_DOUBLE_EQ(s.params.cycle_time_ms, 0.3);
    EXPECT_EQ(s.params.switch_point_bytes, 65536u);
    fusion_values.insert(s.params.fusion_threshold_mb);
  }
  EXPECT_GT(fusion_values.size(), 4u);
}

TEST(Autotuner, CsvLogHasHeaderOneRowPerSampleAndBestLast) {
  std::string path = (fs::temp_directory_path() /
                      ("kolo-autotune-" + std::to_string(::getpid()) + ".csv"))
                         .string();
  struct Cleanup {
    std::string p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove(p, ec);
    }
  } cleanup{path};
  AutotuneOptions o;
  o.log_file = path;
  o.max_samples = 6;
  o.steps_per_sample = 3;
  int changes = 0;
  auto tuner = runTuner(o, 5, &changes);
  ASSERT_NE(tuner, nullptr);

  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 1u + 6u + 1u);
  EXPECT_EQ(lines[0], Autotuner::kCsvHeader);
  std::stringstream last(lines.back());
  double mb, ms, score;
  uint64_t sw;
  char comma;
  last >> mb >> comma >> ms >> comma >> sw >> comma >> score;
  EXPECT_NEAR(mb, tuner->best().params.fusion_threshold_mb, 1e-3 * (1 + mb));
  EXPECT_NEAR(ms, tuner->best().params.cycle_time_ms, 1e-3);
  EXPECT_EQ(sw, tuner->best().params.switch_point_bytes);
  EXPECT_NEAR(score, tuner->best().score, 1e-3 * score);

  AutotuneOptions bad;
  bad.log_file = "/nonexistent-dir/x.csv";
  EXPECT_FALSE(Autotuner::create(bad).isOk());
  bad.log_file.clear();
  bad.steps_per_sample = 0;
  EXPECT_FALSE(Autotuner::create(bad).isOk());
}

}  // namespace
}  // namespace kolo::autotune
