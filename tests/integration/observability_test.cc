// The timeline (Chrome trace JSON, valid even after a SIGKILL) and the
// stall inspector, through the real daemons.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check"; }

nlohmann::json readJson(const std::string& path, std::string* err) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    *err = std::string(e.what()) + "\nfile:\n" + ss.str().substr(0, 2000);
    return {};
  }
}

std::set<std::string> eventNames(const nlohmann::json& j) {
  std::set<std::string> names;
  const nlohmann::json& evs = j.is_array() ? j : j.value("traceEvents", nlohmann::json::array());
  for (const auto& e : evs) {
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  }
  return names;
}

TEST(Timeline, OneAgentWritesValidChromeTrace) {
  char dir[] = "/tmp/kolo-tl-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/trace.json";
  {
    Cluster c(1, {{"KOLO_TIMELINE_FILENAME", path}, {"KOLO_TIMELINE_DIR", dir}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchJob("tl", 2, {checkBin(), "loop", "20"});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
    for (auto& r : ranks) ASSERT_EQ(r.exit_code, 0) << r.output();
  }  // the agent stops (SIGTERM) and closes the trace
  std::string err;
  auto j = readJson(path, &err);
  ASSERT_TRUE(err.empty()) << err;
  auto names = eventNames(j);
  for (const char* want : {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "LOCAL_REDUCE", "0", "1"}) {
    EXPECT_TRUE(names.count(want)) << "missing event " << want << " in " << j.dump().substr(0, 1500);
  }
  std::remove(path.c_str());
  ::rmdir(dir);
}

TEST(Timeline, TwoAgentsShowCrossAllreduceAndSurviveSigkill) {
  char dir[] = "/tmp/kolo-tl-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string pattern = std::string(dir) + "/trace-%a.json";
  std::string p0 = std::string(dir) + "/trace-node0.json", p1 = std::string(dir) + "/trace-node1.json";
  {
    Cluster c(2, {{"KOLO_TIMELINE_FILENAME", pattern}, {"KOLO_TIMELINE_DIR", dir}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob("tl2", {1, 1}, {checkBin(), "loop", "1000000"});
    // Let it run long enough for several flushes, then kill node0's agent outright.
    ASSERT_FALSE(waitProcess(ranks[0], std::chrono::milliseconds(1500))) << ranks[0].output() << c.agentLog(0);
    killProcess(c.agent(0), SIGKILL);
    c.waitJob(ranks, std::chrono::seconds(20));
  }
  std::string err;
  auto j0 = readJson(p0, &err);
  ASSERT_TRUE(err.empty()) << "trace of the SIGKILLed agent is not valid JSON: " << err;
  auto names = eventNames(j0);
  EXPECT_TRUE(names.count("CROSS_ALLREDUCE")) << j0.dump().substr(0, 1500);
  EXPECT_TRUE(names.count("NEGOTIATE_ACROSS_AGENTS")) << j0.dump().substr(0, 1500);
  auto j1 = readJson(p1, &err);
  EXPECT_TRUE(err.empty()) << err;
  std::remove(p0.c_str());
  std::remove(p1.c_str());
  ::rmdir(dir);
}

TEST(Timeline, MergeMakesOneJobTraceFromEveryAgentsFile) {
  char dir[] = "/tmp/kolo-tl-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string p0 = std::string(dir) + "/trace-node0.json", p1 = std::string(dir) + "/trace-node1.json";
  std::string merged = std::string(dir) + "/job.json";
  {
    Cluster c(2, {{"KOLO_TIMELINE_FILENAME", std::string(dir) + "/trace-%a.json"},
                  {"KOLO_TIMELINE_DIR", dir}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchMultiJob("tlm", {1, 1}, {checkBin(), "loop", "30"});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
    for (auto& r : ranks) ASSERT_EQ(r.exit_code, 0) << r.output();
  }
  Proc m = spawnProcess({binDir() + "/kolo", "timeline", "merge", p0, p1, "-o", merged}, {},
                        std::string(dir) + "/merge.log");
  ASSERT_TRUE(waitProcess(m, std::chrono::seconds(30)));
  ASSERT_EQ(m.exit_code, 0) << m.output();
  EXPECT_NE(m.output().find("merged 2 files"), std::string::npos) << m.output();
  std::string err;
  auto j = readJson(merged, &err);
  ASSERT_TRUE(err.empty()) << err;
  // Both agents' rows, labelled by agent, with their cross-agent allreduces;
  // times start at 0 and every pid range stays apart.
  std::set<std::string> procs;
  std::set<int64_t> cross_pids;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") procs.insert(e.at("args").at("name"));
    if (e.contains("ts")) EXPECT_GE(e.at("ts").get<int64_t>(), 0) << e.dump();
    if (e.value("name", "") == "CROSS_ALLREDUCE") cross_pids.insert(e.at("pid").get<int64_t>() / 1000000);
    EXPECT_NE(e.value("name", ""), "kolo_clock_anchor");
  }
  EXPECT_TRUE(procs.count("node0: loop")) << j.dump().substr(0, 1500);
  EXPECT_TRUE(procs.count("node1: loop")) << j.dump().substr(0, 1500);
  EXPECT_EQ(cross_pids.size(), 2u) << "CROSS_ALLREDUCE from both agents";
  // A file that is not a trace is refused with its name.
  std::string bogus = std::string(dir) + "/bogus.json";
  { std::ofstream(bogus) << "{not json"; }
  Proc b = spawnProcess({binDir() + "/kolo", "timeline", "merge", p0, bogus, "-o", merged}, {},
                        std::string(dir) + "/merge2.log");
  ASSERT_TRUE(waitProcess(b, std::chrono::seconds(30)));
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_NE(b.output().find("bogus.json is not valid JSON"), std::string::npos) << b.output();
  for (const std::string& f : {p0, p1, merged, bogus, std::string(dir) + "/merge.log", std::string(dir) + "/merge2.log"}) {
    std::remove(f.c_str());
  }
  ::rmdir(dir);
}

TEST(Timeline, ApiStartsAndStopsTheAgentsTimeline) {
  char dir[] = "/tmp/kolo-tl-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/api.json";
  {
    Cluster c(1, {{"KOLO_TIMELINE_DIR", dir}});
    ASSERT_TRUE(c.ok()) << c.error();
    auto ranks = c.launchJob("tlapi", 2, {checkBin(), "api-timeline", path});
    ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
    for (auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.output() << c.agentLog(0);
    // The stop travels on the socket, the barriers on the rings: the agent
    // may close the file just after the ranks are gone (bounded wait).
    std::string log = c.agentLog(0);
    for (int i = 0; i < 100 && log.find("timeline " + path + " closed") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      log = c.agentLog(0);
    }
    EXPECT_NE(log.find("timeline recording to " + path), std::string::npos) << log;
    EXPECT_NE(log.find("timeline " + path + " closed"), std::string::npos) << log;
  }
  std::string err;
  auto j = readJson(path, &err);
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_TRUE(eventNames(j).count("ALLREDUCE")) << j.dump().substr(0, 1500);
  std::remove(path.c_str());
  ::rmdir(dir);
}

// kolorun's --timeline-filename with a system agent (one kolorun did not
// start): the ranks ask it for the timeline; a name outside its
// --timeline-dir fails the job with the agent's reason, naming the folder.
TEST(Timeline, KolorunTimelineFilenameWithASystemAgentWorksOrSaysWhyNot) {
  char dir[] = "/tmp/kolo-tl-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/sys.json";
  {
    Cluster c(1, {{"KOLO_TIMELINE_DIR", dir}});
    ASSERT_TRUE(c.ok()) << c.error();
    const std::map<std::string, std::string> env = {{"KOLO_AGENT_SOCKET", c.socket(0)},
                                                    {"KOLO_AGENT_RPC", c.agentRpc(0)}};
    Proc ok = spawnProcess({binDir() + "/kolorun", "-np", "2", "--timeline-filename", "sys.json",
                            checkBin(), "loop", "20"},
                           env, c.dir() + "/kolorun-ok.log");
    ASSERT_TRUE(waitProcess(ok, std::chrono::seconds(60))) << ok.output();
    EXPECT_EQ(ok.exit_code, 0) << ok.output() << c.agentLog(0);
    std::string log = c.agentLog(0);
    for (int i = 0; i < 100 && log.find("timeline " + path + " closed") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      log = c.agentLog(0);
    }
    EXPECT_NE(log.find("timeline " + path + " closed"), std::string::npos) << log;

    Proc bad = spawnProcess({binDir() + "/kolorun", "-np", "2", "--timeline-filename",
                             "/proc/kolo-nope/tl.json", checkBin(), "loop", "5"},
                            env, c.dir() + "/kolorun-bad.log");
    ASSERT_TRUE(waitProcess(bad, std::chrono::seconds(60))) << bad.output();
    const std::string out = bad.output();
    EXPECT_NE(bad.exit_code, 0) << out;
    EXPECT_NE(out.find("KOLO_TIMELINE_FILENAME=/proc/kolo-nope/tl.json (kolorun "
                       "--timeline-filename): the kolo "
                       "agent writes no timeline there"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("this agent writes timelines only inside " + std::string(dir)),
              std::string::npos)
        << out;
  }
  std::string err;
  auto j = readJson(path, &err);
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_TRUE(eventNames(j).count("ALLREDUCE")) << j.dump().substr(0, 1500);
  std::remove(path.c_str());
  ::rmdir(dir);
}

TEST(Logging, JsonLinesCarryHostPidTidAndEscapedMessages) {
  Cluster c(1, {{"KOLO_LOG_FORMAT", "json"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("jsonlog", 3, {checkBin(), "mismatch"});  // warnings with quotes and brackets
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60)));
  std::string log = c.agentLog(0);
  std::istringstream lines(log);
  std::string line;
  int parsed = 0;
  bool saw_mismatch = false;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << "not a JSON line: " << line;
    for (const char* k : {"ts", "host", "pid", "tid", "logger", "level", "msg"}) {
      ASSERT_TRUE(j.contains(k)) << k << " missing in " << line;
    }
    saw_mismatch |= j["msg"].get<std::string>().find("Mismatched") != std::string::npos;
    ++parsed;
  }
  EXPECT_GT(parsed, 3) << log;
  EXPECT_TRUE(saw_mismatch) << log;
}

TEST(Stall, SlowRankIsReportedWithItsRankThenJobCompletes) {
  Cluster c(1, {{"KOLO_STALL_CHECK_TIME_S", "1"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("stally", 2, {checkBin(), "stall", "4"});
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(30)));
  for (auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.output();
  std::string log = c.agentLog(0);
  EXPECT_NE(log.find("stally"), std::string::npos) << log;
  EXPECT_NE(log.find("slow"), std::string::npos) << log;
  EXPECT_NE(log.find("[agent.stall] [warning]"), std::string::npos) << log;
}

TEST(Stall, ShutdownTimeFailsTheStalledJob) {
  Cluster c(1, {{"KOLO_STALL_CHECK_TIME_S", "1"}, {"KOLO_STALL_SHUTDOWN_TIME_S", "2"}});
  ASSERT_TRUE(c.ok()) << c.error();
  auto ranks = c.launchJob("stuck", 2, {checkBin(), "stall", "20"});
  ASSERT_TRUE(waitProcess(ranks[0], std::chrono::seconds(15))) << c.agentLog(0);
  std::string out = ranks[0].output();
  EXPECT_EQ(ranks[0].exit_code, 1) << out;
  EXPECT_NE(out.find("KOLO_ERR_ABORTED"), std::string::npos) << out;
  EXPECT_NE(out.find("stall-shutdown-time-s"), std::string::npos) << out;
  c.waitJob(ranks, std::chrono::seconds(30));
}

}  // namespace
}  // namespace kolo::testing
