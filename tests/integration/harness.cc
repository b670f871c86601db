#include "harness.h"

#include <algorithm>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

extern char** environ;

namespace kolo::testing {

std::string binDir() { return KOLO_BIN_DIR; }

std::string Proc::output() const {
  std::ifstream f(log_path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Proc spawnProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& log_path) {
  Proc p;
  p.log_path = log_path;
  std::map<std::string, std::string> full;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq != std::string::npos) full[s.substr(0, eq)] = s.substr(eq + 1);
  }
  for (auto& [k, v] : env) full[k] = v;
  std::vector<std::string> envs;
  for (auto& [k, v] : full) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  p.started = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    ::setpgid(0, 0);
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(cargv[0], cargv.data(), cenv.data());
    std::fprintf(stderr, "exec %s: %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  p.pid = pid;
  return p;
}

bool waitProcess(Proc& p, std::chrono::milliseconds timeout) {
  if (p.exited || p.pid <= 0) return true;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(p.pid, &st, WNOHANG);
    if (r == p.pid) {
      p.exited = true;
      p.ended = std::chrono::steady_clock::now();
      if (WIFEXITED(st)) p.exit_code = WEXITSTATUS(st);
      if (WIFSIGNALED(st)) p.term_signal = WTERMSIG(st);
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child's exit
  }
}

void killProcess(Proc& p, int sig) {
  if (p.pid > 0 && !p.exited) ::kill(p.pid, sig);
}

static void stopProcess(Proc& p) {
  if (p.pid <= 0 || p.exited) return;
  killProcess(p, SIGTERM);
  if (!waitProcess(p, std::chrono::seconds(5))) {
    killProcess(p, SIGKILL);
    waitProcess(p, std::chrono::seconds(5));
  }
}

bool waitForFile(const std::string& path, Proc& owner, std::chrono::milliseconds timeout,
                 std::string* content) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(path);
    if (f && std::getline(f, *content) && !content->empty()) return true;
    if (waitProcess(owner, std::chrono::milliseconds(0)) && owner.exited) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling for a file
  }
  return false;
}

Cluster::Cluster(int agents, std::map<std::string, std::string> agent_env)
    : Cluster([&] {
        ClusterOptions o;
        o.agents = agents;
        o.agent_env = std::move(agent_env);
        return o;
      }()) {}

static std::vector<std::string> prefixed(const std::vector<std::string>& prefix, std::vector<std::string> argv) {
  std::vector<std::string> out = prefix;
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

Cluster::Cluster(const ClusterOptions& o) {
  const int agents = o.agents;
  char tmpl[] = "/tmp/kolo-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    error_ = "mkdtemp failed";
    return;
  }
  dir_ = tmpl;
  if (!o.external_coordinators.empty()) {
    coord_addr_ = o.external_coordinators;
  } else {
    std::vector<std::string> cargv = {binDir() + "/kolo-coordinator", "--listen", o.coordinator_listen,
                                      "--ready-file", dir_ + "/coord.ready", "--lease-ms", "3000",
                                      "--heartbeat-interval-ms", "500"};
    cargv.insert(cargv.end(), o.coordinator_args.begin(), o.coordinator_args.end());
    coord_ = spawnProcess(prefixed(o.coordinator_prefix, cargv), {}, dir_ + "/coordinator.log");
    if (!waitForFile(dir_ + "/coord.ready", coord_, std::chrono::seconds(20), &coord_addr_)) {
      error_ = "coordinator did not become ready: " + coord_.output();
      return;
    }
  }
  for (int i = 0; i < agents; ++i) {
    std::string id = "node" + std::to_string(i);
    auto env = o.agent_env;
    if (i < static_cast<int>(o.per_agent_env.size())) {
      for (auto& [k, v] : o.per_agent_env[i]) env[k] = v;
    }
    std::vector<std::string> prefix = i < static_cast<int>(o.agent_prefix.size()) ? o.agent_prefix[i]
                                                                                    : std::vector<std::string>{};
    agents_.push_back(spawnProcess(
        prefixed(prefix, {binDir() + "/kolo-agent", "--socket", socket(i), "--coordinator",
                          o.agent_coordinator_prefix + coord_addr_ + o.agent_coordinator_suffix,
                          "--rpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--ready-file", dir_ + "/" + id + ".ready", "--agent-id",
                          id, "--hostname", id}),
        env, dir_ + "/agent-" + std::to_string(i) + ".log"));
  }
  for (int i = 0; i < agents; ++i) {
    std::string addr;
    if (!waitForFile(dir_ + "/node" + std::to_string(i) + ".ready", agents_[i], std::chrono::seconds(20),
                     &addr)) {
      error_ = "agent " + std::to_string(i) + " did not become ready: " + agents_[i].output();
      return;
    }
    agent_rpc_.push_back(addr);
  }
  ok_ = true;
}

Cluster::~Cluster() {
  for (auto& a : agents_) stopProcess(a);
  stopProcess(coord_);
  if (!dir_.empty() && std::getenv("KOLO_TEST_KEEP") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string Cluster::agentMetrics(int agent) const {
  std::ifstream f(dir_ + "/node" + std::to_string(agent) + ".ready");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("metrics=", 0) == 0) return line.substr(8);
  }
  return "";
}

std::map<std::string, std::string> Cluster::rankEnv(const std::string& job, const std::string& token,
                                                    int world, int local_rank, int local_size,
                                                    int agent) const {
  return {{"KOLO_AGENT_SOCKET", socket(agent)},
          {"KOLO_JOB_ID", job},
          {"KOLO_JOB_TOKEN", token},
          {"KOLO_SIZE", std::to_string(world)},
          {"KOLO_LOCAL_RANK", std::to_string(local_rank)},
          {"KOLO_LOCAL_SIZE", std::to_string(local_size)},
          {"KOLO_START_TIMEOUT", "20"},
          {"KOLO_OP_TIMEOUT", "60"}};
}

std::vector<Proc> Cluster::launchJob(const std::string& job, int world, const std::vector<std::string>& argv,
                                     std::map<std::string, std::string> extra_env) {
  std::vector<Proc> ranks;
  for (int r = 0; r < world; ++r) {
    auto env = rankEnv(job, "secret-" + job, world, r, world);
    for (auto& [k, v] : extra_env) env[k] = v;
    ranks.push_back(spawnProcess(argv, env, dir_ + "/" + job + "-rank" + std::to_string(r) + ".log"));
  }
  return ranks;
}

std::vector<Proc> Cluster::launchMultiJob(const std::string& job, const std::vector<int>& local_sizes,
                                          const std::vector<std::string>& argv,
                                          std::map<std::string, std::string> extra_env) {
  int world = 0;
  for (int n : local_sizes) world += n;
  std::vector<Proc> ranks;
  for (size_t a = 0; a < local_sizes.size(); ++a) {
    for (int l = 0; l < local_sizes[a]; ++l) {
      auto env = rankEnv(job, "secret-" + job, world, l, local_sizes[a], static_cast<int>(a));
      for (auto& [k, v] : extra_env) env[k] = v;
      ranks.push_back(spawnProcess(argv, env, dir_ + "/" + job + "-a" + std::to_string(a) + "-l" +
                                                  std::to_string(l) + ".log"));
    }
  }
  return ranks;
}

bool Cluster::waitJob(std::vector<Proc>& ranks, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool all = true;
  for (auto& p : ranks) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!waitProcess(p, std::max(left, std::chrono::milliseconds(0)))) {
      all = false;
      killProcess(p, SIGKILL);
      waitProcess(p, std::chrono::seconds(5));
    }
  }
  return all;
}

std::string layoutName(const std::vector<int>& sizes) {
  std::string s;
  for (int n : sizes) s += (s.empty() ? "" : "_") + std::to_string(n);
  return s;
}

std::string allLogs(Cluster& c, int agents) {
  std::string s;
  for (int i = 0; i < agents; ++i) s += "--- agent " + std::to_string(i) + "\n" + c.agentLog(i);
  return s;
}

void runCheckJob(const std::string& bin, const std::vector<int>& sizes, const std::string& job,
                 const std::vector<std::string>& args, const std::string& needle, std::chrono::seconds timeout) {
  int k = static_cast<int>(sizes.size());
  Cluster c(k);
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<std::string> argv = {bin};
  argv.insert(argv.end(), args.begin(), args.end());
  auto ranks = k == 1 ? c.launchJob(job, sizes[0], argv) : c.launchMultiJob(job, sizes, argv);
  ASSERT_TRUE(c.waitJob(ranks, timeout)) << "ranks did not finish\n" << allLogs(c, k);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string out = ranks[r].output();
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << " output:\n" << out << allLogs(c, k);
    EXPECT_NE(out.find(needle), std::string::npos) << "rank " << r << " output:\n" << out;
  }
}

std::map<std::string, std::string> fusedInTimeline(const std::string& bin, const std::vector<std::string>& args,
                                                   const std::string& job,
                                                   const std::vector<std::string>& activities, std::string* trace) {
  return timelineArgs(bin, args, job, activities, "fused", "1", {}, trace);
}

std::map<std::string, std::string> timelineArgs(const std::string& bin, const std::vector<std::string>& args,
                                                const std::string& job, const std::vector<std::string>& activities,
                                                const std::string& arg, const std::string& missing,
                                                const std::map<std::string, std::string>& agent_env,
                                                std::string* trace, std::map<std::string, std::string> rank_env) {
  std::map<std::string, std::string> fused;
  char dir[] = "/tmp/kolo-fuse-XXXXXX";
  if (::mkdtemp(dir) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    return fused;
  }
  const std::string p0 = std::string(dir) + "/trace-node0.json", p1 = std::string(dir) + "/trace-node1.json";
  bool ran = false;
  {
    std::map<std::string, std::string> env = agent_env;
    env["KOLO_TIMELINE_FILENAME"] = std::string(dir) + "/trace-%a.json";
    env["KOLO_TIMELINE_DIR"] = dir;
    Cluster c(2, env);
    if (!c.ok()) {
      ADD_FAILURE() << c.error();
    } else {
      std::vector<std::string> argv = {bin};
      argv.insert(argv.end(), args.begin(), args.end());
      auto ranks = c.launchMultiJob(job, {1, 1}, argv, rank_env);
      ran = c.waitJob(ranks, std::chrono::seconds(120));
      if (!ran) ADD_FAILURE() << allLogs(c, 2);
      for (auto& r : ranks) {
        if (r.exit_code != 0) {
          ADD_FAILURE() << r.output();
          ran = false;
        }
      }
    }
  }  // the agents stop: the trace is complete
  std::ifstream f(p0);
  std::stringstream ss;
  ss << f.rdbuf();
  if (trace != nullptr) *trace = ss.str();
  std::remove(p0.c_str());
  std::remove(p1.c_str());
  ::rmdir(dir);
  if (!ran) return fused;
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) {
    ADD_FAILURE() << "the trace is not JSON: " << ss.str().substr(0, 2000);
    return fused;
  }
  const nlohmann::json& evs = j.is_array() ? j : j.value("traceEvents", nlohmann::json::array());
  std::map<int64_t, std::string> tensor_of;
  for (const auto& e : evs) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      tensor_of[e.value("pid", int64_t{0})] = e["args"].value("name", "");
    }
  }
  for (const auto& e : evs) {
    const std::string name = e.value("name", "");
    if (std::find(activities.begin(), activities.end(), name) == activities.end() || !e.contains("args")) continue;
    fused[name + " " + tensor_of[e.value("pid", int64_t{0})]] = e["args"].value(arg, missing);
  }
  return fused;
}

std::string httpGet(const std::string& addr, const std::string& path) {
  auto colon = addr.rfind(':');
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, n);
  ::close(fd);
  return out;
}

}  // namespace kolo::testing
