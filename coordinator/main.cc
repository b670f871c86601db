// kolo-coordinator: jobs, rendezvous, membership generations, leases and a
// job-scoped key-value store, over gRPC (proto/coordinator.proto).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "common/config.h"
#include "common/log.h"
#include "coordinator/flags.h"
#include "coordinator/server.h"

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

}  // namespace

int main(int argc, char** argv) {
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
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = kolo::coordinator::CoordinatorServer::start(*options);
  if (!server.isOk()) {
    logger->critical("cannot start: {}", server.status().message());
    return 1;
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

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
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
