#include "cli/kolorun_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>

#include "cli/number_checks.h"

namespace kolo::cli {

namespace {

constexpr const char* kUsage =
    "kolorun: launch a kolo data-parallel job\n"
    "Usage: kolorun -np N [options] [--] command [args...]\n\n"
    "With no kolo-agent reachable at --agent-socket (or with --agents K > 1),\n"
    "kolorun starts a private kolo-coordinator and K kolo-agents for the job.\n"
    "Each rank's output lines are prefixed \"[rank]<stdout>:\" / \"[rank]<stderr>:\".";

#ifndef KOLO_VERSION_STRING
#define KOLO_VERSION_STRING "unknown"
#endif

// horovodrun flags kolorun refuses, with what to use instead. (Accepted
// ones are options below; a flag in neither list is an error too.)
struct Refused {
  const char* flag;
  const char* instead;
};
constexpr Refused kRefused[] = {
    {"--config-file", "kolorun reads no horovodrun YAML config; give the settings as kolorun flags or "
                      "HOROVOD_*/KOLO_* environment variables"},
    {"--network-interface", "kolo's cross-node traffic goes between the agents: choose the interface "
                            "with the agents' --rpc-listen address (kolo-agent --help)"},
    {"--nics", "kolo's cross-node traffic goes between the agents: choose the interface with the "
               "agents' --rpc-listen address (kolo-agent --help)"},
    {"--slots-per-host", "give each host's slots in -H host:N,... or as `host slots=N` lines of --hostfile"},
    {"--blacklist-cooldown-range", "kolo's elastic jobs do not blacklist hosts; a crashed rank is "
                                   "restarted up to --max-restarts times (docs/elastic.md)"},
    {"--reset-limit", "kolo's elastic jobs limit restarts per rank slot: use --max-restarts "
                      "(docs/elastic.md)"},
    {"--thread-affinity", "pin the ranks in the command itself (e.g. `numactl --physcpubind` or "
                          "`taskset`)"},
    {"--gloo-timeout-seconds", "kolo has no Gloo: use --start-timeout (forming the job) and "
                               "KOLO_OP_TIMEOUT (seconds a collective may wait)"},
    {"--gloo", "kolo has no Gloo or MPI controller: drop the flag"},
    {"--mpi", "kolo has no Gloo or MPI controller: drop the flag"},
    {"--mpi-args", "kolo has no MPI controller: drop the flag"},
    {"--jsrun", "kolo has no jsrun launcher: use -H/--hostfile"},
};

const Refused* findRefused(const std::string& name) {
  for (const Refused& r : kRefused) {
    if (name == r.flag) return &r;
  }
  return nullptr;
}

bool validEnvName(const std::string& n) {
  if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// What kolorun sets per rank (launch_plan.cc rankEnv): -x may not change it.
bool isJobVariable(const std::string& n) {
  static const char* const kNames[] = {
      "KOLO_AGENT_SOCKET",  "KOLO_JOB_ID",        "KOLO_JOB_TOKEN",
      "KOLO_RANK",          "KOLO_SIZE",          "KOLO_LOCAL_RANK",
      "KOLO_LOCAL_SIZE",    "KOLO_CROSS_RANK",    "KOLO_CROSS_SIZE",
      "HOROVOD_RANK",       "HOROVOD_SIZE",       "HOROVOD_LOCAL_RANK",
      "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
      "KOLO_COORDINATOR",   "KOLO_AGENT_RPC",     "RANK",
      "LOCAL_RANK",         "WORLD_SIZE",         "LOCAL_WORLD_SIZE",
      "GROUP_RANK",         "GROUP_WORLD_SIZE",   "ROLE_RANK",
      "ROLE_WORLD_SIZE"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; });
}

// The last -x of a name wins.
void setVarLater(std::vector<std::pair<std::string, std::string>>& env, const std::string& k,
                 const std::string& v) {
  for (auto& kv : env) {
    if (kv.first == k) {
      kv.second = v;
      return;
    }
  }
  env.emplace_back(k, v);
}

std::string versionText() { return std::string("kolorun (kolo) ") + KOLO_VERSION_STRING + "\n"; }

std::string checkBuildText() {
  return versionText() +
         "\nAvailable Frameworks:\n    [X] PyTorch (kolo.torch)\n"
         "\nAvailable Controllers:\n    [X] kolo (kolo-coordinator and a kolo-agent per node)\n"
         "    [ ] MPI\n    [ ] Gloo\n"
         "\nAvailable Tensor Operations:\n    [X] kolo-agent (CPU; CUDA when the agent is built with it)\n"
         "    [ ] NCCL\n    [ ] DDL\n    [ ] CCL\n    [ ] MPI\n    [ ] Gloo\n";
}

void defineOptions(CLI::App& app, KolorunOptions& o) {
  app.add_option("--np,--num-proc", o.np, "Number of ranks (also spelt -np)")
      ->required()
      ->check(positive());
  app.add_flag("--version", o.version, "Print kolorun's version and exit");
  app.add_flag("--check-build", o.check_build, "Print what this kolo build supports and exit");
  app.add_option(
         "--agents", o.agents,
         "Embedded mode: K agents on this machine acting as K nodes (ranks in contiguous blocks)")
      ->check(positive());
  app.add_option("-H,--hosts", o.hosts, "Hosts and slots, e.g. \"h1:2,h2:2\" (ranks start over ssh)");
  app.add_option("--hostfile", o.hostfile, "File of \"host slots=N\" lines")->check(CLI::ExistingFile);
  app.add_option("-x,--env", o.env_vars,
                 "Set VAR for every rank, local or remote: -x VAR=VALUE, or -x VAR for kolorun's own "
                 "value (mpirun's -x; repeat it)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--wdir", o.wdir,
                 "Working directory of every rank (default: kolorun's; on remote hosts: ssh's)");
  app.add_option("-p,--ssh-port", o.ssh_port, "ssh port for -H/--hostfile hosts")
      ->check(CLI::Range(1, 65535));
  app.add_option("-i,--ssh-identity-file", o.ssh_identity_file,
                 "ssh identity file (private key) for -H/--hostfile hosts")
      ->check(CLI::ExistingFile);
  app.add_option("--launcher", o.launcher,
                 "How ranks on other hosts start: ssh, srun (one Slurm step; hosts from the "
                 "allocation) or auto (srun inside an allocation without -H/--hostfile)")
      ->check(CLI::IsMember({"ssh", "srun", "auto"}));
  app.add_option("--agent-socket", o.agent_socket,
                 "The node agent's socket (default $KOLO_AGENT_SOCKET or /run/kolo/agent.sock)");
  app.add_option("--start-timeout", o.start_timeout_s,
                 "Seconds to wait for the daemons (and, in the ranks, for the job to form)")
      ->check(positive());
  app.add_flag("--verbose", o.verbose, "Print the plan, the daemons' output and a summary per rank");
  app.add_option("--log-level", o.log_level, "Log level of kolo (trace, debug, info, warn, error)");
  // Integers where the agent's knob is an integer, so a bad value fails here
  // and not later in the agent.
  app.add_option("--fusion-threshold-mb", o.fusion_threshold_mb, "Tensor Fusion buffer size in MiB")
      ->check(CLI::TypeValidator<uint64_t>());
  app.add_option("--cycle-time-ms", o.cycle_time_ms, "Fusion cycle time in milliseconds")
      ->check(nonNegative());
  app.add_option("--cache-capacity", o.cache_capacity, "Response cache capacity (entries)")
      ->check(CLI::TypeValidator<uint64_t>());
  app.add_option("--timeline-filename", o.timeline_filename, "Write a Chrome-trace timeline to this file");
  app.add_flag("--autotune,!--no-autotune", o.autotune,
               "Embedded agents tune the fusion threshold and algorithm switch point of multi-agent jobs "
               "(KOLO_AUTOTUNE)");
  app.add_flag_function(
      "--disable-cache", [&o](int64_t) { o.cache_capacity = "0"; },
      "No response cache (the same as --cache-capacity 0)");
  // horovodrun's knobs the agent reads as HOROVOD_* variables.
  auto env_option = [&app, &o](const std::string& flag, const std::string& var, const std::string& help) {
    return app.add_option_function<std::string>(
            flag, [&o, var](const std::string& v) { o.horovod_env.emplace_back(var, v); }, help + " (" + var + ")");
  };
  env_option("--autotune-log-file", "HOROVOD_AUTOTUNE_LOG", "Autotune: write the samples to this file");
  env_option("--autotune-warmup-samples", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
             "Autotune: samples discarded first")
      ->check(nonNegative());
  env_option("--autotune-steps-per-sample", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
             "Autotune: steps per sample")
      ->check(positive());
  env_option("--autotune-bayes-opt-max-samples", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
             "Autotune: the most samples Bayesian optimization takes")
      ->check(positive());
  env_option("--autotune-gaussian-process-noise", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
             "Autotune: the Gaussian process's noise regularization")
      ->check(nonNegative());
  env_option("--stall-check-warning-time-seconds", "HOROVOD_STALL_CHECK_TIME_SECONDS",
             "Seconds before the agent reports a stalled collective")
      ->check(nonNegative());
  env_option("--stall-check-shutdown-time-seconds", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
             "Seconds before a stalled collective fails the job (0: never)")
      ->check(nonNegative());
  app.add_flag_function(
      "--no-stall-check", [&o](int64_t) { o.horovod_env.emplace_back("HOROVOD_STALL_CHECK_DISABLE", "1"); },
      "Do not check for stalled collectives (HOROVOD_STALL_CHECK_DISABLE)");
  app.add_flag_function(
      "--timeline-mark-cycles,!--no-timeline-mark-cycles",
      [&o](int64_t n) { o.horovod_env.emplace_back("HOROVOD_TIMELINE_MARK_CYCLES", n > 0 ? "1" : "0"); },
      "Mark the agents' cycles in the timeline (HOROVOD_TIMELINE_MARK_CYCLES)");
  // kolo's agents always reduce within a node first and then across nodes
  // (one agent per node): horovodrun's hierarchical switches change nothing.
  app.add_flag_function(
      "--hierarchical-allreduce,--no-hierarchical-allreduce,--hierarchical-allgather,--no-hierarchical-allgather",
      [](int64_t) {},
      "Accepted for horovodrun compatibility: kolo's collectives are always hierarchical "
      "(within each node's agent, then across agents)");
  app.add_option("--output-filename", o.output_filename,
                 "Also write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr "
                 "(Horovod's layout)");
  app.add_option("--min-np,--min-num-proc", o.min_np,
                 "Elastic: the job goes on while it has at least this many ranks")
      ->check(positive());
  app.add_option("--max-np,--max-num-proc", o.max_np,
                 "Elastic: the most ranks the job admits as hosts are added")
      ->check(positive());
  app.add_option("--host-discovery-script", o.host_discovery_script,
                 "Elastic: a program printing the current hosts as \"host:slots\" lines (polled every second; "
                 "each host is one embedded agent on this machine)");
  app.add_option(
         "--elastic-timeout", o.elastic_timeout_s,
         "Elastic: seconds the job waits below --min-np for hosts before it fails (default 600)")
      ->check(positive());
  app.add_option("--max-restarts", o.max_restarts,
                 "Elastic: times a crashed rank is restarted before the job fails (default 3)")
      ->check(nonNegative());
}

// Splits the options from the command: the first word that is neither an
// option nor an option's value starts the command ("--" also ends them).
// The options go to `opts` (horovodrun's single-dash long ones as --name);
// the command's first word's index, or the error for a refused or unknown
// option.
StatusOr<size_t> splitOptions(const CLI::App& app, const std::vector<std::string>& args,
                              std::vector<std::string>* opts) {
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string t = args[i];
    if (t == "--") {
      ++i;
      break;
    }
    if (t.size() < 2 || t[0] != '-') break;
    // horovodrun's single-dash long options (-np, -hostfile, ...): read as
    // --name (never as a cluster of short flags: "-hostfile" is not -h).
    if (t[1] != '-' && t.find('=') != 2 && t.size() > 2) {
      std::string dashed = "-" + t.substr(0, t.find('='));
      if (app.get_option_no_throw(dashed) != nullptr || findRefused(dashed) != nullptr) t = "-" + t;
    }
    std::string name = t.substr(0, t.find('='));
    if (const Refused* r = findRefused(name)) {
      return invalidArgument(std::string("kolorun does not support horovodrun's ") + r->flag + ": " + r->instead);
    }
    if (name.size() > 2 && name[1] != '-') {  // -Hh1:2: a short option with its value attached
      const CLI::Option* shrt = app.get_option_no_throw(name.substr(0, 2));
      if (shrt == nullptr || shrt->get_expected_max() == 0) {
        return invalidArgument("unknown option " + t + " (see kolorun --help)");
      }
      name = name.substr(0, 2);
    }
    opts->push_back(t);
    bool inline_value = t.find('=') != std::string::npos || name.size() < t.size();
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (opt != nullptr && opt->get_expected_max() > 0 && !inline_value && i + 1 < args.size()) {
      opts->push_back(args[++i]);
    }
  }
  return i;
}

// The parsed options against each other and the environment.
Status checkOptions(KolorunOptions& o, const std::map<std::string, std::string>& env) {
  if (o.command.empty()) {
    return invalidArgument("no command given: kolorun -np N [options] [--] command [args...]");
  }
  if (!o.hosts.empty() && !o.hostfile.empty()) {
    return invalidArgument("give either -H/--hosts or --hostfile, not both");
  }
  if (o.agents > 1 && (!o.hosts.empty() || !o.hostfile.empty())) {
    return invalidArgument("--agents is for embedded agents on this machine; it cannot be combined "
                           "with -H/--hosts or --hostfile");
  }
  if (o.elastic()) {
    if (o.min_np == 0) o.min_np = o.np;
    if ((!o.hosts.empty() || !o.hostfile.empty()) && !o.host_discovery_script.empty()) {
      return invalidArgument(
          "give the elastic job's hosts either with --host-discovery-script or with "
          "-H/--hostfile (fixed hosts), not both");
    }
    if (o.min_np > o.np) {
      return invalidArgument("--min-np " + std::to_string(o.min_np) + " is more than -np " + std::to_string(o.np));
    }
    if (o.max_np != 0 && o.max_np < o.np) {
      return invalidArgument("--max-np " + std::to_string(o.max_np) + " is less than -np " + std::to_string(o.np));
    }
  } else if (o.max_np != 0) {
    return invalidArgument("--max-np needs an elastic job: give --min-np or --host-discovery-script");
  }
  if (!o.wdir.empty() && o.hosts.empty() && o.hostfile.empty() && !std::filesystem::is_directory(o.wdir)) {
    return invalidArgument("--wdir " + o.wdir + ": no such directory");
  }
  for (const std::string& e : o.env_vars) {
    std::string name = e.substr(0, e.find('='));
    if (!validEnvName(name)) {
      return invalidArgument("-x " + e + ": \"" + name + "\" is not a variable name (-x VAR or -x VAR=VALUE)");
    }
    if (isJobVariable(name)) {
      return invalidArgument("-x " + e + ": kolorun sets " + name + " itself for each rank");
    }
    if (e.find('=') == std::string::npos && env.count(name) == 0) {
      return invalidArgument("-x " + name + ": " + name + " is not set in kolorun's environment; give -x " + name +
                             "=VALUE");
    }
  }
  if (o.agents > o.np) {
    return invalidArgument("--agents " + std::to_string(o.agents) + " is more than -np " +
                           std::to_string(o.np) + ": every agent needs at least one rank");
  }
  return okStatus();
}

}  // namespace

StatusOr<KolorunOptions> parseKolorunArgs(const std::vector<std::string>& args,
                                          const std::map<std::string, std::string>& env) {
  KolorunOptions o;
  CLI::App app(kUsage, "kolorun");
  defineOptions(app, o);
  std::vector<std::string> opts;
  ASSIGN_OR_RETURN(size_t i, splitOptions(app, args, &opts));
  o.command.assign(args.begin() + static_cast<long>(i), args.end());
  for (const std::string& s : opts) {
    if (s == "--version" || s == "--check-build") {  // (no -np needed)
      o.version = s == "--version";
      o.check_build = !o.version;
      o.version_text = o.check_build ? checkBuildText() : versionText();
      return o;
    }
  }

  std::vector<const char*> argv = {"kolorun"};
  for (auto& s : opts) argv.push_back(s.c_str());
  bool help = false;
  for (auto& s : opts) help = help || s == "-h" || s == "--help";
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    help = true;
  } catch (const CLI::ParseError& e) {
    if (!help) {
      std::string what = e.what();
      if (what.find("--np is required") != std::string::npos) what = "-np N is required";
      return invalidArgument(what + " (see kolorun --help)");
    }
  }
  if (help) {
    o.help = true;
    o.help_text = app.help();
    return o;
  }

  if (o.agent_socket.empty()) {
    auto it = env.find("KOLO_AGENT_SOCKET");
    o.agent_socket = it != env.end() && !it->second.empty() ? it->second : kDefaultAgentSocket;
  }
  RETURN_IF_ERROR(checkOptions(o, env));
  return o;
}

std::vector<std::pair<std::string, std::string>> userEnv(const KolorunOptions& o,
                                                          const std::map<std::string, std::string>& env) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& e : o.env_vars) {
    size_t eq = e.find('=');
    std::string name = e.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = e.substr(eq + 1);
    } else if (auto it = env.find(name); it != env.end()) {
      value = it->second;
    }
    setVarLater(out, name, value);
  }
  return out;
}

std::vector<std::string> sshOptions(const KolorunOptions& o) {
  std::vector<std::string> out;
  if (o.ssh_port > 0) out.insert(out.end(), {"-p", std::to_string(o.ssh_port)});
  if (!o.ssh_identity_file.empty()) out.insert(out.end(), {"-i", o.ssh_identity_file});
  return out;
}

std::vector<std::pair<std::string, std::string>> tuningEnv(const KolorunOptions& o) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!o.fusion_threshold_mb.empty()) env.emplace_back("KOLO_FUSION_THRESHOLD_MB", o.fusion_threshold_mb);
  if (!o.cycle_time_ms.empty()) env.emplace_back("KOLO_CYCLE_TIME_MS", o.cycle_time_ms);
  if (!o.cache_capacity.empty()) env.emplace_back("KOLO_CACHE_CAPACITY", o.cache_capacity);
  if (!o.timeline_filename.empty()) env.emplace_back("KOLO_TIMELINE_FILENAME", o.timeline_filename);
  if (o.autotune) env.emplace_back("KOLO_AUTOTUNE", "1");
  if (!o.log_level.empty()) env.emplace_back("KOLO_LOG_LEVEL", o.log_level);
  for (const auto& kv : o.horovod_env) env.push_back(kv);
  return env;
}

namespace {

// "/a/./b//c/" -> "/a/b/c" (no ".." handling: the agent refuses those).
std::string lexicallyClean(const std::string& path) {
  std::string out;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    std::string c = path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    if (!c.empty() && c != ".") out += "/" + c;
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  return out.empty() ? "/" : out;
}

void setVar(std::vector<std::pair<std::string, std::string>>& env, const std::string& k,
            const std::string& v) {
  for (auto& kv : env) {
    if (kv.first == k) {
      kv.second = v;
      return;
    }
  }
  env.emplace_back(k, v);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> embeddedAgentEnv(
    const KolorunOptions& o, const std::map<std::string, std::string>& env,
    const std::string& cwd) {
  auto out = tuningEnv(o);
  if (env.count("KOLO_TIMELINE_DIR") != 0) return out;  // the user's choice, passed on as is
  std::string file = o.timeline_filename;
  for (const char* name : {"KOLO_TIMELINE_FILENAME", "HOROVOD_TIMELINE"}) {
    auto it = env.find(name);
    if (file.empty() && it != env.end()) file = it->second;
  }
  if (file.empty()) {
    setVar(out, "KOLO_TIMELINE_DIR", cwd);
    return out;
  }
  std::string abs = lexicallyClean(file.front() == '/' ? file : cwd + "/" + file);
  std::string dir = abs.substr(0, abs.rfind('/'));
  setVar(out, "KOLO_TIMELINE_FILENAME", abs);
  setVar(out, "KOLO_TIMELINE_DIR", dir.empty() ? "/" : dir);
  return out;
}

std::string currentDirectory() {
  std::error_code ec;
  auto p = std::filesystem::current_path(ec);
  return ec ? std::string("/") : p.string();
}

}  // namespace kolo::cli
