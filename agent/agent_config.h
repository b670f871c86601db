// Every knob of kolo-agent, in one registry (common/config.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "agent/backends/backend.h"
#include "agent/gpu/device_api.h"
#include "agent/gpu/device_cross.h"
#include "common/config.h"
#include "common/config_tls.h"

namespace kolo {

void defineAgentKnobs(Config& c);

// Bounds and quotas on the trainer socket (docs/security.md, "Bounds and
// quotas on the socket"). Each is a knob; a trainer past one is refused with
// a message that names the knob.
struct AgentLimits {
  int max_local_size = 256;                       // Hello local_size
  uint64_t max_arena_bytes = 64ull << 30;         // Hello arena_bytes
  uint64_t max_device_arena_bytes = 64ull << 30;  // Hello device_arena_bytes
  int64_t max_names_in_flight = 4096;             // per rank: accepted, not yet completed
  uint64_t max_bytes_in_flight = 0;               // per rank; 0 = the size of the rank's arenas
  int max_connections = 1024;                     // every connection on the socket
  int max_connections_per_uid = 256;              // by SO_PEERCRED uid
  uint64_t max_table_bytes_per_uid = 256ull
                                     << 20;  // tensor-table memory of one uid's names in flight
  double handshake_timeout_s = 10;  // a connection without an admitted Hello is closed
  int status_max_in_flight = 100;   // in-flight entries per job in status replies
};

struct AgentOptions {
  std::string socket_path;
  uint32_t socket_mode = 0660;
  std::string socket_group;
  std::string coordinator;
  std::string rpc_listen;
  std::string rpc_advertise_address;  // "" : from rpc_listen / hostname
  std::string metrics_listen;
  std::string ready_file;
  std::string mps_pipe_dir;  // resolved: --mps-pipe-dir, CUDA_MPS_PIPE_DIRECTORY, /tmp/nvidia-mps
  std::string agent_id;
  std::string hostname;
  uint64_t arena_bytes = 0;
  int reduce_threads = 0;
  uint64_t inline_reduce_bytes = 0;
  uint64_t direct_min_bytes = 1 << 20;  // 0: the direct user-memory path is off
  uint64_t direct_alone_min_bytes = 0;  // across agents, a trainer alone on the agent (0: never)
  int64_t spin_us = 50;
  int register_timeout_s = 30;
  // How long a broken WatchJob stream is opened again before the job fails.
  int coordinator_watch_retry_s = 30;
  int64_t stall_check_time_s = 60;
  BackendOptions backend;          // tuning for the cross-agent backend
  std::string backend_name = "auto";  // auto, ucx or tcp (agent/backends/backend_choice.h)
  // --device-cross: NCCL or host staging for device tensors across agents.
  gpu::DeviceCrossMode device_cross = gpu::DeviceCrossMode::kAuto;
  // --device: CUDA, or the host emulation (test builds; docs/gpu.md).
  gpu::DeviceKind device = gpu::DeviceKind::kCuda;
  // --device-staging-timeout-s: a device tensor staged to the host for the
  // agents' exchange fails past it (a trainer's stream never reached it).
  int64_t device_staging_timeout_s = 600;
  size_t cache_capacity = 1024;
  int64_t idle_cycle_ms = 100;
  uint64_t fusion_threshold_bytes = 128ull << 20;
  uint64_t fusion_chunk_bytes = 8ull << 20;
  uint64_t fusion_max_tensor_bytes = 1024 * 1024;
  uint64_t cross_inline_bytes = 256;
  uint64_t cross_pipeline_bytes = 8ull << 20;  // 0: no allreduce is pipelined across agents
  // Trainers may publish a pipelined allreduce before its copy-in ends
  // (Welcome.streamed_min_bytes = cross_pipeline_bytes; ipc_layout.h).
  bool stream_copy_in = true;
  // With it, the agent counts the result's final bytes chunk by chunk for
  // the trainer's copy-out (ipc_layout.h kStreamedFinalOffset).
  bool stream_copy_out = true;
  // In a job on one agent, the ranks reduce a host allreduce of at least
  // this many bytes themselves, each its share (split reduction,
  // ipc_layout.h kSubmitFlagSplit; Welcome.split_min_bytes). 0: never.
  uint64_t split_min_bytes = 256ull << 10;
  std::string timeline_filename;
  bool timeline_mark_cycles = false;
  std::string timeline_dir;  // every timeline file lies inside it (empty: timelines off)
  uint64_t timeline_max_bytes = uint64_t{1024} << 20;  // --timeline-max-mb (0: no cap)
  bool autotune = false;
  std::string autotune_log_file;  // %a already replaced; %j is replaced per job
  int autotune_warmup_samples = 3;
  int autotune_steps_per_sample = 10;
  int autotune_max_samples = 20;
  double autotune_gp_noise = 0.8;
  bool autotune_fixed_fusion = false;  // the user set fusion-threshold-mb
  bool autotune_fixed_switch = false;  // the user set small-message-bytes
  int64_t stall_shutdown_time_s = 0;
  bool stall_check_disable = false;
  // TLS / token to reach the coordinator, and to serve the status service.
  GrpcClientSecurity coordinator_security;
  GrpcServerSecurity rpc_security;
  AgentLimits limits;
};

StatusOr<AgentOptions> agentOptionsFrom(const Config& c);

// Replaces every `token` ("%a", "%j") in a file path by `value` with the
// characters that are unsafe in a file name turned into '_'.
std::string substitutePathToken(std::string path, std::string_view token, std::string_view value);

}  // namespace kolo
