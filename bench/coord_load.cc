// kolo-coord-load: simulates N agents against a real kolo-coordinator over
// gRPC on loopback, from one process with one connection per agent, and
// prints one table row per (agents, jobs) case (docs/bench-tools.md and
// docs/benchmarks.md, "Control plane at scale").
//
// Each case starts a fresh coordinator (--coordinator-bin, with a --state-dir
// in a temp dir, as a user would), then: every agent registers and
// heartbeats at the interval the coordinator tells it; the agents join J
// elastic jobs (agent i in job i % J) and each opens its WatchJob stream
// after its join, as coord_client.cc does; every job's member 0 puts a
// bootstrap key and the others get it (KvGet with a wait); the coordinator's
// CPU is sampled over a steady window with only heartbeats; one agent per
// job (of 2 agents or more) goes silent and its peers wait for the next
// generation; the survivors leave and the jobs finish. Every phase is bounded.
#include <absl/synchronization/mutex.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/coord_load_stats.h"
#include "kolo/proto/coordinator.grpc.pb.h"

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}
double msSince(int64_t t0) { return static_cast<double>(nowNs() - t0) / 1e6; }

// This process's CPU seconds (user + system).
double selfCpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

struct Options {
  std::vector<int> agents{64};
  std::vector<int> jobs{8};
  std::string coordinator_bin;
  std::vector<std::string> coordinator_args;
  int lease_ms = 5000;
  int heartbeat_ms = 1000;
  double steady_s = 5;
  double phase_timeout_s = 60;
  int window = 128;  // bulk calls in flight (register, join, KV)
  bool check = false;
  bool heartbeat_stream = true;  // HeartbeatStream (quiet beats) instead of Heartbeat calls
};

// Bounds the calls in flight and waits for all of them.
class InFlight {
 public:
  explicit InFlight(int limit) : limit_(limit) {}
  void acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return n_ < limit_; });
    ++n_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --n_;
    }
    cv_.notify_all();
  }
  bool drain(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
  int limit_;
};

template <typename Req, typename Rep>
struct Call {
  grpc::ClientContext ctx;
  Req req;
  Rep rep;
  int64_t t0 = 0;
};

// One unary call through the callback API: `start(ctx, req, rep, cb)` issues
// it, `done(status, reply, ms)` runs on a gRPC thread.
template <typename Req, typename Rep, typename Start, typename Done>
void unary(Req req, Start start, Done done) {
  auto* c = new Call<Req, Rep>;
  c->req = std::move(req);
  c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  c->t0 = nowNs();
  start(&c->ctx, &c->req, &c->rep, [c, done](grpc::Status s) {
    done(s, c->rep, msSince(c->t0));
    delete c;
  });
}

struct Job;
struct Results;
class HeartbeatStream;

struct Agent {
  int index = 0;
  std::string id;
  std::string secret;
  Job* job = nullptr;
  int member = 0;  // index in the job
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<coord::Coordinator::Stub> stub;
  std::atomic<bool> registered{false};
  std::atomic<bool> alive{true};  // heartbeating
  std::atomic<int64_t> last_hb_ok_ns{0};
  int64_t next_hb_ns = 0;  // heartbeat thread only
  std::unique_ptr<grpc::ClientReadReactor<coord::World>> watch;
  std::unique_ptr<grpc::ClientContext> watch_ctx;
  // Heartbeats on one stream, as coord_client.cc sends them (unless
  // --heartbeat-unary); a coordinator without HeartbeatStream (UNIMPLEMENTED)
  // gets Heartbeat calls instead.
  std::unique_ptr<HeartbeatStream> hb_stream;
  std::atomic<bool> hb_unary{false};
};

struct Job {
  std::string id;
  std::string token;
  std::vector<Agent*> members;
  std::atomic<int64_t> last_join_sent_ns{0};
  std::atomic<int64_t> last_g1_recv_ns{0};
  std::atomic<int> g1{0};        // members that saw generation 1 RUNNING
  std::atomic<int> g2{0};        // survivors that saw generation 2
  std::atomic<int> finished{0};  // members that saw FINISHED
  std::atomic<int> failed{0};
  Agent* lost = nullptr;
  std::atomic<int64_t> lost_last_hb_ns{0};
};

struct Results {
  Samples reg, hb, seal, kv_put, kv_get, lost;
  // Where a seal's time goes: JoinJob's answer, then the watch opened
  // after it until its first World.
  Samples join, watch_open;
  std::atomic<int> errors{0};
  std::atomic<int> hb_unknown{0};
  std::mutex err_mu;
  std::string first_error;
  void error(const std::string& what, const grpc::Status& s) {
    errors++;
    std::lock_guard<std::mutex> lock(err_mu);
    if (first_error.empty()) first_error = what + ": " + s.error_message();
  }
};

// One agent's HeartbeatStream: the heartbeat thread writes a heartbeat when
// the previous one was answered; each answer is a latency sample.
class HeartbeatStream final
    : public grpc::ClientBidiReactor<coord::HeartbeatRequest, coord::HeartbeatReply> {
 public:
  HeartbeatStream(Agent* a, Results* r) : a_(a), r_(r) {}
  void begin() {
    a_->stub->async()->HeartbeatStream(&ctx_, this);
    StartRead(&rep_);
    StartCall();
  }
  // Heartbeat thread: false while the previous heartbeat is unwritten or,
  // if it asked for an answer, unanswered. As kolo-agent does, every 5th
  // heartbeat asks for an answer (a latency sample); the others are quiet.
  bool beat() {
    if (busy_.exchange(true)) return false;
    req_.set_agent_id(a_->id);
    req_.set_agent_secret(a_->secret);
    ask_ = ++beats_ % 5 == 0;
    req_.set_quiet(!ask_);
    t0_ = nowNs();
    StartWrite(&req_);
    return true;
  }
  void OnWriteDone(bool ok) override {
    if (ok && !ask_) {
      if (a_->alive.load()) a_->last_hb_ok_ns = nowNs();
      busy_ = false;
    }
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;
  void cancel() { ctx_.TryCancel(); }
  bool waitDone(std::chrono::milliseconds t) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, t, [&] { return done_; });
  }

 private:
  Agent* a_;
  Results* r_;
  grpc::ClientContext ctx_;
  coord::HeartbeatRequest req_;
  coord::HeartbeatReply rep_;
  std::atomic<bool> busy_{false};
  bool ask_ = false;  // the heartbeat in flight asks for an answer
  uint64_t beats_ = 0;
  int64_t t0_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

void HeartbeatStream::OnReadDone(bool ok) {
  if (!ok) return;
  if (!rep_.known()) r_->hb_unknown++;
  if (ask_) {  // else an answer known = false to a quiet heartbeat
    r_->hb.add(msSince(t0_));
    if (a_->alive.load()) a_->last_hb_ok_ns = nowNs();
    busy_ = false;
  }
  StartRead(&rep_);
}

void HeartbeatStream::OnDone(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    a_->hb_unary = true;
  } else if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
    r_->error("HeartbeatStream", s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

class Watcher final : public grpc::ClientReadReactor<coord::World> {
 public:
  Watcher(Agent* a, Results* r) : a_(a), r_(r) {}
  void begin(grpc::ClientContext* ctx) {
    t0_ = nowNs();
    req_.set_job_id(a_->job->id);
    req_.set_agent_id(a_->id);
    req_.set_token(a_->job->token);
    req_.set_brief(true);  // as coord_client.cc asks
    req_.set_local_size_runs(true);
    req_.set_agent_secret(a_->secret);  // a member's stream, as kolo-agent's (docs/security.md)
    a_->stub->async()->WatchJob(ctx, &req_, this);
    StartRead(&w_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    Job* j = a_->job;
    if (t0_ != 0) {
      r_->watch_open.add(msSince(t0_));
      t0_ = 0;
    }
    if (w_.state() == coord::RUNNING && w_.generation() == 1 && !saw_g1_) {
      saw_g1_ = true;
      int64_t t = nowNs();
      int64_t prev = j->last_g1_recv_ns.load();
      while (t > prev && !j->last_g1_recv_ns.compare_exchange_weak(prev, t)) {
      }
      j->g1++;
    } else if (w_.state() == coord::RUNNING && w_.generation() >= 2 && !saw_g2_) {
      saw_g2_ = true;
      if (j->lost_last_hb_ns > 0) r_->lost.add(msSince(j->lost_last_hb_ns));
      j->g2++;
    } else if (w_.state() == coord::FINISHED) {
      j->finished++;
    } else if (w_.state() == coord::FAILED) {
      j->failed++;
    }
    StartRead(&w_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  bool waitDone(std::chrono::milliseconds t) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, t, [&] { return done_; });
  }

 private:
  Agent* a_;
  Results* r_;
  coord::WatchJobRequest req_;
  coord::World w_;
  int64_t t0_ = 0;  // the stream opened, no World yet
  bool saw_g1_ = false;
  bool saw_g2_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// The coordinator child process and its /proc figures.
class Coordinator {
 public:
  ~Coordinator() { stop(); }
  bool start(const Options& o, std::string* address) {
    dir_ = std::filesystem::temp_directory_path() /
           ("kolo-coord-load-" + std::to_string(::getpid()) + "-" + std::to_string(nowNs()));
    std::filesystem::create_directories(dir_);
    std::string ready = (dir_ / "ready").string();
    std::vector<std::string> args = {o.coordinator_bin,
                                     "--listen=127.0.0.1:0",
                                     "--ready-file=" + ready,
                                     "--state-dir=" + (dir_ / "state").string(),
                                     "--lease-ms=" + std::to_string(o.lease_ms),
                                     "--heartbeat-interval-ms=" + std::to_string(o.heartbeat_ms),
                                     "--log-level=warn"};
    for (const auto& a : o.coordinator_args) args.push_back(a);
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open((dir_ / "coordinator.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::ifstream in(ready);
      if (in >> *address) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  pid_t pid() const { return pid_; }
  // Bytes of the files in its --state-dir (journal and snapshot).
  uint64_t stateBytes() const {
    std::error_code ec;
    uint64_t total = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "state", ec)) {
      if (e.is_regular_file(ec)) total += e.file_size(ec);
    }
    return total;
  }
  // utime + stime in seconds.
  double cpuSeconds() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string line;
    std::getline(in, line);
    auto close = line.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    double ut = 0, st = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) ut = std::stod(field);
      if (i == 15) st = std::stod(field);
    }
    return (ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  // VmRSS / VmHWM in MiB; Threads.
  double status(const char* key) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(key, 0) == 0) {
        double v = std::stod(line.substr(std::strlen(key)));
        return std::string(key) == "Threads:" ? v : v / 1024.0;
      }
    }
    return 0;
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 100 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (::waitpid(pid_, &status, WNOHANG) == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
      pid_ = -1;
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }
  std::string logTail() const {
    std::ifstream in(dir_ / "coordinator.log");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path dir_;
};

bool waitUntil(std::chrono::milliseconds timeout, const std::function<bool()>& pred) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

CaseRow runCase(const Options& o, int n, int nj) {
  CaseRow row;
  row.agents = n;
  row.jobs = nj;
  row.lease_ms = o.lease_ms;
  auto fail = [&](const std::string& why) {
    if (row.failure.empty()) row.failure = why;
  };
  auto phase = std::chrono::milliseconds(static_cast<int64_t>(o.phase_timeout_s * 1000));

  const double tool_cpu0 = selfCpuSeconds();
  const int64_t case_t0 = nowNs();
  Coordinator coordinator;
  std::string address;
  if (!coordinator.start(o, &address)) {
    row.failure = "the coordinator did not start: " + coordinator.logTail();
    return row;
  }
  Results r;
  std::vector<std::unique_ptr<Job>> jobs;
  for (int j = 0; j < nj; ++j) {
    auto job = std::make_unique<Job>();
    job->id = "load-job-" + std::to_string(j);
    job->token = "token-" + std::to_string(j) + "-0123456789abcdef";
    jobs.push_back(std::move(job));
  }
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < n; ++i) {
    auto a = std::make_unique<Agent>();
    a->index = i;
    char name[32];
    std::snprintf(name, sizeof name, "load-%05d", i);
    a->id = name;
    a->job = jobs[i % nj].get();
    a->member = static_cast<int>(a->job->members.size());
    a->job->members.push_back(a.get());
    grpc::ChannelArguments args;
    args.SetInt("kolo.load.connection", i);  // one connection per agent
    // As kolo-agent's channel (agent/coord/coord_client.cc).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    a->channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    a->stub = coord::Coordinator::NewStub(a->channel);
    agents.push_back(std::move(a));
  }
  double cpu0 = coordinator.cpuSeconds();

  // 1. Register.
  InFlight window(o.window);
  // The interval of heartbeats on a stream, as the coordinator tells every
  // agent (RegisterAgentReply; 0 from an older one: the unary interval).
  std::atomic<uint64_t> stream_hb_ms{0};
  for (auto& up : agents) {
    Agent* a = up.get();
    coord::RegisterAgentRequest req;
    req.mutable_agent()->set_agent_id(a->id);
    req.mutable_agent()->set_hostname("host-" + a->id);
    req.mutable_agent()->set_rpc_address("127.0.0.1:" + std::to_string(20000 + a->index));
    req.mutable_agent()->set_data_address(std::string(64, 'u'));
    window.acquire();
    unary<coord::RegisterAgentRequest, coord::RegisterAgentReply>(
        std::move(req),
        [a](auto* ctx, auto* q, auto* p, auto cb) {
          a->stub->async()->RegisterAgent(ctx, q, p, std::move(cb));
        },
        [a, &r, &window, &stream_hb_ms](const grpc::Status& s, const coord::RegisterAgentReply& rep,
                                        double ms) {
          if (s.ok()) {
            a->secret = rep.agent_secret();
            stream_hb_ms.store(rep.stream_heartbeat_interval_ms());
            a->last_hb_ok_ns = nowNs();
            a->registered = true;
            r.reg.add(ms);
          } else {
            r.error("RegisterAgent", s);
          }
          window.release();
        });
  }
  if (!window.drain(phase)) fail("register: timed out");

  // Heartbeats at the interval, each agent from a random phase.
  std::atomic<bool> stop_hb{false};
  std::thread hb_thread([&] {
    std::mt19937 rng(42);
    const int64_t unary_interval = static_cast<int64_t>(o.heartbeat_ms) * 1000000;
    const int64_t stream_interval = stream_hb_ms.load() > 0
                                        ? static_cast<int64_t>(stream_hb_ms.load()) * 1000000
                                        : unary_interval;
    const int64_t interval = o.heartbeat_stream ? stream_interval : unary_interval;
    int64_t t = nowNs();
    for (auto& a : agents) a->next_hb_ns = t + static_cast<int64_t>(rng() % interval);
    while (!stop_hb.load()) {
      int64_t now = nowNs();
      for (auto& up : agents) {
        Agent* a = up.get();
        if (!a->registered.load() || !a->alive.load() || now < a->next_hb_ns) continue;
        a->next_hb_ns +=
            o.heartbeat_stream && !a->hb_unary.load() ? stream_interval : unary_interval;
        if (o.heartbeat_stream && !a->hb_unary.load()) {
          if (a->hb_stream == nullptr) {
            a->hb_stream = std::make_unique<HeartbeatStream>(a, &r);
            a->hb_stream->begin();
          }
          a->hb_stream->beat();
          continue;
        }
        coord::HeartbeatRequest req;
        req.set_agent_id(a->id);
        req.set_agent_secret(a->secret);
        unary<coord::HeartbeatRequest, coord::HeartbeatReply>(
            std::move(req),
            [a](auto* ctx, auto* q, auto* p, auto cb) {
              a->stub->async()->Heartbeat(ctx, q, p, std::move(cb));
            },
            [a, &r](const grpc::Status& s, const coord::HeartbeatReply& rep, double ms) {
              if (!s.ok()) {
                r.error("Heartbeat", s);
              } else {
                r.hb.add(ms);
                if (!rep.known()) r.hb_unknown++;
                if (a->alive.load()) a->last_hb_ok_ns = nowNs();
              }
            });
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });

  // 2. Join (elastic, min 1 rank); each agent opens its watch after its join.
  for (auto& up : agents) {
    Agent* a = up.get();
    if (!a->registered.load()) continue;
    Job* j = a->job;
    coord::JoinJobRequest req;
    req.set_job_id(j->id);
    req.set_token(j->token);
    req.set_agent_id(a->id);
    req.set_agent_secret(a->secret);
    req.set_local_size(1);
    req.set_world_size(static_cast<int>(j->members.size()));
    req.set_min_size(1);
    window.acquire();
    int64_t sent = nowNs();
    int64_t prev = j->last_join_sent_ns.load();
    while (sent > prev && !j->last_join_sent_ns.compare_exchange_weak(prev, sent)) {
    }
    unary<coord::JoinJobRequest, coord::JoinJobReply>(
        std::move(req),
        [a](auto* ctx, auto* q, auto* p, auto cb) {
          a->stub->async()->JoinJob(ctx, q, p, std::move(cb));
        },
        [a, &r, &window](const grpc::Status& s, const coord::JoinJobReply&, double ms) {
          if (s.ok()) {
            r.join.add(ms);
            a->watch_ctx = std::make_unique<grpc::ClientContext>();
            auto* w = new Watcher(a, &r);
            a->watch.reset(w);
            w->begin(a->watch_ctx.get());
          } else {
            r.error("JoinJob", s);
          }
          window.release();
        });
  }
  if (!window.drain(phase)) fail("join: timed out");
  bool sealed = waitUntil(phase, [&] {
    for (auto& j : jobs) {
      if (j->g1.load() < static_cast<int>(j->members.size())) return false;
    }
    return true;
  });
  for (auto& j : jobs) {
    if (j->g1.load() == static_cast<int>(j->members.size())) {
      row.sealed++;
      r.seal.add(static_cast<double>(j->last_g1_recv_ns - j->last_join_sent_ns) / 1e6);
    }
  }
  if (!sealed) fail("seal: not every agent got its World");

  // 3. Bootstrap keys: member 0 puts, the others get (waiting up to 5 s).
  std::atomic<int> kv_ok{0};
  for (auto& jp : jobs) {
    Job* j = jp.get();
    Agent* a0 = j->members.front();
    coord::KvPutRequest put;
    put.set_job_id(j->id);
    put.set_token(j->token);
    put.set_key("bootstrap/unique_id");
    put.set_value(std::string(128, 'k'));
    window.acquire();
    unary<coord::KvPutRequest, coord::KvPutReply>(
        std::move(put),
        [a0](auto* ctx, auto* q, auto* p, auto cb) {
          a0->stub->async()->KvPut(ctx, q, p, std::move(cb));
        },
        [&r, &window, &kv_ok](const grpc::Status& s, const coord::KvPutReply&, double ms) {
          if (s.ok()) {
            r.kv_put.add(ms);
            kv_ok++;
          } else {
            r.error("KvPut", s);
          }
          window.release();
        });
  }
  for (auto& up : agents) {
    Agent* a = up.get();
    if (a->member == 0) continue;
    coord::KvGetRequest get;
    get.set_job_id(a->job->id);
    get.set_token(a->job->token);
    get.set_key("bootstrap/unique_id");
    get.set_wait_ms(5000);
    window.acquire();
    unary<coord::KvGetRequest, coord::KvGetReply>(
        std::move(get),
        [a](auto* ctx, auto* q, auto* p, auto cb) {
          a->stub->async()->KvGet(ctx, q, p, std::move(cb));
        },
        [&r, &window, &kv_ok](const grpc::Status& s, const coord::KvGetReply& rep, double ms) {
          if (s.ok() && rep.found()) {
            r.kv_get.add(ms);
            kv_ok++;
          } else {
            r.error("KvGet", s.ok() ? grpc::Status(grpc::StatusCode::NOT_FOUND, "no key") : s);
          }
          window.release();
        });
  }
  if (!window.drain(phase)) fail("kv: timed out");
  if (kv_ok.load() != n) fail("kv: " + std::to_string(n - kv_ok.load()) + " operations failed");

  // 4. Steady state: only heartbeats. The line on stderr lets a profiler
  // attach for exactly this phase (perf record -p <pid> -- sleep <s>).
  std::fprintf(stderr, "# steady phase: coordinator pid %d, %.1f s\n", coordinator.pid(),
               o.steady_s);
  double c0 = coordinator.cpuSeconds();
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.steady_s * 1000)));
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  row.steady_cpu_pct = 100.0 * (coordinator.cpuSeconds() - c0) / wall;
  row.rss_mib = coordinator.status("VmRSS:");
  row.threads = static_cast<int>(coordinator.status("Threads:"));

  // 5. Agent loss: the last member of each job of 2+ goes silent.
  int lost_jobs = 0;
  for (auto& jp : jobs) {
    Job* j = jp.get();
    if (j->members.size() < 2) continue;
    j->lost = j->members.back();
    j->lost->alive = false;
    j->lost_last_hb_ns = j->lost->last_hb_ok_ns.load();
    if (j->lost->watch_ctx) j->lost->watch_ctx->TryCancel();
    lost_jobs++;
  }
  // Each lost agent's last heartbeat as the coordinator received it
  // (ListAgents' age, once no heartbeat of theirs can still be starting):
  // the tool's own record is the last one it saw written or answered, which
  // misses a heartbeat written as the agent went silent (up to an interval).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    coord::ListAgentsReply rep;
    int64_t sent = nowNs();
    grpc::Status st = agents.front()->stub->ListAgents(&ctx, coord::ListAgentsRequest(), &rep);
    int64_t at = sent + (nowNs() - sent) / 2;
    if (st.ok()) {
      std::map<std::string, int64_t> age_ms;
      for (const auto& s : rep.agents()) age_ms[s.agent().agent_id()] = s.last_heartbeat_age_ms();
      for (auto& j : jobs) {
        if (j->lost == nullptr) continue;
        auto it = age_ms.find(j->lost->id);
        if (it != age_ms.end()) j->lost_last_hb_ns = at - it->second * 1000000;
      }
    } else {
      r.error("ListAgents", st);
    }
  }
  auto lost_bound = std::chrono::milliseconds(o.lease_ms) + phase;
  bool noticed = waitUntil(lost_bound, [&] {
    for (auto& j : jobs) {
      if (j->lost != nullptr && j->g2.load() < static_cast<int>(j->members.size()) - 1) {
        return false;
      }
    }
    return true;
  });
  row.lost_expected = lost_jobs;
  for (auto& j : jobs) {
    if (j->lost != nullptr && j->g2.load() == static_cast<int>(j->members.size()) - 1) {
      row.lost_noticed++;
    }
  }
  if (!noticed) fail("agent loss: not every survivor got the next generation");

  // 6. The survivors leave: every job finishes.
  for (auto& up : agents) {
    Agent* a = up.get();
    if (a == a->job->lost || !a->registered.load()) continue;
    coord::LeaveJobRequest req;
    req.set_job_id(a->job->id);
    req.set_agent_id(a->id);
    req.set_token(a->job->token);
    req.set_agent_secret(a->secret);
    window.acquire();
    unary<coord::LeaveJobRequest, coord::LeaveJobReply>(
        std::move(req),
        [a](auto* ctx, auto* q, auto* p, auto cb) {
          a->stub->async()->LeaveJob(ctx, q, p, std::move(cb));
        },
        [&r, &window](const grpc::Status& s, const coord::LeaveJobReply&, double) {
          if (!s.ok()) r.error("LeaveJob", s);
          window.release();
        });
  }
  if (!window.drain(phase)) fail("leave: timed out");
  waitUntil(phase, [&] {
    for (auto& j : jobs) {
      int survivors = static_cast<int>(j->members.size()) - (j->lost != nullptr ? 1 : 0);
      if (j->finished.load() < survivors) return false;
    }
    return true;
  });
  for (auto& j : jobs) {
    int survivors = static_cast<int>(j->members.size()) - (j->lost != nullptr ? 1 : 0);
    if (j->finished.load() == survivors) row.finished++;
    row.failed_worlds += j->failed.load();
  }
  if (row.finished != nj) fail("finish: not every job finished");

  row.total_cpu_s = coordinator.cpuSeconds() - cpu0;
  row.peak_rss_mib = coordinator.status("VmHWM:");
  stop_hb = true;
  hb_thread.join();
  for (auto& a : agents) {
    if (a->hb_stream) a->hb_stream->cancel();
  }
  for (auto& a : agents) {
    if (a->hb_stream) a->hb_stream->waitDone(std::chrono::seconds(10));
  }
  // Streams: ended by FINISHED (or cancelled); cancel what is left, then wait.
  for (auto& a : agents) {
    if (a->watch_ctx) a->watch_ctx->TryCancel();
  }
  for (auto& a : agents) {
    if (a->watch) static_cast<Watcher*>(a->watch.get())->waitDone(std::chrono::seconds(10));
  }
  const double state_mb = static_cast<double>(coordinator.stateBytes()) / 1e6;
  coordinator.stop();

  row.registered = static_cast<int>(r.reg.count());
  row.reg = r.reg.summary();
  row.hb = r.hb.summary();
  row.seal = r.seal.summary();
  row.kv_put = r.kv_put.summary();
  row.kv_get = r.kv_get.summary();
  row.lost = r.lost.summary();
  Summary join = r.join.summary(), open = r.watch_open.summary();
  std::printf(
      "#   %d agents, %d jobs: JoinJob p50 %.1f p99 %.1f ms; WatchJob to its first World "
      "p50 %.1f p99 %.1f ms; this tool used %.1f CPU s in %.1f s; the coordinator's state dir "
      "(journal + snapshot) %.1f MB\n",
      n, nj, join.p50, join.p99, open.p50, open.p99, selfCpuSeconds() - tool_cpu0,
      msSince(case_t0) / 1000, state_mb);
  row.errors = r.errors.load() + r.hb_unknown.load();
  if (row.registered != n) fail("register: " + std::to_string(n - row.registered) + " failed");
  if (row.errors > 0) {
    std::lock_guard<std::mutex> lock(r.err_mu);
    fail(std::to_string(row.errors) + " calls failed, first: " + r.first_error);
    if (row.failure.find(r.first_error) == std::string::npos) {
      row.failure += "; first failed call: " + r.first_error;
    }
  }
  // Lost agents must be noticed within the lease plus a bound (the lease
  // check runs every lease/10, at most 250 ms; then the push).
  if (row.lost.max > o.lease_ms + 1500) fail("agent loss noticed too late");
  return row;
}

void raiseOpenFiles() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace
}  // namespace kolo::bench

int main(int argc, char** argv) {
  using namespace kolo::bench;
  Options o;
  CLI::App app{"kolo-coord-load: N simulated agents against a real kolo-coordinator"};
  app.add_option("--agents", o.agents, "Agent counts, one case each (e.g. 256,1024,4096)")
      ->delimiter(',');
  app.add_option("--jobs", o.jobs, "Job counts, one case each (e.g. 1,64,512)")->delimiter(',');
  // Required, but checked after parsing: an unknown flag is named first.
  app.add_option("--coordinator-bin", o.coordinator_bin,
                 "kolo-coordinator to start per case (required)");
  app.add_option("--coordinator-arg", o.coordinator_args,
                 "Extra flag for the coordinator (repeatable), e.g. --coordinator-arg=--max-watch-"
                 "streams=8192");
  app.add_option("--lease-ms", o.lease_ms, "Coordinator --lease-ms");
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "Coordinator --heartbeat-interval-ms");
  app.add_option("--steady-s", o.steady_s, "Seconds of heartbeats only (CPU sampled)");
  app.add_option("--phase-timeout-s", o.phase_timeout_s, "Bound of each phase");
  app.add_option("--window", o.window, "Bulk calls in flight (register, join, KV, leave)");
  app.add_flag("--check", o.check, "Exit 1 unless every case had every outcome");
  app.add_flag("--heartbeat-stream,!--heartbeat-unary", o.heartbeat_stream,
               "One HeartbeatStream per agent with quiet heartbeats, every 5th asking for an "
               "answer, as kolo-agent sends them (the default); --heartbeat-unary: a Heartbeat "
               "call per interval, as kolo-agent against a coordinator without the stream");
  app.set_version_flag("--version", "kolo-coord-load " KOLO_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // a usage error: exit 2, as every kolo program
    std::fprintf(stderr, "kolo-coord-load: %s (see kolo-coord-load --help)\n", e.what());
    return 2;
  }
  if (o.coordinator_bin.empty()) {
    std::fprintf(stderr,
                 "kolo-coord-load: --coordinator-bin is required (see kolo-coord-load --help)\n");
    return 2;
  }
  // As in kolo-coordinator: no lock-order graph for gRPC's mutexes (Debian's
  // Abseil keeps one), or the simulated agents cost far more than they should.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  raiseOpenFiles();
  ::signal(SIGPIPE, SIG_IGN);

  std::printf("%s\n", kCaseHeader);
  std::fflush(stdout);
  bool ok = true;
  for (int n : o.agents) {
    for (int j : o.jobs) {
      if (j > n) {
        std::printf("# %d agents, %d jobs: skipped (more jobs than agents)\n", n, j);
        continue;
      }
      CaseRow row = runCase(o, n, j);
      std::printf("%s\n", formatCaseRow(row).c_str());
      if (!row.failure.empty()) {
        std::printf(
            "#   FAILED: %s (registered %d, sealed %d/%d, lost noticed %d/%d, finished %d, "
            "errors %d)\n",
            row.failure.c_str(), row.registered, row.sealed, row.jobs, row.lost_noticed,
            row.lost_expected, row.finished, row.errors);
        ok = false;
      }
      std::fflush(stdout);
    }
  }
  return (o.check && !ok) ? 1 : 0;
}
