#include "tests/coordinator/etcd_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "coordinator/ha/etcd_client.h"

namespace kolo::coordinator::testing {

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::string EtcdProcess::binary() {
  const char* env = std::getenv("KOLO_ETCD_BIN");
  std::string bin = env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
  return ::access(bin.c_str(), X_OK) == 0 ? bin : "";
}

EtcdProcess::EtcdProcess() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kolo-etcd-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
}

EtcdProcess::~EtcdProcess() {
  stop(SIGKILL);
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string EtcdProcess::log() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void EtcdProcess::setMember(std::string name, int client_port, int peer_port,
                            std::string initial_cluster) {
  name_ = std::move(name);
  client_port_ = client_port;
  peer_port_ = peer_port;
  endpoint_ = "127.0.0.1:" + std::to_string(client_port_);
  initial_cluster_ = std::move(initial_cluster);
}

bool EtcdProcess::start(std::chrono::milliseconds timeout, std::string* error, bool wait) {
  std::string bin = binary();
  if (bin.empty() || dir_.empty()) {
    *error = "no etcd binary or temp dir";
    return false;
  }
  if (client_port_ == 0) {
    client_port_ = freePort();
    peer_port_ = freePort();
    endpoint_ = "127.0.0.1:" + std::to_string(client_port_);
  }
  std::string client_url = "http://" + endpoint_;
  std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {
      bin,
      "--name=" + name_,
      "--data-dir=" + dir_ + "/data",
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=" + (initial_cluster_.empty() ? name_ + "=" + peer_url : initial_cluster_),
      "--initial-cluster-token=kolo-test",
      "--logger=zap",
      "--log-level=warn"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string log_path = dir_ + "/etcd.log";
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (pid_ < 0) {
    *error = "fork failed";
    return false;
  }
  if (!wait) return true;
  ha::EtcdOptions o;
  o.endpoints = {endpoint_};
  auto client = ha::EtcdClient::create(o);
  Status st = (*client)->waitReachable(timeout);
  if (!st.isOk()) {
    *error = st.message() + "\netcd log:\n" + log();
    return false;
  }
  return true;
}

void EtcdProcess::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

void EtcdProcess::stop(int sig) {
  if (pid_ > 0 && sig != SIGCONT) ::kill(pid_, SIGCONT);  // a stopped etcd cannot exit
  if (pid_ <= 0) return;
  ::kill(pid_, sig);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || r < 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
}

}  // namespace kolo::coordinator::testing
