// Runs a real single-member etcd for a test: loopback only, free ports, a
// private temp data dir, killed and removed in the destructor. Restartable
// on the same ports and data (stop() then start()).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace kolo::coordinator::testing {

class EtcdProcess {
 public:
  EtcdProcess();
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // The etcd binary ($KOLO_ETCD_BIN or /usr/bin/etcd); "" if there is none.
  static std::string binary();

  // Makes this process one member `name` of a cluster (before start()):
  // its ports and the --initial-cluster of every member.
  void setMember(std::string name, int client_port, int peer_port, std::string initial_cluster);

  // Starts etcd and waits (at most `timeout`) until it answers a read; with
  // `wait` false, returns once it is started (a cluster member answers only
  // once a quorum runs).
  bool start(std::chrono::milliseconds timeout, std::string* error, bool wait = true);
  // Sends `sig` and reaps (SIGKILL after 10 s). Keeps the data dir.
  void stop(int sig);
  // Sends `sig` only (SIGSTOP / SIGCONT: a hung etcd).
  void signal(int sig);

  const std::string& endpoint() const { return endpoint_; }  // 127.0.0.1:PORT
  std::string log() const;

 private:
  std::string dir_;
  std::string endpoint_;
  std::string name_ = "kolo-test";
  std::string initial_cluster_;  // "": a single member
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

// A loopback TCP port that was free a moment ago.
int freePort();

}  // namespace kolo::coordinator::testing
