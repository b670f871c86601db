// kolo: status and control of kolo daemons over gRPC. See docs/cli.md.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "agent/timeline/timeline_merge.h"
#include "cli/kolo_commands.h"
#include "cli/number_checks.h"
#include "common/config.h"

namespace {

std::string envOr(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : dflt;
}

}  // namespace

namespace {

// CLI11 says only "A subcommand is required" for `kolo bogus`: name the word
// and the commands there are.
std::string usageErrorText(CLI::App& app, int argc, char** argv, const std::string& what) {
  std::string names;
  bool known = false;
  std::string first = argc > 1 ? argv[1] : "";
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || sub->get_name() == first;
  }
  if (first.empty()) return "a command is required: one of " + names;
  if (!known && first[0] != '-')
    return "unknown command '" + first + "'; the commands are " + names;
  return what;
}

// The subcommands and what their options are parsed into. CLI11 keeps the
// addresses of these fields: the struct stays where main() made it.
struct Commands {
  // TLS and token flags, resolved with the environment in resolveSecurity().
  std::map<std::string, std::string> security_flags;
  CLI::App *status, *jobs, *agents, *job, *timeline, *tl_start, *tl_stop, *tl_merge, *drain,
      *undrain;
  std::string job_id;
  std::string timeline_path;
  bool mark_cycles = false;
  std::vector<std::string> merge_inputs;
  std::string merge_output;
  int drain_wait_s = 0;

  // Adds the subcommands to `app`; their options land here and in `o`.
  void define(CLI::App& app, kolo::cli::KoloCliOptions& o);
  // Runs the one that was parsed; its exit code.
  int run(const kolo::cli::KoloCliOptions& o) const;
};

void Commands::define(CLI::App& app, kolo::cli::KoloCliOptions& o) {
  using namespace kolo::cli;
  auto security_opts = [&](CLI::App* sub, const std::string& peer, const std::string& env) {
    auto file = [&](const std::string& name, const std::string& what) {
      sub->add_option_function<std::string>(
          "--" + peer + "-" + name,
          [this, peer, name](const std::string& v) { security_flags[peer + "-" + name] = v; },
          what + " (default $" + env + "_" + kolo::Config::envName(name).substr(5) + ")");
    };
    file("ca", "PEM CA bundle that signed the " + peer + "'s certificate: connect with TLS");
    file("cert", "PEM client certificate for mutual TLS");
    file("key", "PEM private key of the client certificate");
    file("server-name", "Name to check the " + peer + "'s certificate against");
    file("token-file", "File holding the bearer token for calls that change state");
    sub->add_flag_function(
        "--" + peer + "-tls", [this, peer](int64_t) { security_flags[peer + "-tls"] = "true"; },
        "TLS with the system's root CAs");
  };
  auto agent_opt = [&](CLI::App* sub) {
    sub->add_option("--agent", o.agent, "The agent's status address (default $KOLO_AGENT_RPC or 127.0.0.1:7471)");
    security_opts(sub, "agent", "KOLO_AGENT");
  };
  auto coord_opt = [&](CLI::App* sub) {
    sub->add_option("--coordinator", o.coordinator,
                    "The coordinator's address host:port, or several: host:port,host:port (the leader answers; "
                    "default $KOLO_COORDINATOR or 127.0.0.1:7470)");
    security_opts(sub, "coordinator", "KOLO_COORDINATOR");
  };
  auto json_opt = [&](CLI::App* sub) { sub->add_flag("--json", o.json, "Print one JSON document"); };

  status =
      app.add_subcommand("status", "The agent: id, host, socket, uptime, clients, jobs, counters");
  agent_opt(status);
  json_opt(status);
  jobs = app.add_subcommand("jobs", "The coordinator's jobs: state, generation, ranks, agents");
  coord_opt(jobs);
  json_opt(jobs);
  agents = app.add_subcommand("agents", "The agents registered with the coordinator");
  coord_opt(agents);
  json_opt(agents);
  job = app.add_subcommand("job", "One job on the agent, with every collective in flight");
  job->add_option("ID", job_id, "The job id (job-...)")->required();
  agent_opt(job);
  json_opt(job);
  timeline = app.add_subcommand("timeline", "Start or stop the agent's timeline");
  timeline->require_subcommand(1);
  tl_start = timeline->add_subcommand("start", "Start writing a Chrome-trace timeline to PATH");
  tl_start
      ->add_option(
          "PATH", timeline_path,
          "The file to write on the agent's machine: a name inside the agent's --timeline-dir "
          "(relative names are taken there), or an absolute path inside it")
      ->required();
  tl_start->add_flag("--mark-cycles", mark_cycles, "Also mark each negotiation cycle");
  agent_opt(tl_start);
  json_opt(tl_start);
  tl_stop = timeline->add_subcommand("stop", "Stop the timeline");
  agent_opt(tl_stop);
  json_opt(tl_stop);
  tl_merge = timeline->add_subcommand("merge",
                                      "Merge several agents' timeline files into one trace for the "
                                      "whole job (aligned on wall-clock time)");
  tl_merge->add_option("FILES", merge_inputs, "The agents' timeline files")->required()->check(CLI::ExistingFile);
  tl_merge->add_option("-o,--output", merge_output, "The merged file to write")->required();
  drain = app.add_subcommand("drain", "Drain the agent: finish running jobs, accept no new ones");
  agent_opt(drain);
  json_opt(drain);
  drain
      ->add_option("--wait", drain_wait_s,
                   "Then wait up to SECONDS until no job is left on the agent (exit 1 if some are)")
      ->check(nonNegative());
  undrain = app.add_subcommand("undrain", "Undo drain: the agent takes new jobs again");
  agent_opt(undrain);
  json_opt(undrain);
}

int Commands::run(const kolo::cli::KoloCliOptions& o) const {
  using namespace kolo::cli;
  if (status->parsed()) return cmdStatus(o, std::cout, std::cerr);
  if (jobs->parsed()) return cmdJobs(o, std::cout, std::cerr);
  if (agents->parsed()) return cmdAgents(o, std::cout, std::cerr);
  if (job->parsed()) return cmdJob(o, job_id, std::cout, std::cerr);
  if (tl_start->parsed()) return cmdTimelineStart(o, timeline_path, mark_cycles, std::cout, std::cerr);
  if (tl_stop->parsed()) return cmdTimelineStop(o, std::cout, std::cerr);
  if (tl_merge->parsed()) {
    auto merged = kolo::timeline::mergeTraceFiles(merge_inputs, merge_output);
    if (!merged.isOk()) {
      std::cerr << "kolo: " << merged.status().message() << "\n";
      return 1;
    }
    std::cout << "merged " << merged.value().files << " files, " << merged.value().events << " events into "
              << merge_output << "\n";
    return 0;
  }
  if (drain->parsed()) return cmdDrain(o, drain_wait_s, std::cout, std::cerr);
  if (undrain->parsed()) return cmdUndrain(o, std::cout, std::cerr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kolo::cli;
  KoloCliOptions o;
  o.agent = envOr("KOLO_AGENT_RPC", kDefaultAgentRpc);
  o.coordinator = envOr("KOLO_COORDINATOR", kDefaultCoordinator);

  CLI::App app("kolo: status and control of the kolo agent and coordinator", "kolo");
  app.require_subcommand(1);
  app.set_version_flag("--version", "kolo " KOLO_VERSION);
  Commands cmds;
  cmds.define(app, o);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors: one readable line, exit 2 (CLI11's own codes are 100+).
    std::cerr << "kolo: " << usageErrorText(app, argc, argv, e.what()) << " (see kolo --help)\n";
    return 2;
  }

  if (kolo::Status st = resolveSecurity(o, cmds.security_flags, kolo::processEnvironment());
      !st.isOk()) {
    std::cerr << "kolo: " << st.message() << "\n";
    return 2;
  }

  return cmds.run(o);
}
