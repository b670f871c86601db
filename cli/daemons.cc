#include "cli/daemons.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/launch_plan.h"

namespace kolo::cli {

namespace {

std::string indent(const std::string& text) {
  if (text.empty()) return "  (the log is empty)";
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) out += "  " + line + "\n";
  if (!out.empty()) out.pop_back();
  return out;
}

std::string secondsText(std::chrono::milliseconds ms) {
  std::ostringstream o;
  o << static_cast<double>(ms.count()) / 1000.0 << " s";
  return o.str();
}

}  // namespace

StatusOr<std::string> findKoloProgram(const std::string& name, const char* override_env) {
  if (override_env != nullptr) {
    if (const char* o = std::getenv(override_env); o != nullptr && *o != '\0') {
      if (!isExecutableFile(o)) {
        return invalidArgument(std::string(override_env) + "=" + o + " is not an executable file");
      }
      return std::string(o);
    }
  }
  std::string self_dir;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    self_dir = self.parent_path().string();
    std::string candidate = self_dir + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
  }
  if (name.find('/') == std::string::npos) {
    if (auto found = findExecutable(name)) return *found;
  }
  std::string hint = override_env != nullptr ? std::string(", or set ") + override_env : "";
  return unavailable("cannot find " + name + ": it is neither next to this program (in " + self_dir +
                     ") nor on PATH; build it (ninja " + name + ") or install kolo" + hint);
}

std::string fileTail(const std::string& path, int max_lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  std::string out;
  for (auto& l : lines) out += l + "\n";
  return out;
}

std::optional<std::string> readReadyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.empty() || s.back() != '\n') return std::nullopt;  // not complete yet
  // The address is the first word; what follows (e.g. "metrics=host:port")
  // is for other readers.
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return std::nullopt;
  size_t e = s.find_first_of(" \t\r\n", b);
  return s.substr(b, e - b);
}

StatusOr<std::unique_ptr<EmbeddedDaemons>> EmbeddedDaemons::create(Supervisor& sup, EmbeddedOptions opts) {
  std::unique_ptr<EmbeddedDaemons> d(new EmbeddedDaemons(sup, std::move(opts)));
  RETURN_IF_ERROR(d->makeDir());
  return d;
}

Status EmbeddedDaemons::start(const std::function<bool()>& cancelled) {
  // The coordinator first: the agents register with it.
  std::string ready = dir_ + "/coordinator.ready";
  coordinator_log_ = dir_ + "/coordinator.log";
  std::vector<std::string> argv = {opts_.coordinator_bin, "--listen", "127.0.0.1:0", "--ready-file", ready};
  argv.insert(argv.end(), opts_.coordinator_args.begin(), opts_.coordinator_args.end());
  if (!opts_.log_level.empty()) {
    argv.push_back("--log-level");
    argv.push_back(opts_.log_level);
  }
  // The private coordinator serves plain text on loopback, and its agents
  // dial it so: TLS and token settings meant for a shared coordinator
  // (exported for the system agent or the kolo CLI) must not leak into them.
  auto child = spawnDaemon("coordinator", argv, privateCoordinatorEnv(), coordinator_log_);
  RETURN_IF_ERROR(child.status());
  coordinator_child_ = *child;
  RETURN_IF_ERROR(waitReady({{"kolo-coordinator", coordinator_child_, ready, coordinator_log_}}, cancelled));
  coordinator_address_ = *readReadyFile(ready);

  std::vector<std::tuple<std::string, int, std::string, std::string>> waits;
  const int n = opts_.agent_ids.empty() ? opts_.num_agents : static_cast<int>(opts_.agent_ids.size());
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(EmbeddedAgent * a,
                     spawnAgent(opts_.agent_ids.empty() ? embeddedAgentId(i, opts_.num_agents) : opts_.agent_ids[i]));
    waits.emplace_back("kolo-agent " + a->id, a->child, a->ready_file, a->log_path);
  }
  RETURN_IF_ERROR(waitReady(waits, cancelled));
  for (auto& a : agents_) a.rpc_address = *readReadyFile(a.ready_file);
  return okStatus();
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

StatusOr<EmbeddedAgent*> EmbeddedDaemons::spawnAgent(const std::string& id) {
  EmbeddedAgent a;
  a.id = id;
  std::string base = dir_ + "/agent-" + std::to_string(next_agent_++);
  a.socket = base + ".sock";
  a.ready_file = base + ".ready";
  a.log_path = base + ".log";
  std::vector<std::string> argv = {
      opts_.agent_bin, "--socket", a.socket, "--coordinator", coordinator_address_, "--rpc-listen",
      "127.0.0.1:0", "--rpc-auth-token-file", admin_token_file_, "--ready-file", a.ready_file,
      "--agent-id", a.id,
      // Several agents (and maybe a system agent) share this machine: no fixed port.
      "--metrics-listen", "127.0.0.1:0"};
  // Agents sharing this machine split its cores: each one's reduction pool
  // gets its share (by default a pool takes every core, and K agents on one
  // machine would each run one thread per core), unless the user set it.
  const char* user_threads = std::getenv("KOLO_REDUCE_THREADS");
  const bool env_threads =
      std::any_of(opts_.agent_env.begin(), opts_.agent_env.end(),
                  [](const auto& kv) { return kv.first == "KOLO_REDUCE_THREADS"; });
  if ((user_threads == nullptr || *user_threads == '\0') && !env_threads) {
    const int k = std::max<int>(
        1, opts_.agent_ids.empty() ? opts_.num_agents : static_cast<int>(opts_.agent_ids.size()));
    argv.push_back("--reduce-threads");
    argv.push_back(std::to_string(std::max(1, usableCpus() / k)));
  }
  if (opts_.elastic) {  // each agent stands for one host: the coordinator orders agents by it
    argv.push_back("--hostname");
    argv.push_back(a.id);
  }
  if (!opts_.log_level.empty()) {
    argv.push_back("--log-level");
    argv.push_back(opts_.log_level);
  }
  auto env = opts_.agent_env;
  for (auto& kv : privateAgentEnv()) env.push_back(kv);
  auto c = spawnDaemon(a.id, argv, std::move(env), a.log_path);
  RETURN_IF_ERROR(c.status());
  a.child = *c;
  agents_.push_back(std::move(a));
  return &agents_.back();
}

StatusOr<EmbeddedAgent> EmbeddedDaemons::addAgent(const std::string& id, const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(EmbeddedAgent * a, spawnAgent(id));
  std::string label = "kolo-agent " + id;
  int child = a->child;
  std::string ready = a->ready_file, log = a->log_path;
  RETURN_IF_ERROR(waitReady({{label, child, ready, log}}, cancelled));
  for (auto& x : agents_) {
    if (x.child == child) {
      x.rpc_address = *readReadyFile(x.ready_file);
      return x;
    }
  }
  return internalError("agent " + id + " vanished");
}

void EmbeddedDaemons::stopAgent(const std::string& id) {
  std::vector<int> ids;
  for (auto& a : agents_) {
    if (a.id == id && sup_.running(a.child)) ids.push_back(a.child);
  }
  stopped_agents_.push_back(id);
  stopChildren(ids);
}

std::vector<std::string> EmbeddedDaemons::takeLostAgents() { return std::exchange(lost_agents_, {}); }

EmbeddedDaemons::~EmbeddedDaemons() { stop(); }

std::vector<std::pair<std::string, std::string>> privateCoordinatorEnv() {
  return {{"KOLO_TLS_CERT", ""}, {"KOLO_TLS_KEY", ""}, {"KOLO_TLS_CLIENT_CA", ""}, {"KOLO_AUTH_TOKEN_FILE", ""}};
}

std::vector<std::pair<std::string, std::string>> privateClientEnv() {
  auto env = privateAgentEnv();
  for (auto& [k, v] : privateAgentEnv()) {
    env.emplace_back("KOLO_AGENT_" + k.substr(std::string("KOLO_COORDINATOR_").size()), v);
  }
  return env;
}

std::vector<std::pair<std::string, std::string>> privateAgentEnv() {
  return {{"KOLO_COORDINATOR_CA", ""},          {"KOLO_COORDINATOR_TLS", "false"},
          {"KOLO_COORDINATOR_CERT", ""},        {"KOLO_COORDINATOR_KEY", ""},
          {"KOLO_COORDINATOR_SERVER_NAME", ""}, {"KOLO_COORDINATOR_TOKEN", ""},
          {"KOLO_COORDINATOR_TOKEN_FILE", ""}};
}

Status EmbeddedDaemons::makeDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string root = (tmp != nullptr && *tmp != '\0') ? tmp : "/tmp";
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  std::string templ = root + "/kolorun-XXXXXX";
  // The agents' sockets live here: check the length limit up front.
  sockaddr_un addr;
  size_t longest = templ.size() + std::string("/agent-").size() +
                   std::to_string(opts_.num_agents).size() + std::string(".sock").size();
  if (longest >= sizeof addr.sun_path) {
    return invalidArgument("the temporary directory " + root + " is too long for Unix socket paths (limit " +
                           std::to_string(sizeof addr.sun_path - 1) + " bytes); set TMPDIR to a shorter one");
  }
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return errnoStatus("cannot create a directory in " + root, errno);
  dir_ = buf.data();
  ::chmod(dir_.c_str(), 0700);
  sup_.removeOnDeath(dir_);  // kolorun SIGKILLed: its reaper removes it
  // The agents' admin token: in a file (0600, in this 0700 directory), never
  // on a command line.
  ASSIGN_OR_RETURN(JobIdentity admin, newJobIdentity());
  admin_token_file_ = dir_ + "/agent-admin.token";
  UniqueFd tf(::open(admin_token_file_.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!tf.valid()) return errnoStatus("cannot create " + admin_token_file_, errno);
  const std::string line = admin.token + "\n";
  if (::write(tf.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return errnoStatus("cannot write " + admin_token_file_, errno);
  }
  inotify_.reset(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (inotify_.valid()) {
    ::inotify_add_watch(inotify_.get(), dir_.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE);
  }
  return okStatus();
}

StatusOr<int> EmbeddedDaemons::spawnDaemon(const std::string& label, std::vector<std::string> argv,
                                           std::vector<std::pair<std::string, std::string>> env,
                                           const std::string& log_path) {
  SpawnSpec spec;
  spec.name = label;
  spec.argv = std::move(argv);
  spec.env = std::move(env);
  std::string program = label == "coordinator" ? "kolo-coordinator" : "kolo-agent " + label;
  spec.on_exit = [this, program, log_path](const ExitInfo& info) { onDaemonExit(program, log_path, info); };
  if (!opts_.verbose) {
    spec.log_path = log_path;
  } else {
    // kolorun writes the log itself and echoes each line, prefixed.
    auto fd = std::make_unique<UniqueFd>(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!fd->valid()) return errnoStatus("cannot open " + log_path, errno);
    int raw = fd->get();
    log_fds_.push_back(std::move(fd));
    std::string prefix = "[" + label + "] ";
    auto echo = [raw, prefix](std::string_view line) {
      std::string l(line);
      l += '\n';
      writeAll(raw, l);
      writeAll(STDERR_FILENO, prefix + l);
    };
    spec.on_stdout = echo;
    spec.on_stderr = echo;
  }
  return sup_.spawn(std::move(spec));
}

Status EmbeddedDaemons::waitReady(
    const std::vector<std::tuple<std::string, int, std::string, std::string>>& waits,
    const std::function<bool()>& cancelled) {
  if (inotify_.valid()) {
    sup_.watch(inotify_.get(), [this] {
      char buf[4096];
      while (::read(inotify_.get(), buf, sizeof buf) > 0) {
      }
    });
  }
  bool was_cancelled = false;
  std::string dead;
  auto all_ready = [&] {
    if (cancelled()) {
      was_cancelled = true;
      return true;
    }
    bool all = true;
    for (auto& [label, child, ready, log] : waits) {
      if (readReadyFile(ready)) continue;
      if (!sup_.running(child)) {
        dead = label;
        return true;
      }
      all = false;
    }
    return all;
  };
  bool ok = sup_.pumpUntil(all_ready, Clock::now() + opts_.start_timeout);
  if (inotify_.valid()) sup_.unwatch(inotify_.get());
  if (was_cancelled) return aborted("interrupted while starting the embedded daemons");
  if (!dead.empty()) {
    keep_logs_ = true;
    return unavailable(*failure_);
  }
  if (!ok) {
    for (auto& [label, child, ready, log] : waits) {
      if (readReadyFile(ready)) continue;
      keep_logs_ = true;
      return timedOut(label + " did not become ready within " + secondsText(opts_.start_timeout) +
                      " (--start-timeout); the end of its log (" + log + "):\n" + indent(fileTail(log, 20)));
    }
  }
  return okStatus();
}

void EmbeddedDaemons::onDaemonExit(const std::string& program, const std::string& log_path,
                                   const ExitInfo& info) {
  if (stopping_) return;
  const std::string agent_prefix = "kolo-agent ";
  if (opts_.elastic && program.rfind(agent_prefix, 0) == 0) {
    std::string id = program.substr(agent_prefix.size());
    if (std::find(stopped_agents_.begin(), stopped_agents_.end(), id) != stopped_agents_.end()) return;
    keep_logs_ = true;
    lost_agents_.push_back(id);
    writeAll(STDERR_FILENO, "kolorun: " + program + " " + info.describe() + "; the elastic job goes on without it (" +
                                log_path + ")\n");
    return;
  }
  keep_logs_ = true;
  if (failure_) return;  // the first failure is the one to report
  failure_ = program + " " + info.describe() + " unexpectedly; the end of its log (" + log_path + "):\n" +
             indent(fileTail(log_path, 20));
}

void EmbeddedDaemons::stopChildren(const std::vector<int>& ids) {
  for (int id : ids) {
    if (sup_.running(id)) sup_.signalGroup(id, SIGTERM);
  }
  auto all_gone = [&] {
    for (int id : ids) {
      if (sup_.running(id)) return false;
    }
    return true;
  };
  if (!sup_.pumpUntil(all_gone, Clock::now() + opts_.stop_grace)) {
    for (int id : ids) {
      if (!sup_.running(id)) continue;
      std::string msg = "kolorun: " + sup_.name(id) + " did not stop within " +
                        secondsText(opts_.stop_grace) + " of SIGTERM; sending SIGKILL\n";
      writeAll(STDERR_FILENO, msg);
      sup_.signalGroup(id, SIGKILL);
    }
    // SIGKILL cannot be ignored; the bound only guards against a D-state child.
    sup_.pumpUntil(all_gone, Clock::now() + std::chrono::seconds(5));
  }
}

void EmbeddedDaemons::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  std::vector<int> agents;
  for (auto& a : agents_) agents.push_back(a.child);
  stopChildren(agents);
  if (coordinator_child_ >= 0) stopChildren({coordinator_child_});
  log_fds_.clear();
  if (dir_.empty()) return;
  std::error_code ec;
  if (!keep_logs_) {
    std::filesystem::remove_all(dir_, ec);
    return;
  }
  for (auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".log") std::filesystem::remove(entry.path(), ec);
  }
  writeAll(STDERR_FILENO, "kolorun: the daemons' logs are kept in " + dir_ + "\n");
}

}  // namespace kolo::cli
