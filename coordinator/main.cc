// kolo-coordinator: jobs, rendezvous, membership generations, leases and a
// job-scoped key-value store, over gRPC (proto/coordinator.proto).
#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/sd_notify.h"
#include "coordinator/flags.h"
#include "coordinator/server.h"
#include "kolo/proto/coordinator.grpc.pb.h"

namespace {

// Writes "address\n" to a temp file next to `path`, then renames it, so a
// reader never sees a partial file.
kolo::Status writeReadyFile(const std::string& path, const std::string& address) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << address << "\n";
    out.flush();
    if (!out) return kolo::errnoStatus("cannot write " + tmp, errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return kolo::errnoStatus("cannot rename " + tmp + " to " + path, err);
  }
  return kolo::okStatus();
}

// Publishes agent and job counts for Prometheus: every few seconds it asks
// the loop for what ListAgents/ListJobs return (no RPC to itself, so it works
// whatever the listening port asks for: TLS, client certificates).
class CoordinatorMetrics {
 public:
  CoordinatorMetrics(const std::string& listen, kolo::coordinator::CoordinatorServer* server)
      : server_(server) {
    http_ = std::make_unique<kolo::metrics::MetricsHttpServer>(registry_, listen);
  }
  ~CoordinatorMetrics() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (poller_.joinable()) poller_.join();
    http_->stop();
  }
  kolo::Status start() {
    RETURN_IF_ERROR(http_->start());
    poller_ = std::thread([this] {
      kolo::log::setThreadName("coord-metrics");
      for (;;) {
        poll();
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::seconds(5), [&] { return stop_; })) return;
      }
    });
    return kolo::okStatus();
  }
  std::string address() const { return http_->boundAddress(); }

 private:
  void poll() {
    auto lists = server_->listAgentsAndJobs(std::chrono::seconds(2));
    if (lists.isOk()) {
      const auto& [agents, jobs] = *lists;
      registry_.gauge("kolo_coordinator_agents", "Agents holding a lease")
          .set(agents.agents_size());
      std::map<std::string, int> by_state = {
          {"FORMING", 0}, {"RUNNING", 0}, {"FAILED", 0}, {"FINISHED", 0}};
      for (const auto& j : jobs.jobs()) by_state[kolo::coord::JobState_Name(j.state())]++;
      for (auto& [state, n] : by_state) {
        registry_
            .gauge("kolo_coordinator_jobs", "Jobs known to the coordinator by state",
                   {{"state", state}})
            .set(n);
      }
    }
    registry_
        .gauge("kolo_coordinator_leader",
               "1 if this coordinator serves (always, without --etcd-endpoints), 0 on a standby")
        .set(server_->isLeader() ? 1 : 0);
    registry_.counter("kolo_coordinator_metric_polls_total", "Snapshots taken for /metrics").inc();
  }

  kolo::metrics::Registry registry_;
  kolo::coordinator::CoordinatorServer* server_;  // outlives this (main)
  std::unique_ptr<kolo::metrics::MetricsHttpServer> http_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread poller_;
};

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex that gRPC
  // takes is also tracked in a lock-order graph (deadlock detection): at
  // thousands of agents that graph was about a fifth of the coordinator's CPU
  // (docs/coordinator.md, "Scale"). It finds bugs in gRPC, not in us: off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // --version (before "--"): the version, exit 0.
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      std::printf("%s %s\n", "kolo-coordinator", KOLO_VERSION);
      return 0;
    }
  }
  kolo::Config config("kolo-coordinator");
  kolo::coordinator::defineFlags(config);
  kolo::Status st = config.load(argc, argv);
  if (!st.isOk()) {
    std::cerr << "kolo-coordinator: " << st.message() << "\n";
    return 2;
  }
  if (config.wantsHelp()) {
    std::cout << config.helpText();
    return 0;
  }
  if (config.wantsDump()) {
    std::cout << config.dump();
    return 0;
  }
  if (config.wantsMarkdown()) {
    std::cout << config.markdown();
    return 0;
  }
  auto options = kolo::coordinator::serverOptionsFrom(config);
  if (!options.isOk()) {
    std::cerr << "kolo-coordinator: " << options.status().message() << "\n";
    return 2;
  }
  kolo::log::init("kolo-coordinator", config.getString("log-level"));
  kolo::log::setThreadName("coord-main");
  auto logger = kolo::log::get("coord");

  // Signals are taken synchronously by this thread; every thread started
  // from here on inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // SIGUSR1: sent by the coordinator to itself when it stops leading (etcd).
  sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::atomic<bool> leadership_lost{false};
  options->on_leadership_lost = [&leadership_lost](const kolo::Status&) {
    leadership_lost.store(true);
    ::kill(::getpid(), SIGUSR1);
  };
  auto server = kolo::coordinator::CoordinatorServer::start(*options);
  if (!server.isOk()) {
    logger->critical("cannot start: {}", server.status().message());
    return 1;
  }
  std::unique_ptr<CoordinatorMetrics> metrics;
  if (!config.getString("metrics-listen").empty()) {
    metrics = std::make_unique<CoordinatorMetrics>(config.getString("metrics-listen"),
                                                   (*server).get());
    st = metrics->start();
    if (!st.isOk()) {
      logger->critical("--metrics-listen {}: {}", config.getString("metrics-listen"), st.message());
      (*server)->shutdown(std::chrono::milliseconds(0));
      return 1;
    }
    logger->info("metrics on http://{}/metrics", metrics->address());
  }
  const std::string& ready_file = config.getString("ready-file");
  if (!ready_file.empty()) {
    st = writeReadyFile(ready_file, (*server)->address());
    if (!st.isOk()) {
      logger->critical("{}", st.message());
      (*server)->shutdown(std::chrono::milliseconds(0));
      return 1;
    }
  }

  (void)kolo::sdNotifyReady("serving " + (*server)->address());
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  (void)kolo::sdNotifyStopping();
  metrics.reset();
  if (leadership_lost.load()) {
    // Exit rather than stand by in this process: the Core's state may be
    // ahead of etcd; a restart (systemd, Kubernetes) comes back as a clean
    // standby that loads the state only if it wins again.
    logger->critical("exiting with status 3: this coordinator lost its leadership");
    (*server)->shutdown(std::chrono::milliseconds(0));
    server->reset();
    if (!ready_file.empty()) std::remove(ready_file.c_str());
    return 3;
  }
  logger->info("got {}, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  // Streams and KV waits end at once and unary calls take milliseconds, so
  // the grace mostly bounds how long idle client connections are waited for
  // (gRPC waits for every connection to close after its GOAWAY).
  (*server)->shutdown(std::chrono::milliseconds(500));
  server->reset();
  if (!ready_file.empty()) std::remove(ready_file.c_str());
  return 0;
}
