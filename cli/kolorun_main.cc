// kolorun: launches a kolo job. See docs/kolorun.md.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/elastic_runner.h"
#include "cli/job_runner.h"
#include "cli/kolorun_options.h"
#include "cli/srun_launch.h"
#include "common/log.h"

int main(int argc, char** argv) {
  std::map<std::string, std::string> env = kolo::processEnvironment();
  if (argc > 3 && std::string(argv[1]) == "--slurm-task" && std::string(argv[2]) == "--") {
    return kolo::cli::execSlurmTask(env, argv + 3);  // a task of kolorun's srun step
  }
  auto opts = kolo::cli::parseKolorunArgs(std::vector<std::string>(argv + 1, argv + argc), env);
  if (!opts.isOk()) {
    std::fprintf(stderr, "kolorun: %s\n", opts.status().message().c_str());
    return 2;
  }
  if (opts->help) {
    std::fputs(opts->help_text.c_str(), stdout);
    return 0;
  }
  if (opts->version || opts->check_build) {
    std::fputs(opts->version_text.c_str(), stdout);
    return 0;
  }
  kolo::log::init("kolorun", opts->log_level);
  kolo::log::setThreadName("kolorun");
  if (opts->elastic()) return kolo::cli::ElasticRunner(std::move(opts.value())).run();
  return kolo::cli::JobRunner(std::move(opts.value())).run();
}
