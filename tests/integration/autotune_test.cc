// Autotune across agents: the leader agent tunes the fusion threshold and the
// switch point while a training-shaped job runs; every agent applies the
// leader's values at the same cycle, so results stay bit-exact throughout.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check"; }

std::vector<std::string> readLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

TEST(Autotune, LeaderTunesAcrossAgentsAndResultsStayExact) {
  ClusterOptions o;
  o.agents = 2;
  o.agent_env = {{"KOLO_AUTOTUNE", "1"},
                 {"KOLO_AUTOTUNE_WARMUP_SAMPLES", "1"},
                 {"KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "2"},
                 {"KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "5"}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchMultiJob("tuned", {1, 1}, {checkBin(), "steps", "40"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << c.agentLog(0) << c.agentLog(1);
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << c.agentLog(0) << c.agentLog(1);
    EXPECT_NE(r.output().find("OK 40 steps"), std::string::npos) << r.output();
  }
  // Exactly one agent (the leader) tuned, and it finished its search.
  std::string logs[2] = {c.agentLog(0), c.agentLog(1)};
  int tuners = 0, done = 0;
  for (const std::string& l : logs) {
    tuners += l.find("autotune on") != std::string::npos;
    done += l.find("autotune done") != std::string::npos;
  }
  EXPECT_EQ(tuners, 1) << logs[0] << logs[1];
  EXPECT_EQ(done, 1) << logs[0] << logs[1];
  // It tried more than one fusion threshold.
  const std::string& leader = logs[0].find("autotune on") != std::string::npos ? logs[0] : logs[1];
  std::set<std::string> thresholds;
  std::istringstream in(leader);
  for (std::string line; std::getline(in, line);) {
    const std::string key = "autotune sample: fusion threshold ";
    auto p = line.find(key);
    if (p == std::string::npos) continue;
    p += key.size();
    thresholds.insert(line.substr(p, line.find(' ', p) - p));
  }
  EXPECT_GE(thresholds.size(), 2u) << leader;
}

// A fused buffer larger than fusion-chunk-mb goes across agents as several
// collectives (packing one chunk while the previous moves); tensors that
// straddle a chunk boundary must come back exact. ~1.4 MB fused per step
// with 1 MiB chunks; also with chunking off.
TEST(FusionAcrossAgents, ChunkedFusedBuffersStayExact) {
  for (const char* chunk_mb : {"1", "0"}) {
    ClusterOptions o;
    o.agents = 2;
    o.agent_env = {{"KOLO_FUSION_CHUNK_MB", chunk_mb}};
    Cluster c(o);
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob(std::string("chunked") + chunk_mb, {2, 1}, {checkBin(), "steps", "15"});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << c.agentLog(0) << c.agentLog(1);
    for (auto& r : ranks) {
      EXPECT_EQ(r.exit_code, 0) << "fusion-chunk-mb " << chunk_mb << "\n" << r.output() << c.agentLog(0);
      EXPECT_NE(r.output().find("OK 15 steps"), std::string::npos) << r.output();
    }
  }
}

TEST(Autotune, CsvLogHasEverySampleAndTheBest) {
  std::string dir = std::filesystem::temp_directory_path() / ("kolo-tune-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ClusterOptions o;
  o.agents = 2;
  o.agent_env = {{"KOLO_AUTOTUNE", "true"},
                 {"HOROVOD_AUTOTUNE_LOG", dir + "/tune-%j-%a.csv"},
                 {"KOLO_AUTOTUNE_WARMUP_SAMPLES", "0"},
                 {"KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "1"},
                 {"KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "3"}};
  std::vector<std::string> files;
  std::vector<std::string> lines;
  {
    Cluster c(o);
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob("csvjob", {1, 1}, {checkBin(), "steps", "20"});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << c.agentLog(0) << c.agentLog(1);
    for (auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.output();
    for (auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
    if (files.size() == 1) lines = readLines(files[0]);
  }
  std::filesystem::remove_all(dir);
  ASSERT_EQ(files.size(), 1u) << "only the leader writes the log";
  EXPECT_NE(files[0].find("tune-csvjob-"), std::string::npos) << files[0];
  // Header, 3 scored samples, then the best repeated.
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "fusion_threshold_mb,cycle_time_ms,switch_point_bytes,score_bytes_per_s");
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(std::count(lines[i].begin(), lines[i].end(), ','), 3) << lines[i];
    EXPECT_GT(std::stod(lines[i].substr(lines[i].rfind(',') + 1)), 0.0) << lines[i];
  }
  bool best_is_a_sample = false;
  for (size_t i = 1; i + 1 < lines.size(); ++i) best_is_a_sample |= lines[i] == lines.back();
  EXPECT_TRUE(best_is_a_sample) << lines.back();
}

}  // namespace
}  // namespace kolo::testing
