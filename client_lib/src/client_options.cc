#include "client_options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/config.h"
#include "common/launcher_env.h"

namespace kolo {

namespace {

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(s * 1000.0)));
}

Status missing(const std::string& var, const std::string& what) {
  return invalidArgument(
      var + " is not set (" + what +
      "). kolorun sets it for every rank it starts: run the program as "
      "`kolorun -np N <program>`, start it with srun or Open MPI's mpirun (docs/slurm.md), "
      "or set it yourself.");
}

bool has(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

// The job token of a direct launch: KOLO_JOB_TOKEN, else the file
// KOLO_JOB_TOKEN_FILE names, else (Slurm) the one the prolog wrote.
Status directLaunchToken(std::map<std::string, std::string>& env, const LauncherIdentity& id) {
  if (has(env, "KOLO_JOB_TOKEN")) return okStatus();
  std::string path;
  std::string named_by;
  if (has(env, "KOLO_JOB_TOKEN_FILE")) {
    path = env["KOLO_JOB_TOKEN_FILE"];
    named_by = "KOLO_JOB_TOKEN_FILE";
  } else if (id.launcher == "slurm") {
    std::string dir = has(env, "KOLO_JOB_TOKEN_DIR") ? env["KOLO_JOB_TOKEN_DIR"] : "/run/kolo/jobs";
    path = dir + "/" + id.slurm_job + ".token";
    named_by = "the kolo Slurm prolog (deploy/slurm/prolog.sh)";
  } else {
    return invalidArgument(
        "a rank started by " + id.launcher +
        " needs the job's token: export KOLO_JOB_TOKEN (the same random value for every rank, e.g. "
        "`export KOLO_JOB_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')` and `mpirun -x "
        "KOLO_JOB_TOKEN ...`) or KOLO_JOB_TOKEN_FILE (a file with it, readable by the ranks only)");
  }
  std::ifstream in(path);
  if (!in) {
    return invalidArgument(
        "cannot read the job token file " + path + " (named by " + named_by + "): " +
        (id.launcher == "slurm" && named_by != "KOLO_JOB_TOKEN_FILE"
             ? "is the kolo prolog configured on this node (Prolog= in slurm.conf, "
               "docs/slurm.md)? Or export KOLO_JOB_TOKEN before srun"
             : "no such file or no permission"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  if (token.empty()) return invalidArgument("the job token file " + path + " is empty");
  env["KOLO_JOB_TOKEN"] = token;
  return okStatus();
}

// Direct launch: the KOLO_* job variables from srun's or mpirun's.
StatusOr<std::optional<LauncherIdentity>> applyLauncher(std::map<std::string, std::string>& env) {
  if (has(env, "KOLO_JOB_ID")) return std::optional<LauncherIdentity>();
  ASSIGN_OR_RETURN(std::optional<LauncherIdentity> id, launcherIdentity(env));
  if (!id) return id;
  env["KOLO_JOB_ID"] = id->job_id;
  env["KOLO_SIZE"] = std::to_string(id->size);
  env["KOLO_LOCAL_RANK"] = std::to_string(id->local_rank);
  env["KOLO_LOCAL_SIZE"] = std::to_string(id->local_size);
  RETURN_IF_ERROR(directLaunchToken(env, *id));
  return id;
}

}  // namespace

Config ClientOptions::makeConfig() {
  Config c("libkolo");
  c.define("agent-socket", KnobType::kString, "/run/kolo/agent.sock",
           "Unix socket of the node's kolo-agent");
  c.define("job-id", KnobType::kString, "", "the job this process belongs to (set by kolorun)");
  c.define("job-token", KnobType::kString, "", "the job's secret, checked by the agent (set by kolorun)");
  c.define("size", KnobType::kInt, "-1", "number of ranks in the job (set by kolorun)");
  c.define("local-rank", KnobType::kInt, "-1", "this process's rank on its node (set by kolorun)");
  c.define("local-size", KnobType::kInt, "-1", "number of ranks of the job on this node (set by kolorun)");
  c.define("start-timeout", KnobType::kDouble, "30",
           "seconds kolo_init waits for the agent and for the job's other ranks");
  c.define("op-timeout", KnobType::kDouble, "600",
           "seconds a collective may take before a wait without a timeout gives up");
  c.define("spin-us", KnobType::kInt, "50",
           "microseconds a waiting thread polls the completion ring before it sleeps (0 = never spin)");
  c.define("arena-mb", KnobType::kInt, "0",
           "size of this process's shared arena in MiB (0 = the agent's default)");
  c.define("min-np", KnobType::kInt, "0",
           "elastic jobs: the fewest ranks the job goes on with (0 = not elastic; set by kolorun --min-np)");
  c.define("max-np", KnobType::kInt, "0", "elastic jobs: the most ranks the job admits (0 = no limit)");
  c.define("elastic-timeout", KnobType::kDouble, "0",
           "elastic jobs: seconds the job waits below KOLO_MIN_NP before it fails (0 = 600)");
  c.define(
      "direct", KnobType::kString, "auto",
      "auto: the agent reads and writes a large allreduce tensor in this process's memory "
      "(process_vm_readv/writev, from its --direct-min-kb) only when the shared arena has no "
      "room for it at submission, instead of waiting for space; always (1): every such tensor; "
      "off (0): every tensor through the arena. The agent falls back to the arena where the "
      "kernel refuses it");
  c.define("embedded-agent", KnobType::kBool, "false",
           "the agent is kolorun's private one, gone when the job ends (set by kolorun): "
           "messages point at its stall reports on stderr instead of `kolo job`");
  c.define("job-token-file", KnobType::kString, "",
           "direct launch (srun, mpirun; docs/slurm.md): a file holding the job's token, when "
           "KOLO_JOB_TOKEN is not set");
  c.define(
      "job-token-dir", KnobType::kString, "/run/kolo/jobs",
      "direct launch under Slurm: where the kolo prolog writes <SLURM_JOB_ID>.token, read when "
      "neither KOLO_JOB_TOKEN nor KOLO_JOB_TOKEN_FILE is set");
  c.alias("size", "HOROVOD_SIZE");
  c.alias("local-rank", "HOROVOD_LOCAL_RANK");
  c.alias("local-size", "HOROVOD_LOCAL_SIZE");
  return c;
}

StatusOr<ClientOptions> ClientOptions::fromEnvironment() { return fromEnv(processEnvironment()); }

StatusOr<ClientOptions> ClientOptions::fromEnv(const std::map<std::string, std::string>& env_in) {
  // KOLO_CONFIG names the daemons' config file, whose keys are not ours:
  // the client reads the environment only.
  std::map<std::string, std::string> env = env_in;
  env.erase("KOLO_CONFIG");
  ASSIGN_OR_RETURN(std::optional<LauncherIdentity> launched, applyLauncher(env));
  Config c = makeConfig();
  const char* argv0[] = {"libkolo"};
  RETURN_IF_ERROR(c.loadWithEnv(1, argv0, env));

  ClientOptions o;
  o.socket_path = c.getString("agent-socket");
  if (o.socket_path.empty()) return invalidArgument("KOLO_AGENT_SOCKET is empty");
  o.job_id = c.getString("job-id");
  if (o.job_id.empty()) return missing("KOLO_JOB_ID", "the job this process belongs to");
  o.token = c.getString("job-token");
  int64_t size = c.getInt("size");
  int64_t local_rank = c.getInt("local-rank");
  int64_t local_size = c.getInt("local-size");
  if (size < 0) return missing("KOLO_SIZE", "the number of ranks in the job");
  if (local_rank < 0) return missing("KOLO_LOCAL_RANK", "this process's rank on its node");
  if (local_size < 0) return missing("KOLO_LOCAL_SIZE", "the number of ranks on this node");
  if (size < 1 || size > (1 << 24)) {
    return invalidArgument("KOLO_SIZE must be at least 1, got " + std::to_string(size));
  }
  if (local_size < 1 || local_size > size) {
    return invalidArgument("KOLO_LOCAL_SIZE must be between 1 and KOLO_SIZE (" +
                           std::to_string(size) + "), got " + std::to_string(local_size));
  }
  if (local_rank >= local_size) {
    return invalidArgument("KOLO_LOCAL_RANK must be below KOLO_LOCAL_SIZE (" +
                           std::to_string(local_size) + "), got " + std::to_string(local_rank));
  }
  o.world_size = static_cast<int>(size);
  o.local_rank = static_cast<int>(local_rank);
  o.local_size = static_cast<int>(local_size);

  double start = c.getDouble("start-timeout");
  double op = c.getDouble("op-timeout");
  if (!(start > 0) || start > 1e7) {
    return invalidArgument("KOLO_START_TIMEOUT must be a positive number of seconds");
  }
  if (!(op > 0) || op > 1e7) {
    return invalidArgument("KOLO_OP_TIMEOUT must be a positive number of seconds");
  }
  o.start_timeout = seconds(start);
  o.op_timeout = seconds(op);
  int64_t spin = c.getInt("spin-us");
  if (spin < 0 || spin > 1'000'000) return invalidArgument("KOLO_SPIN_US must be between 0 and 1000000");
  o.spin = std::chrono::microseconds(spin);
  int64_t mb = c.getInt("arena-mb");
  if (mb < 0 || mb > (int64_t{1} << 20)) {
    return invalidArgument("KOLO_ARENA_MB must be between 0 (agent default) and 1048576, got " +
                           std::to_string(mb));
  }
  o.arena_bytes = static_cast<uint64_t>(mb) << 20;
  int64_t min_np = c.getInt("min-np");
  int64_t max_np = c.getInt("max-np");
  double et = c.getDouble("elastic-timeout");
  if (min_np < 0 || min_np > size) {
    return invalidArgument("KOLO_MIN_NP must be between 0 (not elastic) and KOLO_SIZE (" + std::to_string(size) +
                           "), got " + std::to_string(min_np));
  }
  if (max_np != 0 && (max_np < size || min_np == 0)) {
    return invalidArgument("KOLO_MAX_NP must be 0 (no limit) or at least KOLO_SIZE (" + std::to_string(size) +
                           ") in an elastic job (KOLO_MIN_NP > 0), got " + std::to_string(max_np));
  }
  if (!(et >= 0) || et > 1e7) return invalidArgument("KOLO_ELASTIC_TIMEOUT must be a number of seconds >= 0");
  o.min_np = static_cast<int>(min_np);
  o.max_np = static_cast<int>(max_np);
  o.elastic_timeout = seconds(et);
  o.embedded_agent = c.getBool("embedded-agent");
  if (launched) {
    o.launcher = launched->launcher;
    o.launcher_rank = launched->rank;
  }
  std::string direct = c.getString("direct");
  std::transform(direct.begin(), direct.end(), direct.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (direct == "auto") {
    o.direct = ClientOptions::Direct::kAuto;
  } else if (direct == "always" || direct == "1" || direct == "true" || direct == "on" ||
             direct == "yes") {
    o.direct = ClientOptions::Direct::kAlways;
  } else if (direct == "off" || direct == "0" || direct == "false" || direct == "no") {
    o.direct = ClientOptions::Direct::kOff;
  } else {
    return invalidArgument("KOLO_DIRECT must be auto, always (1) or off (0), got '" +
                           c.getString("direct") + "'");
  }
  return o;
}

}  // namespace kolo
