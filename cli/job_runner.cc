#include "cli/job_runner.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "cli/srun_launch.h"
#include "common/coord_endpoints.h"
#include "common/unix_socket.h"

namespace kolo::cli {

namespace {

constexpr auto kKillGrace = std::chrono::seconds(5);
// After the last rank exited: how long to wait for output still in flight
// (from something the rank left behind holding its pipes).
constexpr auto kDrainTime = std::chrono::seconds(1);

std::string seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string envOr(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : dflt;
}

// The ranks get KOLO_COORDINATOR as it is (`kolo` inside a rank reads it):
// one host:port or a list host:port,host:port; a bad entry stops the launch.
Status checkCoordinatorEnv(const std::string& value) {
  if (value.empty()) return okStatus();
  return parseCoordinatorList(value, "KOLO_COORDINATOR").status();
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

}  // namespace

void JobRunner::say(const std::string& line) const { writeAll(STDERR_FILENO, "kolorun: " + line + "\n"); }

int JobRunner::run() {
  auto sup = Supervisor::create();
  if (!sup.isOk()) {
    say(sup.status().message());
    return 1;
  }
  sup_ = std::move(sup.value());

  Status st = prepareNodes();
  if (!st.isOk()) {
    if (received_signal_ != 0) {
      say("interrupted by " + signalName(received_signal_) + " while starting the embedded daemons");
      if (daemons_) daemons_->stop();
      return 128 + received_signal_;
    }
    say(st.message());
    if (daemons_) daemons_->stop();
    return 1;
  }
  auto job = newJobIdentity();
  if (!job.isOk()) {
    say(job.status().message());
    return 1;
  }
  plan_.job = *job;
  plan_.start_timeout_s = opts_.start_timeout_s;
  plan_.command = opts_.command;
  for (auto& [k, v] : tuningEnv(opts_)) plan_.extra_env[k] = v;
  plan_.user_env = userEnv(opts_, processEnvironment());
  plan_.wdir = opts_.wdir;
  plan_.ssh_options = sshOptions(opts_);
  setTorchrunMaster(plan_, processEnvironment());

  if (opts_.verbose) {
    say("job " + plan_.job.job_id + ": " + std::to_string(plan_.size()) + " rank(s) on " +
        std::to_string(plan_.nodes.size()) + " node(s)" +
        (plan_.coordinator.empty() ? "" : ", coordinator " + plan_.coordinator));
    for (size_t n = 0; n < plan_.nodes.size(); ++n) {
      const NodeEndpoint& node = plan_.nodes[n];
      std::vector<int> rs;
      for (auto& p : plan_.ranks) {
        if (p.node == static_cast<int>(n)) rs.push_back(p.rank);
      }
      say("  node " + std::to_string(n) + (node.agent_id.empty() ? "" : " (" + node.agent_id + ")") + " on " +
          node.host + ": ranks " + rankList(rs) + ", agent socket " + node.agent_socket +
          (node.agent_rpc.empty() ? "" : ", status " + node.agent_rpc));
    }
  }

  st = srun_ ? spawnSrunStep() : spawnRanks();
  if (!st.isOk()) {
    say(st.message());
    bool any_started = std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.child >= 0; });
    if (!any_started) {
      if (daemons_) daemons_->stop();
      return 1;
    }
    if (!failed_rank_) exit_code_ = 1;
    stopRanks(SIGTERM);
  }
  superviseRanks();
  printSummary();
  if (daemons_) daemons_->stop();
  if (!srun_hostfile_dir_.empty()) {
    (void)::unlink((srun_hostfile_dir_ + "/hostfile").c_str());
    (void)::rmdir(srun_hostfile_dir_.c_str());
  }
  return exit_code_;
}

Status JobRunner::prepareNodes() {
  ASSIGN_OR_RETURN(Launcher launcher,
                   chooseLauncher(opts_.launcher, !opts_.hosts.empty() || !opts_.hostfile.empty(),
                                  opts_.agents, findOnPath("srun"), processEnvironment()));
  if (launcher == Launcher::kSrun) return prepareSrunNodes();
  std::vector<HostSlots> hosts;
  if (!opts_.hosts.empty()) {
    ASSIGN_OR_RETURN(hosts, parseHostList(opts_.hosts));
  } else if (!opts_.hostfile.empty()) {
    std::ifstream in(opts_.hostfile);
    if (!in) return invalidArgument("cannot read the hostfile " + opts_.hostfile);
    std::stringstream ss;
    ss << in.rdbuf();
    ASSIGN_OR_RETURN(hosts, parseHostfile(ss.str(), opts_.hostfile));
  }
  std::set<std::string> seen;
  for (auto& h : hosts) {
    if (!seen.insert(h.host).second) return invalidArgument("host " + h.host + " is listed twice");
  }
  bool all_local = true;
  for (auto& h : hosts) all_local = all_local && isLocalHost(h.host);
  // A socket the user named (--agent-socket, KOLO_AGENT_SOCKET) must work;
  // without one, the system agent's is tried and, when it is absent (not
  // when it refuses us), kolorun says so and starts private daemons.
  const char* env_socket = std::getenv("KOLO_AGENT_SOCKET");
  const bool from_env =
      env_socket != nullptr && *env_socket != '\0' && opts_.agent_socket == env_socket;
  const bool named = from_env || opts_.agent_socket != kDefaultAgentSocket;
  if (!named) opts_.agent_socket = envOr("KOLORUN_SYSTEM_AGENT_SOCKET", opts_.agent_socket);
  const bool multi_host = !(hosts.empty() || (hosts.size() == 1 && all_local));
  const int socket_err = opts_.agents == 1 || multi_host ? probeUnix(opts_.agent_socket) : -1;
  const bool system_agent = opts_.agents == 1 && socket_err == 0;
  if (socket_err > 0) {
    const std::string why = explainSocketError(opts_.agent_socket, socket_err);
    if (named) {
      return unavailable(
          "cannot use the kolo-agent socket " + opts_.agent_socket + " (named by " +
          (from_env ? "KOLO_AGENT_SOCKET" : "--agent-socket") + "): " + why +
          (multi_host ? "" : "; or name no socket and kolorun starts private daemons"));
    }
    if (socket_err == EACCES || socket_err == EPERM) {
      return permissionDenied("the kolo-agent socket " + opts_.agent_socket +
                              " exists but cannot be opened: " + why);
    }
    if (!multi_host) {
      say("no kolo-agent at " + opts_.agent_socket + " (" + why.substr(0, why.find(':')) +
          "); starting a private kolo-coordinator and kolo-agent for this job");
    }
  }

  if (hosts.empty() || (hosts.size() == 1 && all_local)) {
    // One machine: its system agent, or embedded agents.
    if (!hosts.empty()) RETURN_IF_ERROR(fillSlots(opts_.np, {hosts[0].slots}).status());
    if (system_agent) {
      if (opts_.verbose) say("using the kolo-agent at " + opts_.agent_socket);
      plan_.nodes.push_back({"localhost", true, "", opts_.agent_socket, envOr("KOLO_AGENT_RPC", "")});
      plan_.coordinator = envOr("KOLO_COORDINATOR", "");
      RETURN_IF_ERROR(checkCoordinatorEnv(plan_.coordinator));
      plan_.ranks = placeRanks({opts_.np});
      return okStatus();
    }
    return startEmbedded(opts_.agents);
  }

  // Several hosts: each runs its own agent at --agent-socket; ranks on other
  // hosts start through ssh.
  std::vector<int> slots;
  for (auto& h : hosts) slots.push_back(h.slots);
  ASSIGN_OR_RETURN(std::vector<int> per_node, fillSlots(opts_.np, slots));
  for (size_t i = 0; i < per_node.size(); ++i) {
    bool local = isLocalHost(hosts[i].host);
    if (local && !system_agent) {
      return unavailable("no kolo-agent is listening at " + opts_.agent_socket +
                         " on this machine (" + explainSocketError(opts_.agent_socket, socket_err) +
                         "); a multi-host job needs a running kolo-agent on every host");
    }
    NodeEndpoint node{hosts[i].host, local, "", opts_.agent_socket, ""};
    if (local) node.agent_rpc = envOr("KOLO_AGENT_RPC", "");
    plan_.nodes.push_back(node);
  }
  plan_.coordinator = envOr("KOLO_COORDINATOR", "");
  RETURN_IF_ERROR(checkCoordinatorEnv(plan_.coordinator));
  plan_.ranks = placeRanks(per_node);
  return okStatus();
}

Status JobRunner::startEmbedded(int num_agents) {
  EmbeddedOptions eo;
  ASSIGN_OR_RETURN(eo.coordinator_bin, findKoloProgram("kolo-coordinator", "KOLO_COORDINATOR_BIN"));
  ASSIGN_OR_RETURN(eo.agent_bin, findKoloProgram("kolo-agent", "KOLO_AGENT_BIN"));
  eo.num_agents = num_agents;
  eo.log_level = opts_.log_level;
  eo.verbose = opts_.verbose;
  eo.start_timeout = std::chrono::seconds(opts_.start_timeout_s);
  // With its timeline directory: the agent writes timelines only inside it.
  eo.agent_env = embeddedAgentEnv(opts_, processEnvironment(), currentDirectory());
  auto cancelled = [this] {
    for (int sig : sup_->takeSignals()) {
      if (received_signal_ == 0) received_signal_ = sig;
    }
    return received_signal_ != 0;
  };
  ASSIGN_OR_RETURN(daemons_, EmbeddedDaemons::create(*sup_, std::move(eo)));
  RETURN_IF_ERROR(daemons_->start(cancelled));
  if (opts_.verbose) {
    say("embedded kolo-coordinator at " + daemons_->coordinatorAddress() + " and " +
        std::to_string(num_agents) + " kolo-agent(s); logs in " + daemons_->dir());
  }
  plan_.coordinator = daemons_->coordinatorAddress();
  // Every rank is on this machine: they share its cores (torch's intra-op
  // pool takes every core by default, so np ranks would run np threads per
  // core), unless the user set OMP_NUM_THREADS (as torchrun does).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    plan_.extra_env["OMP_NUM_THREADS"] =
        std::to_string(std::max(1, usableCpus() / std::max(1, opts_.np)));
  }
  // The ranks' KOLO_COORDINATOR and KOLO_AGENT_RPC name the private plain-text
  // daemons: `kolo` inside a rank must not use TLS settings meant for others.
  for (auto& [k, v] : privateClientEnv()) plan_.extra_env[k] = v;
  // ...except the token file of the private agents' admin calls (`kolo drain`).
  plan_.extra_env["KOLO_AGENT_TOKEN_FILE"] = daemons_->adminTokenFile();
  // The private agents stop with the job: libkolo's messages must not send
  // users to `kolo job` afterwards.
  plan_.extra_env["KOLO_EMBEDDED_AGENT"] = "1";
  for (const EmbeddedAgent& a : daemons_->agents()) {
    plan_.nodes.push_back({"localhost", true, a.id, a.socket, a.rpc_address});
  }
  plan_.ranks = placeRanks(evenBlocks(opts_.np, num_agents));
  return okStatus();
}

Status JobRunner::spawnRanks() {
  for (const RankPlacement& p : plan_.ranks) {
    struct stat st{};
    if (!plan_.wdir.empty() && plan_.nodes[static_cast<size_t>(p.node)].local &&
        (::stat(plan_.wdir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
      return invalidArgument("--wdir " + plan_.wdir + ": no such directory on this machine");
    }
  }
  ranks_.resize(static_cast<size_t>(plan_.size()));
  if (!opts_.output_filename.empty()) {
    // Horovod's layout: DIR/rank.N/stdout and DIR/rank.N/stderr, N padded
    // with zeros to the width of the last rank (rank.07 of 16 ranks).
    const size_t width = std::to_string(std::max(plan_.size() - 1, 0)).size();
    for (int r = 0; r < plan_.size(); ++r) {
      std::string n = std::to_string(r);
      n.insert(0, width - std::min(width, n.size()), '0');
      const std::string dir = opts_.output_filename + "/rank." + n;
      RETURN_IF_ERROR(makeDirs(dir, 0755).withContext("--output-filename"));
      RankState& rs = ranks_[static_cast<size_t>(r)];
      const std::pair<UniqueFd*, const char*> files[] = {{&rs.output_file, "/stdout"},
                                                         {&rs.error_file, "/stderr"}};
      for (auto [file, name] : files) {
        const std::string path = dir + name;
        file->reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        if (!file->valid()) return errnoStatus("--output-filename: cannot create " + path, errno);
      }
    }
  }
  started_ = Clock::now();
  for (int r = 0; r < plan_.size() && !kill_deadline_; ++r) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    auto forward = [](int fd, std::string prefix, const UniqueFd& copy) {
      const int file = copy.valid() ? copy.get() : -1;
      return [fd, file, prefix = std::move(prefix)](std::string_view line) {
        std::string out = prefix;
        out.append(line);
        out += '\n';
        writeAll(fd, out);
        if (file >= 0) writeAll(file, std::string_view(out).substr(prefix.size()));
      };
    };
    SpawnSpec spec;
    spec.name = "rank " + std::to_string(r);
    spec.argv = rankArgv(plan_, r);
    if (plan_.nodes[static_cast<size_t>(plan_.ranks[static_cast<size_t>(r)].node)].local) {
      spec.env = rankEnv(plan_, r);
      spec.cwd = plan_.wdir;
    } else {
      spec.stdin_data = rankStdin(plan_, r);  // the job token: never on ssh's command line
    }
    const std::string tag = std::to_string(r);
    spec.on_stdout =
        forward(STDOUT_FILENO, std::string("[").append(tag).append("]<stdout>:"), rs.output_file);
    spec.on_stderr =
        forward(STDERR_FILENO, std::string("[").append(tag).append("]<stderr>:"), rs.error_file);
    spec.on_exit = [this, r](const ExitInfo& info) { onRankExit(r, info); };
    auto id = sup_->spawn(std::move(spec));
    if (!id.isOk()) return id.status().withContext("cannot start rank " + std::to_string(r));
    rs.child = *id;
  }
  return okStatus();
}

void JobRunner::onRankExit(int rank, const ExitInfo& info) {
  RankState& rs = ranks_[static_cast<size_t>(rank)];
  rs.done = true;
  rs.exit = info;
  if (info.success() || kill_deadline_) return;  // a failure after we began stopping is expected
  if (info.exec_errno != 0) {
    say("rank " + std::to_string(rank) + ": cannot run '" + plan_.command.front() + "': " +
        std::strerror(info.exec_errno));
  }
  say("rank " + std::to_string(rank) + " " +
      (info.exited ? "exited with code " + std::to_string(info.code) : "exited with signal " + signalName(info.signal)));
  failed_rank_ = rank;
  exit_code_ = info.shellCode();
  stopRanks(SIGTERM);
}

void JobRunner::stopRanks(int sig) {
  for (auto& rs : ranks_) {
    if (rs.child >= 0 && sup_->running(rs.child)) sup_->signalGroup(rs.child, sig);
  }
  if (!kill_deadline_) kill_deadline_ = Clock::now() + kKillGrace;
}

void JobRunner::superviseRanks() {
  auto all_done = [this] {
    for (auto& rs : ranks_) {
      if (rs.child >= 0 && sup_->running(rs.child)) return false;
    }
    return true;
  };
  while (!all_done()) {
    auto timeout = std::chrono::milliseconds(1000);
    if (kill_deadline_ && !killed_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ - Clock::now());
      timeout = std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0), timeout);
    }
    sup_->pump(timeout);
    for (int sig : sup_->takeSignals()) {
      if (received_signal_ == 0 && !kill_deadline_) {
        received_signal_ = sig;
        exit_code_ = 128 + sig;
        say("got " + signalName(sig) + "; stopping the ranks");
        stopRanks(sig);
      } else if (!killed_) {
        say("got " + signalName(sig) + " while stopping; killing the ranks now");
        stopRanks(SIGKILL);
        killed_ = true;
      }
    }
    if (daemons_ && daemons_->failure() && !daemon_failed_) {
      daemon_failed_ = true;
      say(*daemons_->failure());
      if (!kill_deadline_) {
        exit_code_ = 1;
        say("stopping the ranks");
        stopRanks(SIGTERM);
      }
    }
    if (kill_deadline_ && !killed_ && Clock::now() >= *kill_deadline_) {
      std::vector<int> stuck;
      for (int r = 0; r < plan_.size(); ++r) {
        const RankState& rs = ranks_[static_cast<size_t>(r)];
        if (rs.child >= 0 && sup_->running(rs.child)) stuck.push_back(r);
      }
      if (!stuck.empty()) {
        say("rank(s) " + rankList(stuck) + " did not stop within " + seconds(kKillGrace) + "; sending SIGKILL");
      }
      stopRanks(SIGKILL);
      killed_ = true;
    }
  }
  finished_ = Clock::now();
  // What a rank left behind in its process group goes with it.
  std::vector<int> children;
  for (auto& rs : ranks_) {
    if (rs.child < 0) continue;
    sup_->signalGroup(rs.child, SIGTERM);
    children.push_back(rs.child);
  }
  sup_->drainOutput(children, Clock::now() + kDrainTime);
}

void JobRunner::printSummary() {
  const int n = plan_.size();
  const bool failed = exit_code_ != 0;
  if (srun_) {  // one srun step: srun reports the tasks that failed
    say(std::to_string(n) + (n == 1 ? " rank" : " ranks") + " finished in " +
        seconds(finished_ - started_) + " as one srun step, " +
        (received_signal_ != 0 ? "stopped by " + signalName(received_signal_)
         : failed_rank_ ? "rank " + std::to_string(*failed_rank_) + " failed (exited with code " +
                              std::to_string(srun_failed_code_) + ")"
         : failed ? "which failed (" + ranks_[0].exit.describe() + ")"
                  : std::string("all succeeded")));
    return;
  }
  if (opts_.verbose || failed) {
    for (int r = 0; r < n; ++r) {
      const RankState& rs = ranks_[static_cast<size_t>(r)];
      if (!rs.done) {
        say("rank " + std::to_string(r) + " was not started");
        continue;
      }
      std::string how = rs.exit.describe();
      bool stopped_by_us = kill_deadline_ && failed_rank_ != r && !rs.exit.success();
      say("rank " + std::to_string(r) + " " + how + " after " + seconds(rs.exit.wall) +
          (stopped_by_us ? " (stopped by kolorun)" : ""));
    }
  }
  std::string total = std::to_string(n) + (n == 1 ? " rank" : " ranks") + " finished in " +
                      seconds(finished_ - started_) + ", ";
  if (failed_rank_) {
    const ExitInfo& e = ranks_[static_cast<size_t>(*failed_rank_)].exit;
    total += "rank " + std::to_string(*failed_rank_) + " failed (" + e.describe() + ")";
  } else if (received_signal_ != 0) {
    total += "stopped by " + signalName(received_signal_);
  } else if (daemon_failed_) {
    total += "stopped because an embedded daemon failed";
  } else if (exit_code_ != 0) {
    total += "failed";
  } else {
    total += "all succeeded";
  }
  say(total);
}

}  // namespace kolo::cli
