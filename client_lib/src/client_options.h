// The client's settings. They come from the environment that kolorun sets
// (KOLO_AGENT_SOCKET, KOLO_JOB_ID, ...), read through the Config registry so
// every knob has a type, a default and a doc line.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace kolo {

struct ClientOptions {
  std::string socket_path = "/run/kolo/agent.sock";
  std::string job_id;
  std::string token;
  int world_size = 0;
  int local_rank = 0;
  int local_size = 0;
  std::chrono::milliseconds start_timeout{30'000};
  std::chrono::milliseconds op_timeout{600'000};
  std::chrono::microseconds spin{50};  // poll the completion ring this long before sleeping
  uint64_t arena_bytes = 0;  // 0 = the agent's default
  // Elastic jobs (docs/elastic.md): KOLO_MIN_NP > 0 makes the job elastic.
  int min_np = 0;
  int max_np = 0;  // 0: no limit
  std::chrono::milliseconds elastic_timeout{0};  // 0: the coordinator's default (600 s)
  // KOLO_EMBEDDED_AGENT (kolorun): the agent goes away with the job, so
  // `kolo job` cannot be pointed at after the fact.
  bool embedded_agent = false;
  // KOLO_DIRECT: offer the agent the direct user-memory path (it decides
  // the size it starts at). kAuto takes it only for a tensor that would
  // otherwise wait for arena space; kAlways for every tensor from the
  // agent's size up.
  enum class Direct { kOff, kAuto, kAlways };
  Direct direct = Direct::kAuto;
  // Direct launch (docs/slurm.md): the job came from srun's or mpirun's
  // variables ("slurm", "openmpi"; empty under kolorun) and the rank that
  // launcher gave this process (-1: none).
  std::string launcher;
  int launcher_rank = -1;

  // The knobs libkolo reads (for --dump-config style listings and docs).
  static Config makeConfig();
  // Reads the process environment. Missing job settings are an
  // INVALID_ARGUMENT naming the variable (kolorun sets them all). Without
  // KOLO_JOB_ID, a process started by srun or mpirun takes its job, size,
  // local rank and local size from the launcher (launcherIdentity) and its
  // token from KOLO_JOB_TOKEN, KOLO_JOB_TOKEN_FILE or, under Slurm, the
  // file the prolog wrote: <KOLO_JOB_TOKEN_DIR>/<SLURM_JOB_ID>.token.
  static StatusOr<ClientOptions> fromEnvironment();
  static StatusOr<ClientOptions> fromEnv(const std::map<std::string, std::string>& env);
};

}  // namespace kolo
