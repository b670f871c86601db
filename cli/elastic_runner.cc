#include "cli/elastic_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

namespace kolo::cli {

namespace {

constexpr auto kKillGrace = std::chrono::seconds(5);
constexpr auto kDiscoveryInterval = std::chrono::seconds(1);
constexpr auto kDiscoveryTimeout = std::chrono::seconds(10);
constexpr auto kRestartDelay = std::chrono::seconds(1);

std::string envOr(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : dflt;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

StatusOr<std::vector<HostSlots>> parseDiscoveryOutput(std::string_view text, std::string_view origin) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  size_t pos = 0;
  int line_no = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view raw = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    auto parsed = parseHostList(line);
    if (!parsed.isOk() || parsed->size() != 1) {
      return invalidArgument(std::string(origin) + " line " + std::to_string(line_no) + ": '" + line +
                             "' is not \"host:slots\"" + (parsed.isOk() ? "" : " (" + parsed.status().message() + ")"));
    }
    if (!seen.insert((*parsed)[0].host).second) {
      return invalidArgument(std::string(origin) + " lists host " + (*parsed)[0].host + " twice");
    }
    hosts.push_back((*parsed)[0]);
  }
  return hosts;
}

void ElasticRunner::say(const std::string& line) const { writeAll(STDERR_FILENO, "kolorun: " + line + "\n"); }

StatusOr<std::vector<HostSlots>> ElasticRunner::fixedHosts() const {
  if (!opts_.hosts.empty()) return parseHostList(opts_.hosts);
  std::ifstream in(opts_.hostfile);
  if (!in) return invalidArgument("cannot read the hostfile " + opts_.hostfile);
  std::stringstream ss;
  ss << in.rdbuf();
  return parseHostfile(ss.str(), opts_.hostfile);
}

StatusOr<std::vector<HostSlots>> ElasticRunner::discover() {
  if (opts_.host_discovery_script.empty()) return fixedHosts();
  std::string out;
  SpawnSpec spec;
  spec.name = "host discovery script";
  spec.argv = {"/bin/sh", "-c", opts_.host_discovery_script};
  spec.on_stdout = [&out](std::string_view line) {
    out.append(line);
    out += '\n';
  };
  spec.on_stderr = [this](std::string_view line) { say("host discovery script: " + std::string(line)); };
  std::optional<ExitInfo> exit;
  spec.on_exit = [&exit](const ExitInfo& info) { exit = info; };
  ASSIGN_OR_RETURN(int id, sup_->spawn(std::move(spec)));
  if (!sup_->pumpUntil([&] { return exit.has_value(); }, Clock::now() + kDiscoveryTimeout)) {
    sup_->signalGroup(id, SIGKILL);
    sup_->pumpUntil([&] { return exit.has_value(); }, Clock::now() + std::chrono::seconds(5));
    return timedOut("--host-discovery-script did not finish within 10 s");
  }
  if (!exit->success()) return unavailable("--host-discovery-script " + exit->describe());
  return parseDiscoveryOutput(out, "--host-discovery-script output");
}

int ElasticRunner::placedRanks() const {
  int n = 0;
  for (const Host& h : hosts_) {
    if (!h.removed && !h.lost) n += h.ranks;
  }
  return n;
}

Status ElasticRunner::startHost(Host& h, int ranks, int world) {
  if (!remote_ && (h.agent.child < 0 || h.removed)) {
    auto cancelled = [this] { return received_signal_ != 0; };
    ASSIGN_OR_RETURN(h.agent, daemons_->addAgent(h.name, cancelled));
  }
  h.removed = false;
  h.ranks = ranks;
  for (int l = 0; l < ranks; ++l) {
    Rank r;
    r.host = h.name;
    r.local_rank = l;
    r.local_size = ranks;
    r.world = world;
    r.id = next_rank_id_++;
    ranks_.push_back(r);
    spawnRank(ranks_.back());
  }
  return okStatus();
}

void ElasticRunner::spawnRank(Rank& r) {
  const Host* host = nullptr;
  for (const Host& h : hosts_) {
    if (h.name == r.host) host = &h;
  }
  LaunchPlan p = plan_;
  // Remote hosts (-H, --hostfile, or a discovery script with the agents'
  // socket named) run their own kolo-agent at --agent-socket; this machine's
  // ranks use it too. Else each host is an embedded agent here.
  const bool local = !remote_ || isLocalHost(r.host);
  p.nodes = {remote_ ? NodeEndpoint{r.host, local, "", opts_.agent_socket,
                                    local ? envOr("KOLO_AGENT_RPC", "") : ""}
                     : NodeEndpoint{"localhost", true, host->agent.id, host->agent.socket,
                                    host->agent.rpc_address}};
  p.ranks = {RankPlacement{r.id, 0, r.local_rank, r.local_size, 0, 1}};
  SpawnSpec spec;
  spec.name = "rank " + std::to_string(r.id) + " (host " + r.host + ", local rank " + std::to_string(r.local_rank) + ")";
  spec.argv = opts_.command;
  spec.env = rankEnv(p, 0);
  spec.cwd = plan_.wdir;
  // The world size the job had when this rank started: the coordinator
  // gives the rank its real rank and size with each generation.
  for (auto& [k, v] : spec.env) {
    if (k == "KOLO_SIZE" || k == "HOROVOD_SIZE") v = std::to_string(r.world);
  }
  // torchrun's variables (RANK, WORLD_SIZE, ...) are fixed for a process's
  // life, an elastic rank's numbers are not: an elastic rank gets none of them.
  static const char* const kTorchrun[] = {
      "RANK",        "LOCAL_RANK",       "WORLD_SIZE", "LOCAL_WORLD_SIZE",
      "GROUP_RANK",  "GROUP_WORLD_SIZE", "ROLE_RANK",  "ROLE_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT"};
  std::erase_if(spec.env, [](const auto& kv) {
    return std::any_of(std::begin(kTorchrun), std::end(kTorchrun),
                       [&](const char* n) { return kv.first == n; });
  });
  if (!local) {  // over ssh, as kolorun's -H ranks (the job token on ssh's stdin)
    spec.argv = sshArgv(p, r.host, spec.env);
    spec.stdin_data = secretStdin(spec.env);
    spec.env.clear();
    spec.cwd.clear();
  }
  const std::string tag = std::to_string(r.id);
  spec.on_stdout = [tag](std::string_view line) { writeAll(STDOUT_FILENO, "[" + tag + "]<stdout>:" + std::string(line) + "\n"); };
  spec.on_stderr = [tag](std::string_view line) { writeAll(STDERR_FILENO, "[" + tag + "]<stderr>:" + std::string(line) + "\n"); };
  const size_t index = static_cast<size_t>(&r - ranks_.data());
  spec.on_exit = [this, index](const ExitInfo& info) { onRankExit(index, info); };
  auto id = sup_->spawn(std::move(spec));
  if (!id.isOk()) {
    say("cannot start rank " + tag + ": " + id.status().message());
    failed_ = 1;
    stopAll(SIGTERM);
    return;
  }
  r.child = *id;
  r.running = true;
  r.restart_at.reset();
}

void ElasticRunner::onRankExit(size_t index, const ExitInfo& info) {
  Rank& r = ranks_[index];
  r.running = false;
  r.last_exit = info;
  if (info.success() || r.stopping || stopping_) return;
  const Host* host = nullptr;
  for (const Host& h : hosts_) {
    if (h.name == r.host) host = &h;
  }
  const std::string who = "rank " + std::to_string(r.id) + " (host " + r.host + ", local rank " +
                          std::to_string(r.local_rank) + ")";
  if (host == nullptr || host->lost || host->removed) return;
  const int left = placedRanks();
  if (left < opts_.min_np) {
    // The coordinator fails a job that stays below --min-np for
    // --elastic-timeout: a restarted rank would only join the FAILED job.
    say(who + " " + info.describe() + "; the job has " + std::to_string(left) +
        " rank(s) on its hosts, below --min-np " + std::to_string(opts_.min_np) +
        ", so it failed (or cannot go on): not restarting it; stopping the job. Add hosts (the "
        "discovery script) "
        "within --elastic-timeout, or lower --min-np");
    failed_ = info.shellCode() != 0 ? info.shellCode() : 1;
    stopAll(SIGTERM);
    return;
  }
  if (r.restarts < opts_.max_restarts) {
    ++r.restarts;
    r.restart_at = Clock::now() + kRestartDelay;
    say(who + " " + info.describe() + "; restarting it (restart " + std::to_string(r.restarts) + " of " +
        std::to_string(opts_.max_restarts) + ")");
    return;
  }
  say(who + " " + info.describe() + " and was restarted " + std::to_string(r.restarts) +
      " time(s) already (--max-restarts); stopping the job");
  failed_ = info.shellCode();
  stopAll(SIGTERM);
}

void ElasticRunner::onAgentLost(const std::string& id) {
  for (Host& h : hosts_) {
    if (h.agent.id != id || h.lost) continue;
    h.lost = true;
    say("host " + h.name + " lost its agent: its " + std::to_string(h.ranks) +
        " rank(s) are not restarted and the host is not used again");
    for (Rank& r : ranks_) {
      if (r.host == h.name && r.running) {
        r.stopping = true;
        sup_->signalGroup(r.child, SIGKILL);
      }
    }
  }
}

void ElasticRunner::applyDiscovery(const std::vector<HostSlots>& found) {
  std::set<std::string> names;
  for (const HostSlots& f : found) names.insert(f.host);
  for (Host& h : hosts_) {
    if (h.ranks == 0 || h.removed || h.lost || names.count(h.name)) continue;
    say("host " + h.name + " is gone from the discovered hosts: stopping its " + std::to_string(h.ranks) + " rank(s)");
    h.removed = true;
    for (Rank& r : ranks_) {
      if (r.host == h.name && r.running) {
        r.stopping = true;
        sup_->signalGroup(r.child, SIGTERM);
      }
      if (r.host == h.name) r.restart_at.reset();
    }
    if (!remote_) daemons_->stopAgent(h.agent.id);
    h.agent = EmbeddedAgent{};
    h.ranks = 0;
  }
  for (const HostSlots& f : found) {
    auto it = std::find_if(hosts_.begin(), hosts_.end(), [&](const Host& h) { return h.name == f.host; });
    if (it == hosts_.end()) {
      hosts_.push_back(Host{f.host, f.slots});
      it = hosts_.end() - 1;
    }
    Host& h = *it;
    if (h.lost || h.ranks > 0) continue;
    h.slots = f.slots;
    int placed = placedRanks();
    int take = f.slots;
    if (opts_.max_np > 0) take = std::min(take, opts_.max_np - placed);
    if (take <= 0) continue;  // at --max-np: the host waits
    say("host " + h.name + " discovered: starting " + std::to_string(take) + " rank(s) there (the job grows to " +
        std::to_string(placed + take) + ")");
    Status st = startHost(h, take, placed + take);
    if (!st.isOk()) {
      say("cannot use host " + h.name + ": " + st.message());
      h.lost = true;
    }
  }
}

bool ElasticRunner::anyRunningOrPending() const {
  for (const Rank& r : ranks_) {
    if (r.running || (r.restart_at && !stopping_)) return true;
  }
  return false;
}

void ElasticRunner::stopAll(int sig) {
  stopping_ = true;
  for (Rank& r : ranks_) {
    if (r.running) sup_->signalGroup(r.child, sig);
  }
}

Status ElasticRunner::startEmbedded(const std::vector<HostSlots>& found,
                                    const std::vector<int>& per) {
  EmbeddedOptions eo;
  ASSIGN_OR_RETURN(eo.coordinator_bin, findKoloProgram("kolo-coordinator", "KOLO_COORDINATOR_BIN"));
  ASSIGN_OR_RETURN(eo.agent_bin, findKoloProgram("kolo-agent", "KOLO_AGENT_BIN"));
  eo.log_level = opts_.log_level;
  eo.verbose = opts_.verbose;
  eo.start_timeout = std::chrono::seconds(opts_.start_timeout_s);
  // With its timeline directory: the agent writes timelines only inside it.
  eo.agent_env = embeddedAgentEnv(opts_, processEnvironment(), currentDirectory());
  eo.elastic = true;
  // A dead agent is found by its lease: 2 s here (5 s by default).
  eo.coordinator_args = {"--lease-ms", "2000", "--heartbeat-interval-ms", "400"};
  for (size_t i = 0; i < per.size(); ++i) {
    if (per[i] > 0) eo.agent_ids.push_back(found[i].host);
  }
  ASSIGN_OR_RETURN(daemons_, EmbeddedDaemons::create(*sup_, std::move(eo)));
  auto cancelled = [this] {
    for (int sig : sup_->takeSignals()) {
      if (received_signal_ == 0) received_signal_ = sig;
    }
    return received_signal_ != 0;
  };
  Status st = daemons_->start(cancelled);
  if (!st.isOk()) {
    daemons_->stop();
    return st;
  }
  plan_.coordinator = daemons_->coordinatorAddress();
  for (auto& [k, v] : privateClientEnv()) plan_.extra_env[k] = v;
  plan_.extra_env["KOLO_AGENT_TOKEN_FILE"] =
      daemons_->adminTokenFile();                // `kolo drain` on a private agent
  plan_.extra_env["KOLO_EMBEDDED_AGENT"] = "1";  // (gone after the job)
  return okStatus();
}

void ElasticRunner::setupPlan() {
  plan_.start_timeout_s = opts_.start_timeout_s;
  plan_.command = opts_.command;
  for (auto& [k, v] : tuningEnv(opts_)) plan_.extra_env[k] = v;
  plan_.user_env = userEnv(opts_, processEnvironment());
  plan_.wdir = opts_.wdir;
  plan_.ssh_options = sshOptions(opts_);
  plan_.extra_env["KOLO_MIN_NP"] = std::to_string(opts_.min_np);
  plan_.extra_env["KOLO_MAX_NP"] = std::to_string(opts_.max_np);
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", opts_.elastic_timeout_s);
  plan_.extra_env["KOLO_ELASTIC_TIMEOUT"] = timeout;
}

int ElasticRunner::run() {
  auto sup = Supervisor::create();
  if (!sup.isOk()) {
    say(sup.status().message());
    return 1;
  }
  sup_ = std::move(sup.value());
  // -H / --hostfile, or a discovery script with the agents' socket named:
  // real hosts, each with its kolo-agent (Horovod's elastic hosts).
  const char* env_socket = std::getenv("KOLO_AGENT_SOCKET");
  remote_ = !opts_.hosts.empty() || !opts_.hostfile.empty() ||
            opts_.agent_socket != kDefaultAgentSocket ||
            (env_socket != nullptr && *env_socket != '\0');

  std::vector<HostSlots> found;
  if (!opts_.host_discovery_script.empty() || remote_) {
    auto d = discover();
    if (!d.isOk()) {
      say(d.status().message());
      return 1;
    }
    found = *d;
  } else {
    std::vector<int> blocks = evenBlocks(opts_.np, opts_.agents);
    for (int i = 0; i < opts_.agents; ++i) found.push_back({embeddedAgentId(i, opts_.agents), blocks[i]});
  }
  std::vector<int> slots;
  for (auto& h : found) slots.push_back(h.slots);
  auto per = fillSlots(opts_.np, slots);
  if (!per.isOk()) {
    say(per.status().message() + " (the " +
        (opts_.host_discovery_script.empty() ? "given" : "discovered") + " hosts)");
    return 1;
  }
  for (size_t i = 0; i < found.size(); ++i) hosts_.push_back(Host{found[i].host, found[i].slots});

  if (remote_) {
    plan_.coordinator = envOr("KOLO_COORDINATOR", "");
  } else {
    Status st = startEmbedded(found, *per);
    if (!st.isOk()) {
      say(st.message());
      return received_signal_ != 0 ? 128 + received_signal_ : 1;
    }
  }
  auto job = newJobIdentity();
  if (!job.isOk()) {
    say(job.status().message());
    if (daemons_) daemons_->stop();
    return 1;
  }
  plan_.job = *job;
  setupPlan();
  size_t first_hosts = 0;
  for (int n : *per) first_hosts += n > 0 ? 1 : 0;
  say("elastic job " + plan_.job.job_id + ": " + std::to_string(opts_.np) + " rank(s) on " +
      std::to_string(first_hosts) + " host(s), --min-np " + std::to_string(opts_.min_np) +
      (opts_.max_np > 0 ? ", --max-np " + std::to_string(opts_.max_np) : "") +
      (remote_ ? "; the hosts' kolo-agents at " + opts_.agent_socket + " (remote ones over ssh)"
               : "; logs in " + daemons_->dir()));

  ranks_.reserve(1024);  // onRankExit captures indices; spawnRank takes references
  for (size_t i = 0; i < per->size(); ++i) {
    if ((*per)[i] == 0) continue;
    Host& h = hosts_[i];
    if (daemons_) {
      for (const EmbeddedAgent& a : daemons_->agents()) {
        if (a.id == h.name) h.agent = a;
      }
    }
    (void)startHost(h, (*per)[i], opts_.np);
  }
  return superviseAndFinish();
}

int ElasticRunner::superviseAndFinish() {
  auto next_discovery = Clock::now() + kDiscoveryInterval;
  std::optional<Clock::time_point> kill_at;
  const auto started = Clock::now();
  while (anyRunningOrPending()) {
    sup_->pump(std::chrono::milliseconds(200));
    for (int sig : sup_->takeSignals()) {
      if (received_signal_ == 0) {
        received_signal_ = sig;
        say("got " + signalName(sig) + "; stopping the ranks");
        stopAll(sig);
      } else {
        stopAll(SIGKILL);
      }
    }
    if (daemons_) {
      for (const std::string& id : daemons_->takeLostAgents()) onAgentLost(id);
    }
    if (stopping_) {
      if (!kill_at) kill_at = Clock::now() + kKillGrace;
      if (Clock::now() >= *kill_at) stopAll(SIGKILL);
      continue;
    }
    for (Rank& r : ranks_) {
      if (!r.restart_at || Clock::now() < *r.restart_at || stopping_) continue;
      bool usable = false;
      for (const Host& h : hosts_) usable = usable || (h.name == r.host && !h.lost && !h.removed);
      if (!usable) {
        r.restart_at.reset();
        continue;
      }
      spawnRank(r);
    }
    if (!opts_.host_discovery_script.empty() && Clock::now() >= next_discovery &&
        !stopping_) {  // (-H: fixed)
      auto d = discover();
      if (d.isOk()) {
        applyDiscovery(*d);
      } else {
        say(d.status().message() + "; keeping the current hosts");
      }
      next_discovery = Clock::now() + kDiscoveryInterval;
    }
  }

  int code = 0;
  int ok = 0, failed = 0;
  for (const Rank& r : ranks_) {
    bool gone = false;  // its host was removed or lost: not part of the outcome
    for (const Host& h : hosts_) gone = gone || (h.name == r.host && (h.lost || h.removed));
    if (r.stopping || gone || !r.last_exit) continue;
    (r.last_exit->success() ? ok : failed)++;
  }
  if (received_signal_ != 0) {
    code = 128 + received_signal_;
  } else if (failed_) {
    code = *failed_;
  } else if (failed > 0 || ok == 0) {
    code = 1;
  }
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", std::chrono::duration<double>(Clock::now() - started).count());
  say("elastic job " + plan_.job.job_id + ": " + std::to_string(ok) + " rank(s) succeeded, " +
      std::to_string(failed) + " failed, in " + secs + " s" + (code == 0 ? "" : " (exit code " + std::to_string(code) + ")"));
  if (daemons_) daemons_->stop();
  return code;
}

}  // namespace kolo::cli
