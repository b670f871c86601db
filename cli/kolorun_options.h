// kolorun's command line (CLI11): `kolorun -np N [options] [--] command [args...]`.
// Options end at the first word that is not an option (or at "--"); that
// word and everything after it is the command, untouched.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace kolo::cli {

constexpr const char* kDefaultAgentSocket = "/run/kolo/agent.sock";

struct KolorunOptions {
  int np = 0;
  int agents = 1;
  std::string hosts;            // -H/--hosts "h1:2,h2:2"
  std::string hostfile;         // --hostfile FILE
  std::string agent_socket;     // --agent-socket (default $KOLO_AGENT_SOCKET or kDefaultAgentSocket)
  int start_timeout_s = 30;
  bool verbose = false;
  std::string log_level;
  // Horovod's tuning flags, kept as given (validated as numbers).
  std::string fusion_threshold_mb;
  std::string cycle_time_ms;
  std::string cache_capacity;
  std::string timeline_filename;
  bool autotune = false;
  std::string output_filename;  // --output-filename DIR
  // Elastic jobs (docs/elastic.md): min_np > 0 makes the job elastic.
  int min_np = 0;
  int max_np = 0;                     // 0: no limit
  std::string host_discovery_script;  // prints "host:slots" lines; each host is one embedded agent
  double elastic_timeout_s = 600;
  int max_restarts = 3;               // per rank slot
  bool elastic() const { return min_np > 0 || !host_discovery_script.empty(); }
  std::vector<std::string> env_vars;  // -x/--env "VAR" or "VAR=VALUE", in order
  std::string wdir;                   // --wdir: the ranks' working directory
  int ssh_port = 0;                   // -p/--ssh-port (0: ssh's default)
  std::string ssh_identity_file;      // -i/--ssh-identity-file
  std::string launcher = "auto";      // --launcher ssh|srun|auto (docs/slurm.md)
  std::vector<std::string> command;
  // horovodrun's knobs with no kolorun option of their own (autotune
  // details, stall check, timeline cycles), as the HOROVOD_* variables the
  // agent reads; they go with the tuning flags (tuningEnv).
  std::vector<std::pair<std::string, std::string>> horovod_env;

  bool help = false;            // --help: print help_text and exit 0
  std::string help_text;
  bool version = false;         // --version: print version_text and exit 0
  bool check_build = false;     // --check-build: print version_text (what is built) and exit 0
  std::string version_text;
};

// `args` excludes the program name; `env` supplies KOLO_AGENT_SOCKET.
StatusOr<KolorunOptions> parseKolorunArgs(const std::vector<std::string>& args,
                                          const std::map<std::string, std::string>& env);

// The -x/--env variables with their values (-x VAR takes VAR's value from
// `env`, kolorun's environment), for every rank; the last of a name wins.
std::vector<std::pair<std::string, std::string>> userEnv(const KolorunOptions& o,
                                                          const std::map<std::string, std::string>& env);

// -p/--ssh-port and -i/--ssh-identity-file as ssh arguments.
std::vector<std::string> sshOptions(const KolorunOptions& o);

// The tuning flags (and --log-level) as KOLO_* variables, for the embedded
// agents and the ranks.
std::vector<std::pair<std::string, std::string>> tuningEnv(const KolorunOptions& o);

// The environment for kolorun's embedded agents: tuningEnv plus their
// timeline directory (the agent writes timelines only inside its
// --timeline-dir). A KOLO_TIMELINE_DIR in `env` is kept as the user's
// choice. Otherwise the file asked for (--timeline-filename, else
// KOLO_TIMELINE_FILENAME, else HOROVOD_TIMELINE; a relative name taken from
// `cwd`, as Horovod does) is passed as an absolute path and its directory
// becomes the timeline directory; with no file asked for it is `cwd`, so
// that a trainer's start_timeline("name.json") lands where it would under
// horovodrun.
std::vector<std::pair<std::string, std::string>> embeddedAgentEnv(
    const KolorunOptions& o, const std::map<std::string, std::string>& env, const std::string& cwd);

// The current directory ("/" if unknown). (This process's environment as a
// map: kolo::processEnvironment, common/config.h.)
std::string currentDirectory();

}  // namespace kolo::cli
