#include "agent/timeline/timeline.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "agent/timeline/mpsc_queue.h"
#include "agent/timeline/timeline_merge.h"

namespace kolo::timeline {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A private temp directory, removed even when the test fails.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kolo-timeline-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p != nullptr) path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }
  bool ok() const { return !path_.empty(); }

 private:
  std::string path_;
};

nlohmann::json parseFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());  // throws (fails the test) on invalid JSON
}

// Events of the trace that are not metadata, with pid mapped back to names.
struct Parsed {
  std::map<int64_t, std::string> pid_names;
  std::vector<nlohmann::json> events;
};

Parsed parse(const nlohmann::json& doc) {
  Parsed p;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") p.pid_names[e.at("pid")] = e.at("args").at("name");
    } else {
      p.events.push_back(e);
    }
  }
  return p;
}

// A fake clock that tests step by hand.
struct FakeClock {
  std::atomic<int64_t> now{1'000'000};
  std::function<int64_t()> fn() {
    return [this] { return now.load(); };
  }
};

TEST(MpscQueue, BoundedAndFifoAcrossThreads) {
  BoundedMpscQueue<int> q(5);
  EXPECT_EQ(q.capacity(), 8u);
  for (int i = 0; i < 8; ++i) {
    int v = i;
    ASSERT_TRUE(q.tryPush(std::move(v)));
  }
  int extra = 99;
  EXPECT_FALSE(q.tryPush(std::move(extra)));
  int out;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(q.tryPop(&out));
    EXPECT_EQ(out, i);
  }
  EXPECT_FALSE(q.tryPop(&out));

  // Four producers; per-producer order must hold.
  BoundedMpscQueue<int> q2(64);
  const int kPer = 20000;
  std::vector<std::thread> producers;
  for (int t = 0; t < 4; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kPer; ++i) {
        int v = t * kPer + i;
        while (!q2.tryPush(std::move(v))) std::this_thread::yield();
      }
    });
  }
  std::vector<int> last(4, -1);
  for (int got = 0; got < 4 * kPer;) {
    if (!q2.tryPop(&out)) {
      std::this_thread::yield();
      continue;
    }
    int t = out / kPer;
    EXPECT_GT(out % kPer, last[t]);
    last[t] = out % kPer;
    ++got;
  }
  for (auto& th : producers) th.join();
}

TEST(Timeline, StopWritesValidTraceWithExpectedEvents) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  FakeClock clock;
  TimelineOptions opts;
  opts.clock_us = clock.fn();
  opts.dir = dir.path();
  Timeline tl(opts);
  tl.negotiateStart("ignored", CollectiveType::kAllreduce);  // not recording yet
  const std::string path = dir.file("trace.json");
  ASSERT_TRUE(tl.start(path, /*mark_cycles=*/true).isOk());
  EXPECT_TRUE(tl.active());
  EXPECT_FALSE(tl.start(path, false).isOk()) << "second start must fail";

  const std::vector<int64_t> shape = {3, 4};
  for (const std::string name : {"grad/w", "grad/b"}) {
    clock.now += 10;
    tl.markCycleStart();
    tl.negotiateStart(name, CollectiveType::kAllreduce);
    clock.now += 5;
    tl.negotiateRankReady(name, 0);
    clock.now += 5;
    tl.negotiateRankReady(name, 1);
    tl.negotiateEnd(name);
    tl.opStart(name, CollectiveType::kAllreduce);
    tl.activityStart(name, kQueue);
    clock.now += 1;
    tl.activityEnd(name);
    tl.activityStart(name, kMemcpyInFusionBuffer);
    tl.activityEnd(name);
    tl.activityStart(name, kLocalReduce);
    tl.activityEnd(name);
    tl.activityStart(name, kCrossAllreduce, {{"backend", "ucx"}});
    clock.now += 100;
    tl.activityEnd(name);
    tl.activity(name, kMemcpyOutFusionBuffer, tl.nowUs(), 7);
    clock.now += 7;
    tl.opEnd(name, DataType::kFloat32, shape);
  }
  ASSERT_TRUE(tl.stop().isOk());
  EXPECT_FALSE(tl.active());
  EXPECT_EQ(tl.dropped(), 0u);
  tl.opStart("late", CollectiveType::kAllreduce);  // after stop: ignored

  Parsed p = parse(parseFile(path));
  ASSERT_EQ(p.pid_names.size(), 2u);
  std::map<std::string, int64_t> pid_of;
  for (auto& [pid, name] : p.pid_names) pid_of[name] = pid;
  ASSERT_TRUE(pid_of.count("grad/w") && pid_of.count("grad/b"));
  EXPECT_NE(pid_of["grad/w"], pid_of["grad/b"]);

  // The first tensor's events in order.
  std::vector<std::string> seq;
  int cycles = 0;
  for (const auto& e : p.events) {
    if (e.at("ph") == "i") {
      EXPECT_EQ(e.at("name"), "CYCLE_START");
      EXPECT_EQ(e.at("s"), "g");
      ++cycles;
      continue;
    }
    if (e.at("pid") != pid_of["grad/w"]) continue;
    std::string ph = e.at("ph");
    seq.push_back(ph + (e.contains("name") ? ":" + e.at("name").get<std::string>() : ""));
  }
  EXPECT_EQ(cycles, 2);
  std::vector<std::string> want = {"B:NEGOTIATE_ALLREDUCE",
                                   "X:0",
                                   "X:1",
                                   "E",
                                   "B:ALLREDUCE",
                                   "B:QUEUE",
                                   "E",
                                   "B:MEMCPY_IN_FUSION_BUFFER",
                                   "E",
                                   "B:LOCAL_REDUCE",
                                   "E",
                                   "B:CROSS_ALLREDUCE",
                                   "E",
                                   "X:MEMCPY_OUT_FUSION_BUFFER",
                                   "E"};
  EXPECT_EQ(seq, want);

  // Timestamps are microseconds since start(), from the injected clock.
  const auto& w = p.events;
  auto find = [&](const std::string& tensor, const std::string& ph, const std::string& name) {
    for (const auto& e : w) {
      if (e.at("pid") == pid_of[tensor] && e.at("ph") == ph && e.value("name", "") == name) return e;
    }
    return nlohmann::json();
  };
  EXPECT_EQ(find("grad/w", "B", "NEGOTIATE_ALLREDUCE").at("ts"), 10);
  EXPECT_EQ(find("grad/w", "X", "1").at("ts"), 20);
  EXPECT_EQ(find("grad/w", "B", "CROSS_ALLREDUCE").at("args").at("backend"), "ucx");
  auto out = find("grad/w", "X", "MEMCPY_OUT_FUSION_BUFFER");
  EXPECT_EQ(out.at("dur"), 7);
  EXPECT_EQ(out.at("ts"), 121);
  // The final E of each tensor carries dtype and shape.
  for (const auto& [name, pid] : pid_of) {
    const nlohmann::json* last = nullptr;
    for (const auto& e : w) {
      if (e.at("pid") == pid) last = &e;
    }
    ASSERT_NE(last, nullptr);
    EXPECT_EQ(last->at("ph"), "E");
    EXPECT_EQ(last->at("args").at("dtype"), "float32");
    EXPECT_EQ(last->at("args").at("shape"), "[3, 4]");
  }
}

TEST(Timeline, FileIsValidAfterEveryFlush) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TimelineOptions opts;
  opts.flush_interval = 1h;  // flush only when asked
  opts.dir = dir.path();
  Timeline tl(opts);
  const std::string path = dir.file("t.json");
  ASSERT_TRUE(tl.start(path).isOk());
  // Valid right after start, holding only the clock anchor.
  ASSERT_EQ(parseFile(path).at("traceEvents").size(), 1u);
  EXPECT_EQ(parseFile(path).at("traceEvents")[0].at("name"), kClockAnchorName);
  uint64_t recorded = 0;
  for (int round = 1; round <= 5; ++round) {
    for (int i = 0; i < 10 * round; ++i) {
      tl.opStart("t" + std::to_string(i), CollectiveType::kAllgather);
      ++recorded;
    }
    tl.requestFlush();
    ASSERT_TRUE(tl.waitWritten(recorded, 10s));
    Parsed p = parse(parseFile(path));
    EXPECT_EQ(p.events.size(), recorded);
    EXPECT_EQ(p.pid_names.size(), static_cast<size_t>(10 * round));
  }
  tl.markCycleStart();  // mark_cycles off: nothing
  ASSERT_TRUE(tl.stop().isOk());
  EXPECT_EQ(parse(parseFile(path)).events.size(), recorded);
}

TEST(Timeline, FullQueueDropsAndCounts) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TimelineOptions opts;
  opts.queue_capacity = 8;
  opts.flush_interval = 1h;
  opts.dir = dir.path();
  Timeline tl(opts);
  const std::string path = dir.file("t.json");
  ASSERT_TRUE(tl.start(path).isOk());
  for (int i = 0; i < 100; ++i) tl.opStart("x", CollectiveType::kAllreduce);
  EXPECT_EQ(tl.dropped(), 92u);
  ASSERT_TRUE(tl.stop().isOk());
  EXPECT_EQ(parse(parseFile(path)).events.size(), 8u);
}

TEST(Timeline, AFileStopsGrowingAtItsCapAndStaysValid) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TimelineOptions opts;
  opts.flush_interval = 1h;
  opts.dir = dir.path();
  opts.max_bytes = 64 << 10;
  Timeline tl(opts);
  const std::string path = dir.file("t.json");
  ASSERT_TRUE(tl.start(path).isOk());
  uint64_t recorded = 0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 200; ++i, ++recorded)
      tl.opStart("tensor." + std::to_string(i), CollectiveType::kAllreduce);
    tl.requestFlush();
    ASSERT_TRUE(tl.waitWritten(0, 10s));
    uint64_t flushes = tl.flushes();
    for (int w = 0; w < 1000 && tl.flushes() == flushes; ++w) std::this_thread::sleep_for(1ms);
  }
  Status st = tl.stop();
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("reached its cap of 65536 bytes (--timeline-max-mb)"),
            std::string::npos)
      << st.toString();
  EXPECT_LE(std::filesystem::file_size(path), (64u << 10) + 1024);
  Parsed p = parse(parseFile(path));  // still valid JSON
  EXPECT_GT(p.events.size(), 0u);
  EXPECT_EQ(p.events.size() + tl.dropped(), recorded);
}

TEST(Timeline, RestartWritesAFreshFileAndBadPathFails) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TimelineOptions opts;
  opts.dir = dir.path();
  Timeline tl(opts);
  EXPECT_FALSE(tl.start(dir.file("no/such/dir/t.json")).isOk());
  EXPECT_FALSE(tl.active());
  ASSERT_TRUE(tl.start(dir.file("a.json")).isOk());
  tl.opStart("one", CollectiveType::kAllreduce);
  ASSERT_TRUE(tl.stop().isOk());
  ASSERT_TRUE(tl.stop().isOk()) << "stop twice is fine";
  ASSERT_TRUE(tl.start(dir.file("b.json")).isOk());
  tl.opStart("two", CollectiveType::kBroadcast);
  ASSERT_TRUE(tl.stop().isOk());
  Parsed a = parse(parseFile(dir.file("a.json")));
  Parsed b = parse(parseFile(dir.file("b.json")));
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].at("name"), "BROADCAST");
  EXPECT_EQ(b.pid_names.begin()->second, "two");
  EXPECT_EQ(a.pid_names.begin()->second, "one");
}

// A child process records continuously and is SIGKILLed while its writer
// thread runs; the file must still parse, with every event of the last flush.
TEST(Timeline, SurvivesSigkillOfTheWritingProcess) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("killed.json");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    TimelineOptions opts;
    opts.flush_interval = 20ms;
    opts.dir = dir.path();
    Timeline tl(opts);
    if (!tl.start(path).isOk()) ::_exit(2);
    uint64_t n = 0;
    bool told = false;
    // Bounded: the parent kills us long before this ends.
    for (int i = 0; i < 200000; ++i) {
      std::string name = "tensor" + std::to_string(i % 50);
      tl.negotiateStart(name, CollectiveType::kAllreduce);
      tl.negotiateRankReady(name, i % 4);
      tl.negotiateEnd(name);
      n += 3;
      if (!told && n >= 3000) {
        if (!tl.waitWritten(n, 10s)) ::_exit(3);
        char c = 'k';
        if (::write(fds[1], &c, 1) != 1) ::_exit(4);
        told = true;
      }
      if (told) std::this_thread::sleep_for(1ms);  // keep writing, slowly
    }
    ::_exit(5);
  }
  ::close(fds[1]);
  struct pollfd pfd = {fds[0], POLLIN, 0};
  int ready = ::poll(&pfd, 1, 20000);
  char c = 0;
  bool got = ready == 1 && ::read(fds[0], &c, 1) == 1;
  // Let the child record and flush a while longer so that the kill lands
  // while it is writing. Not a synchronisation: the check below must hold
  // whenever the kill lands.
  ::poll(nullptr, 0, 150);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(fds[0]);
  ASSERT_TRUE(got) << "child never reported its first flush (exit status " << status << ")";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  nlohmann::json doc;
  ASSERT_NO_THROW(doc = parseFile(path));
  Parsed p = parse(doc);
  EXPECT_GE(p.events.size(), 3000u);
  EXPECT_EQ(p.pid_names.size(), 50u);
}

TEST(TimelineMerge, AlignsFilesOnWallClockAndKeepsAgentsApart) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto write = [&](const std::string& name, const nlohmann::json& events) {
    std::ofstream(dir.file(name)) << nlohmann::json{{"traceEvents", events}}.dump();
    return dir.file(name);
  };
  // Agent a started recording at unix 1'000'000 us, agent b 500 us later.
  std::string a = write("a.json", nlohmann::json::array({
      {{"name", kClockAnchorName}, {"ph", "M"}, {"pid", 0}, {"args", {{"ts_us", 0}, {"unix_us", 1000000}, {"label", "hostA"}}}},
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "grad"}}}},
      {{"name", "ALLREDUCE"}, {"ph", "B"}, {"ts", 10}, {"pid", 1}, {"tid", 0}},
      {{"ph", "E"}, {"ts", 700}, {"pid", 1}, {"tid", 0}}}));
  std::string b = write("b.json", nlohmann::json::array({
      {{"name", kClockAnchorName}, {"ph", "M"}, {"pid", 0}, {"args", {{"ts_us", 0}, {"unix_us", 1000500}, {"label", "hostB"}}}},
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "grad"}}}},
      {{"name", "ALLREDUCE"}, {"ph", "B"}, {"ts", 0}, {"pid", 1}, {"tid", 0}}}));
  std::string out = dir.file("job.json");
  auto st = mergeTraceFiles({a, b}, out);
  ASSERT_TRUE(st.isOk()) << st.status().toString();
  EXPECT_EQ(st.value().files, 2u);
  Parsed p = parse(parseFile(out));
  EXPECT_EQ(p.pid_names.at(1), "hostA: grad");
  EXPECT_EQ(p.pid_names.at(1000001), "hostB: grad");
  std::map<int64_t, std::vector<int64_t>> ts;  // pid -> timestamps
  for (const auto& e : p.events) ts[e.at("pid")].push_back(e.at("ts"));
  EXPECT_EQ(ts[1], (std::vector<int64_t>{0, 690}));  // earliest event is 0
  EXPECT_EQ(ts[1000001], (std::vector<int64_t>{490}));  // 500 us later on the wall clock
  // A file without an anchor cannot be aligned: a clear error.
  std::string old = write("old.json", nlohmann::json::array({{{"name", "X"}, {"ph", "i"}, {"ts", 1}, {"pid", 1}}}));
  auto bad = mergeTraceFiles({a, old}, out);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("old.json has no clock anchor"), std::string::npos) << bad.status().message();
}

TEST(TimelineMerge, RecordedFilesCarryTheAnchorFirst) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TimelineOptions opts;
  opts.label = "node7";
  opts.dir = dir.path();
  Timeline tl(opts);
  ASSERT_TRUE(tl.start(dir.file("t.json")).isOk());
  ASSERT_TRUE(tl.stop().isOk());
  auto doc = parseFile(dir.file("t.json"));
  ASSERT_GE(doc.at("traceEvents").size(), 1u);
  const auto& anchor = doc.at("traceEvents")[0];
  EXPECT_EQ(anchor.at("name"), kClockAnchorName);
  EXPECT_EQ(anchor.at("args").at("label"), "node7");
  EXPECT_EQ(anchor.at("args").at("ts_us"), 0);
  EXPECT_GT(anchor.at("args").at("unix_us").get<int64_t>(), 1'600'000'000'000'000);
}

// --- the timeline directory: every file is created inside it ---

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A timeline directory and, beside it, a file it must never touch.
struct ConfinedSetup {
  TempDir root;
  std::string dir, victim;
  const std::string kVictimText = "root-owned configuration\n";
  ConfinedSetup() {
    dir = root.file("timelines");
    victim = root.file("victim.conf");
    fs::create_directory(dir);
    std::ofstream(victim) << kVictimText;
  }
  Status start(const std::string& name) {
    TimelineOptions opts;
    opts.dir = dir;
    Timeline tl(opts);
    Status st = tl.start(name);
    if (st.isOk()) {
      last_path = tl.path();
      (void)tl.stop();
    }
    return st;
  }
  std::string last_path;
};

void expectRefused(ConfinedSetup& s, const std::string& name, const std::string& why) {
  Status st = s.start(name);
  ASSERT_FALSE(st.isOk()) << name << " was accepted";
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.message();
  EXPECT_EQ(st.message(), "timeline path '" + name + "' " + why +
                              " (this agent writes timelines only inside " + s.dir +
                              ", set by --timeline-dir (KOLO_TIMELINE_DIR))");
  EXPECT_EQ(slurp(s.victim), s.kVictimText) << "the file outside the directory changed";
}

TEST(TimelineDir, RelativeAndAbsoluteNamesInsideAreWritten) {
  ConfinedSetup s;
  ASSERT_TRUE(s.start("rel.json").isOk());
  EXPECT_EQ(s.last_path, s.dir + "/rel.json");
  EXPECT_NO_THROW(parseFile(s.dir + "/rel.json"));
  ASSERT_TRUE(s.start(s.dir + "/./abs.json").isOk());
  EXPECT_EQ(s.last_path, s.dir + "/abs.json");
  fs::create_directory(s.dir + "/sub");
  ASSERT_TRUE(s.start("sub/deep.json").isOk());
  EXPECT_EQ(s.last_path, s.dir + "/sub/deep.json");
  // New files are 0640 at most (less the umask).
  EXPECT_EQ(fs::status(s.dir + "/rel.json").permissions() &
                (fs::perms::group_write | fs::perms::others_all),
            fs::perms::none);
  // An existing regular file is truncated and reused (Horovod overwrites too).
  std::ofstream(s.dir + "/old.json") << std::string(10000, 'x');
  ASSERT_TRUE(s.start("old.json").isOk());
  EXPECT_NO_THROW(parseFile(s.dir + "/old.json"));
}

TEST(TimelineDir, AbsolutePathOutsideIsRefused) {
  ConfinedSetup s;
  expectRefused(s, s.victim, "is outside the timeline directory");
  expectRefused(s, s.root.file("new-outside.json"), "is outside the timeline directory");
  EXPECT_FALSE(fs::exists(s.root.file("new-outside.json")));
  // A sibling whose name merely starts with the directory's.
  expectRefused(s, s.dir + "-other/t.json", "is outside the timeline directory");
  EXPECT_FALSE(fs::exists(s.dir + "-other"));
}

TEST(TimelineDir, DotDotIsRefused) {
  ConfinedSetup s;
  expectRefused(s, "../victim.conf", "has a '..' component");
  expectRefused(s, s.dir + "/../victim.conf", "has a '..' component");
  fs::create_directory(s.dir + "/sub");
  expectRefused(s, "sub/../../victim.conf", "has a '..' component");
}

TEST(TimelineDir, SymbolicLinksAreNotFollowed) {
  ConfinedSetup s;
  // The leaf is a link to the victim; a subdirectory is a link out of the
  // directory: neither is followed, the victim stays as it was.
  fs::create_symlink(s.victim, s.dir + "/trace.json");
  expectRefused(s, "trace.json", "is a symbolic link");
  expectRefused(s, s.dir + "/trace.json", "is a symbolic link");
  fs::create_symlink(s.root.path(), s.dir + "/up");
  expectRefused(s, "up/victim.conf",
                "goes through " + s.dir + "/up, a symbolic link or not a directory");
  // A dangling link is not created through either.
  fs::create_symlink(s.root.file("created-outside.json"), s.dir + "/dangling.json");
  expectRefused(s, "dangling.json", "is a symbolic link");
  EXPECT_FALSE(fs::exists(s.root.file("created-outside.json")));
}

TEST(TimelineDir, OnlyRegularFilesWithOneLinkAreReused) {
  ConfinedSetup s;
  ASSERT_EQ(::mkfifo((s.dir + "/fifo.json").c_str(), 0600), 0);
  expectRefused(s, "fifo.json", "exists and is not a regular file");
  fs::create_directory(s.dir + "/adir");
  expectRefused(s, "adir", "exists and is not a regular file");
  fs::create_hard_link(s.victim, s.dir + "/hard.json");
  expectRefused(s, "hard.json", "exists and has other hard links");
  expectRefused(s, s.dir, "names the directory itself, not a file in it");
}

TEST(TimelineDir, TheDirectoryMayBeReachedThroughALink) {
  ConfinedSetup s;
  const std::string link = s.root.file("link-to-timelines");
  fs::create_symlink(s.dir, link);
  TimelineOptions opts;
  opts.dir = link;  // as configured; names below it or below its real path are inside
  Timeline tl(opts);
  ASSERT_TRUE(tl.start(link + "/a.json").isOk());
  EXPECT_EQ(tl.path(), s.dir + "/a.json");
  ASSERT_TRUE(tl.stop().isOk());
  ASSERT_TRUE(tl.start(s.dir + "/b.json").isOk());
  ASSERT_TRUE(tl.stop().isOk());
  EXPECT_FALSE(tl.start(s.victim).isOk());
}

TEST(TimelineDir, NoDirectoryMeansNoTimelines) {
  TempDir d;
  ASSERT_TRUE(d.ok());
  Timeline tl;  // options.dir empty
  Status st = tl.start(d.file("t.json"));
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "timelines are off on this agent: no timeline directory is set (--timeline-dir "
            "(KOLO_TIMELINE_DIR))");
  EXPECT_FALSE(fs::exists(d.file("t.json")));
  TimelineOptions missing;
  missing.dir = d.file("no-such-dir");
  Timeline tl2(missing);
  st = tl2.start("t.json");
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("the timeline directory " + d.file("no-such-dir") +
                              " (--timeline-dir (KOLO_TIMELINE_DIR)) cannot be used"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace kolo::timeline
