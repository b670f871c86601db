#include "agent/agent_config.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <thread>

#include "agent/backends/backend_choice.h"
#include "agent/gpu/device_api.h"
#include "agent/gpu/device_cross.h"
#include "agent/gpu/mps_probe.h"
#include "agent/rpc/admin_token_file.h"
#include "common/coord_endpoints.h"

namespace kolo {

namespace {

// The socket, the addresses the agent serves and reaches, its identity.
void defineSocketKnobs(Config& c) {
  c.define("socket", KnobType::kString, "/run/kolo/agent.sock",
           "Unix socket trainers connect to (parent directory is created)")
      .define("socket-mode", KnobType::kString, "0660", "File mode of the socket (octal)")
      .define("socket-group", KnobType::kString, "",
              "Group owning the socket (members may connect); empty keeps the agent's group")
      .define("coordinator-uid", KnobType::kInt, "-1",
              "Over plain text, the user id besides root and the agent's own that may serve the "
              "coordinator's address on this host; a listener of any other user gets nothing "
              "(a port taken while the coordinator was down). -1: none")
      .define("coordinator", KnobType::kString, "127.0.0.1:7470",
              "kolo-coordinator address host:port, or several: host:port,host:port (one leads, the "
              "others stand by; see docs/coordinator.md)")
      .define("rpc-listen", KnobType::kString, "127.0.0.1:7471",
              "gRPC status service address (port 0 picks a free port); loopback by default: to "
              "serve other "
              "hosts, set an address and --rpc-auth-token-file (Drain and Timeline need the token, "
              "or, without "
              "one, a loopback peer)")
      .define("rpc-advertise-address", KnobType::kString, "",
              "The status service address other hosts and `kolo agents` are told (host or "
              "host:port; the port defaults to the bound one). Empty: the --rpc-listen host, or "
              "--hostname when it listens on every address. In a pod: its IP (status.podIP)")
      .define("metrics-listen", KnobType::kString, "0.0.0.0:7472",
              "Prometheus /metrics HTTP address (port 0 picks a free port; empty disables)")
      .define("mps-pipe-dir", KnobType::kString, "",
              "CUDA MPS pipe directory whose control daemon `kolo status` and kolo_mps_up report; "
              "empty: "
              "CUDA_MPS_PIPE_DIRECTORY of the agent's environment, else /tmp/nvidia-mps. When set, "
              "the agent "
              "also exports it as CUDA_MPS_PIPE_DIRECTORY for its own CUDA contexts (docs/gpu.md, "
              "\"CUDA MPS\")")
      .define("ready-file", KnobType::kString, "",
              "If set, write the bound gRPC address here once serving (for launchers)")
      .define("agent-id", KnobType::kString, "", "Stable id of this agent (default host:pid)")
      .define("hostname", KnobType::kString, "",
              "Host name reported to the coordinator (default: gethostname)");
}

// The local data path: arenas, threads, direct, streamed and split copies,
// fusion; registration with the coordinator.
void defineLocalPathKnobs(Config& c) {
  c.define("arena-mb", KnobType::kInt, "1024",
           "Default size of each trainer's shared arena in MiB (sparse; pages are used on touch)")
      .define(
          "reduce-threads", KnobType::kInt, "0",
          "Threads for large local reductions (0 = the cores the agent may run on, its affinity "
          "mask; kolorun gives each of K embedded agents 1/K of them)")
      .define("direct-alone-min-kb", KnobType::kInt, "0",
              "Across agents, a trainer alone on this agent takes the direct path from this many "
              "KiB (at least "
              "--direct-min-kb): its tensor is read and written chunk by chunk while the agents' "
              "ring runs "
              "(pipelined from --cross-pipeline-kb); 0 = never: the ring runs in place on its "
              "arena slot, which "
              "measured faster on 2 cores (docs/architecture.md, \"Direct user memory\")")
      .define("inline-reduce-kb", KnobType::kInt, "256",
              "Reductions up to this size run on the loop thread (no thread hop)")
      .define("direct-min-kb", KnobType::kInt, "1024",
              "Host allreduces of at least this many KiB in a trainer's own memory (not "
              "kolo_alloc_shared) are "
              "read and written by the agent in place with process_vm_readv/writev instead of "
              "being copied "
              "through the arena, where the trainer's own credentials let it (same user, dumpable; "
              "a root agent copies as the trainer); "
              "0 = never (docs/architecture.md, \"Direct user memory\")")
      .define("spin-us", KnobType::kInt, "50",
              "Microseconds the loop polls the trainers' rings and work posted by its other "
              "threads (the backends' completions) before it sleeps, and a multi-agent job's "
              "negotiation thread polls for its next name and its cycle's answer (0 = never "
              "spin; while the loop polls, trainers skip the doorbell)")
      .define("register-timeout-s", KnobType::kInt, "30",
              "How long to retry registering with the coordinator at start")
      .define("coordinator-watch-retry-s", KnobType::kInt, "30",
              "How long a job's broken watch on the coordinator is opened again (at every "
              "--coordinator "
              "address) before the agent fails the job")
      .define("fusion-threshold-mb", KnobType::kInt, "128",
              "Tensor Fusion buffer size in MiB (0 disables fusion)")
      .define("fusion-chunk-mb", KnobType::kInt, "8",
              "Fused buffers go across agents in chunks of this many MiB, packing one while the "
              "previous moves "
              "(0 = one collective per buffer)")
      .define("fusion-max-tensor-kb", KnobType::kInt, "1024",
              "Tensors of at least this many KiB cross agents unfused (their copy into the fusion "
              "buffer costs "
              "more than the latency fusion saves); 0 = fuse any size, as Horovod")
      .define("cross-inline-bytes", KnobType::kInt, "256",
              "Cached allreduces of up to this many bytes travel inside the agents' negotiation "
              "message (one "
              "round trip instead of two; at most 4 KiB of them per cycle); 0 = never")
      .define("cross-pipeline-kb", KnobType::kInt, "8192",
              "Allreduces across agents of at least this many KiB are pipelined: the local "
              "reduction, the "
              "agents' ring and the copy back into the ranks' slots overlap chunk by chunk "
              "(fusion-chunk-mb); "
              "0 = never")
      .define("stream-copy-in", KnobType::kBool, "true",
              "Across agents, trainers publish an allreduce of at least --cross-pipeline-kb before "
              "copying it into the arena and the agent reads each chunk once it is there, so the "
              "copy overlaps the negotiation and the ring (docs/architecture.md, \"Streamed "
              "copy-in\"); false = copy first")
      .define("stream-copy-out", KnobType::kBool, "true",
              "With a streamed copy-in whose result lands in the same slot, the agent publishes "
              "how much of the result is final as each chunk leaves the ring, and the trainer "
              "copies it out meanwhile instead of after the op; false = copy out after the op")
      .define("split-min-kb", KnobType::kInt, "256",
              "In a job on one agent, an allreduce of at least this many KiB in the trainers' own "
              "memory is reduced by the ranks themselves, each its share, reading the others' "
              "arenas (docs/architecture.md, \"Split reduction\"); 0 = the agent reduces "
              "every tensor");
}

// Negotiation cycles, autotune and the response cache.
void defineAutotuneKnobs(Config& c) {
  c.define("cycle-time-ms", KnobType::kDouble, "1",
           "Accepted for Horovod compatibility: kolo negotiates as soon as a name is ready, so "
           "no op waits for a cycle")
      .define("autotune", KnobType::kBool, "false",
              "Tune the fusion threshold and the small/large algorithm switch point online "
              "(multi-agent jobs)")
      .define("autotune-log-file", KnobType::kString, "",
              "CSV of every autotune sample and the best one (%j = job id, %a = agent id)")
      .define("autotune-warmup-samples", KnobType::kInt, "3",
              "Autotune samples discarded at the start")
      .define("autotune-steps-per-sample", KnobType::kInt, "10",
              "Negotiation cycles that moved data per autotune sample")
      .define("autotune-bayes-opt-max-samples", KnobType::kInt, "20",
              "Scored samples before autotune keeps the best for good")
      .define("autotune-gaussian-process-noise", KnobType::kDouble, "0.8",
              "Noise of the Gaussian process (normalised score units)")
      .define("cache-capacity", KnobType::kInt, "1024", "Response cache entries (0 disables)");
}

// The timeline, stall checks, the backends and the device path.
void defineTimelineBackendKnobs(Config& c) {
  c.define("timeline-filename", KnobType::kString, "",
           "Write a Chrome trace of every collective here (%a = agent id); a relative name is "
           "taken inside "
           "--timeline-dir, an absolute one must lie inside it")
      .define("timeline-max-mb", KnobType::kInt, "1024",
              "The most MiB one timeline file may grow to; past it no more events are written "
              "(logged, counted as dropped); 0 = no cap")
      .define("timeline-dir", KnobType::kString, "/var/log/kolo/timeline",
              "The only directory the agent writes timelines in (--timeline-filename, `kolo "
              "timeline start`, a "
              "trainer's start_timeline): names outside it, with '..' or through a symbolic link "
              "are refused; "
              "empty turns timelines off")
      .define("timeline-mark-cycles", KnobType::kBool, "false",
              "Mark each negotiation cycle in the timeline")
      .define("stall-check-time-s", KnobType::kInt, "60",
              "Report collectives some ranks have submitted and others not for this long")
      .define("stall-shutdown-time-s", KnobType::kInt, "0",
              "Fail a job whose collective has stalled this long (0 = never)")
      .define("stall-check-disable", KnobType::kBool, "false", "Turn the stall warnings off")
      .define(
          "backend", KnobType::kString, "auto",
          "Cross-agent backend for host memory: auto (agreed by the job's agents before they "
          "connect: ucx when every node has an RDMA device and UCX, plain tcp otherwise), ucx or "
          "tcp (docs/backends.md)")
      .define("device-cross", KnobType::kString, "auto",
              "How device tensors cross agents: auto (NCCL when every agent of the job has NCCL "
              "and a GPU for it, host staging otherwise), nccl (forced: the job's device ops fail "
              "when it is not viable, with the reason), staged (always through host memory). "
              "Chosen alike by every agent of each job generation, and logged (docs/gpu.md)")
      .define("device", KnobType::kString, "cuda",
              "The device implementation under the device path: cuda, or host-emulated (the test "
              "emulation: device tensors in host memory, no GPU; only in builds with "
              "KOLO_DEVICE_EMULATION=ON, and the agent says so loudly; docs/gpu.md)")
      .define("device-staging-timeout-s", KnobType::kInt, "600",
              "A device tensor staged through host memory for the exchange across agents fails "
              "with its name when the GPU has not copied it out within this long (a trainer's "
              "stream that never reaches its copy-in)")
      .define("idle-cycle-ms", KnobType::kInt, "100",
              "An agent with nothing to negotiate still joins a cycle this often, so peers never "
              "wait long");
}

// The socket's bounds and quotas (AgentLimits, docs/security.md).
void defineLimitKnobs(Config& c) {
  c.define("max-local-size", KnobType::kInt, "256",
           "Most local ranks a job may declare in its Hello (its tensor table and rank vectors "
           "grow with it)")
      .define("max-arena-mb", KnobType::kInt, "65536",
              "Largest shared arena a trainer may ask for in its Hello, in MiB (larger asks are "
              "refused)")
      .define("max-device-arena-mb", KnobType::kInt, "65536",
              "Largest device arena a trainer may ask for in its Hello, in MiB (larger asks are "
              "refused)")
      .define("max-names-in-flight", KnobType::kInt, "4096",
              "Collectives one rank may have in flight on this agent (submitted, not yet "
              "completed); more are refused one by one")
      .define("max-bytes-in-flight-mb", KnobType::kInt, "0",
              "Payload MiB one rank may have in flight (input plus output regions of its "
              "collectives not yet completed); 0 = the size of the rank's shared and device arenas")
      .define("max-table-mb-per-uid", KnobType::kInt, "256",
              "MiB of the agent's tensor table the collectives in flight of one user id "
              "(SO_PEERCRED) may hold, over all its connections and jobs (each name costs "
              "about 1 KiB + 64 B per local rank of its job); more are refused one by one")
      .define("max-connections", KnobType::kInt, "1024",
              "Connections the agent keeps open on its socket, admitted or not; more are refused "
              "at accept")
      .define("max-connections-per-uid", KnobType::kInt, "256",
              "Connections one user id (SO_PEERCRED) may keep open on the socket; more are "
              "refused at accept")
      .define("handshake-timeout-s", KnobType::kDouble, "10",
              "A connection that has not been admitted by a valid Hello within this many seconds "
              "is closed")
      .define("status-max-in-flight", KnobType::kInt, "100",
              "In-flight collectives listed per job in status replies (GetStatus, ListJobs, "
              "GetJob; the oldest first, the rest counted); a reply also stops listing them past "
              "1 MiB");
}

}  // namespace

void defineAgentKnobs(Config& c) {
  defineSocketKnobs(c);
  defineLocalPathKnobs(c);
  defineAutotuneKnobs(c);
  defineTimelineBackendKnobs(c);
  defineLimitKnobs(c);
  c.define("log-level", KnobType::kString, "",
           "Log level: trace|debug|info|warn|error, or per subsystem 'info,agent.ipc=debug'");
  defineGrpcClientKnobs(c, "coordinator", "coordinator");
  defineGrpcServerKnobs(c, "rpc", "gRPC status service");
  c.define("rpc-auth-token-create", KnobType::kBool, "false",
           "Make --rpc-auth-token-file at start where it is missing: a fresh random token, mode "
           "0640, group --socket-group, so that the socket's group (and root) are the agent's "
           "admins and nobody else (drain, timeline, the trainers' pids in `kolo status`)");
  defineBackendKnobs(c);
  c.alias("fusion-threshold-mb", "HOROVOD_FUSION_THRESHOLD",
          [](const std::string& b) { return std::to_string(std::stoll(b) >> 20); });
  c.alias("cycle-time-ms", "HOROVOD_CYCLE_TIME");
  // The name the clients and kolorun read; KOLO_SOCKET is deprecated (main.cc).
  c.alias("socket", "KOLO_AGENT_SOCKET");
  c.alias("cache-capacity", "HOROVOD_CACHE_CAPACITY");
  c.alias("autotune", "HOROVOD_AUTOTUNE");
  c.alias("autotune-log-file", "HOROVOD_AUTOTUNE_LOG");
  c.alias("autotune-warmup-samples", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES");
  c.alias("autotune-steps-per-sample", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE");
  c.alias("autotune-bayes-opt-max-samples", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES");
  c.alias("autotune-gaussian-process-noise", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE");
  c.alias("timeline-filename", "HOROVOD_TIMELINE");
  c.alias("timeline-mark-cycles", "HOROVOD_TIMELINE_MARK_CYCLES");
  c.alias("stall-shutdown-time-s", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS");
  c.alias("stall-check-disable", "HOROVOD_STALL_CHECK_DISABLE");
  c.alias("stall-check-time-s", "HOROVOD_STALL_CHECK_TIME_SECONDS");
}

std::string substitutePathToken(std::string path, std::string_view token, std::string_view value) {
  std::string safe(value);
  for (char& ch : safe) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') ch = '_';
  }
  for (size_t p = 0; (p = path.find(token, p)) != std::string::npos; p += safe.size()) {
    path.replace(p, token.size(), safe);
  }
  return path;
}

namespace {

// An integer knob within [lo, hi], or an error naming it.
StatusOr<int64_t> intIn(const Config& c, const std::string& knob, int64_t lo, int64_t hi) {
  int64_t v = c.getInt(knob);
  if (v < lo || v > hi) {
    return invalidArgument("--" + knob + " must be between " + std::to_string(lo) + " and " +
                           std::to_string(hi) + " (got " + std::to_string(v) + ")");
  }
  return v;
}

// The socket's bounds and quotas (AgentLimits).
Status limitsFrom(const Config& c, AgentLimits* l) {
  ASSIGN_OR_RETURN(int64_t local, intIn(c, "max-local-size", 1, 65536));
  l->max_local_size = static_cast<int>(local);
  ASSIGN_OR_RETURN(int64_t arena, intIn(c, "max-arena-mb", 16, 1 << 20));
  l->max_arena_bytes = static_cast<uint64_t>(arena) << 20;
  ASSIGN_OR_RETURN(int64_t device, intIn(c, "max-device-arena-mb", 2, 1 << 20));
  l->max_device_arena_bytes = static_cast<uint64_t>(device) << 20;
  ASSIGN_OR_RETURN(l->max_names_in_flight, intIn(c, "max-names-in-flight", 1, 1 << 24));
  ASSIGN_OR_RETURN(int64_t bytes, intIn(c, "max-bytes-in-flight-mb", 0, int64_t{1} << 30));
  l->max_bytes_in_flight = static_cast<uint64_t>(bytes) << 20;
  ASSIGN_OR_RETURN(int64_t table, intIn(c, "max-table-mb-per-uid", 1, 1 << 20));
  l->max_table_bytes_per_uid = static_cast<uint64_t>(table) << 20;
  ASSIGN_OR_RETURN(int64_t conns, intIn(c, "max-connections", 1, 1 << 20));
  l->max_connections = static_cast<int>(conns);
  ASSIGN_OR_RETURN(int64_t per_uid, intIn(c, "max-connections-per-uid", 1, 1 << 20));
  l->max_connections_per_uid = static_cast<int>(per_uid);
  l->handshake_timeout_s = c.getDouble("handshake-timeout-s");
  if (!(l->handshake_timeout_s > 0) || l->handshake_timeout_s > 3600) {
    return invalidArgument("--handshake-timeout-s must be > 0 and at most 3600");
  }
  ASSIGN_OR_RETURN(int64_t status, intIn(c, "status-max-in-flight", 0, 1 << 20));
  l->status_max_in_flight = static_cast<int>(status);
  return okStatus();
}

// The socket, the addresses, the host name and the agent id.
Status identityOptionsFrom(const Config& c, AgentOptions& o) {
  o.socket_path = c.getString("socket");
  char* end = nullptr;
  o.socket_mode = static_cast<uint32_t>(std::strtoul(c.getString("socket-mode").c_str(), &end, 8));
  if (end == nullptr || *end != '\0') return invalidArgument("--socket-mode must be octal, e.g. 0660");
  o.socket_group = c.getString("socket-group");
  o.coordinator = c.getString("coordinator");
  RETURN_IF_ERROR(parseCoordinatorList(o.coordinator, "--coordinator").status());
  o.rpc_listen = c.getString("rpc-listen");
  o.rpc_advertise_address = c.getString("rpc-advertise-address");
  if (!o.rpc_advertise_address.empty()) {
    const std::string& a = o.rpc_advertise_address;
    const bool bracketed = a.front() == '[';
    const size_t colon = bracketed ? a.find("]:") : a.rfind(':');
    const std::string port =
        colon == std::string::npos ? "" : a.substr(colon + (bracketed ? 2 : 1));
    const bool bad_port =
        colon != std::string::npos &&
        (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
         port.size() > 5 || std::stoi(port) == 0 || std::stoi(port) > 65535);
    if (a.find_first_of(" \t,/") != std::string::npos || colon == 0 || bad_port) {
      return invalidArgument(
          "--rpc-advertise-address must be host or host:port (an address other hosts reach "
          "this agent's status service at, e.g. the pod IP), got '" +
          a + "'");
    }
  }
  o.metrics_listen = c.getString("metrics-listen");
  o.ready_file = c.getString("ready-file");
  o.mps_pipe_dir = c.getString("mps-pipe-dir");
  if (o.mps_pipe_dir.empty()) o.mps_pipe_dir = gpu::defaultMpsPipeDirectory();
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  o.hostname = c.getString("hostname").empty() ? host : c.getString("hostname");
  o.agent_id = c.getString("agent-id");
  if (o.agent_id.empty()) o.agent_id = o.hostname + ":" + std::to_string(::getpid());
  return okStatus();
}

// The local data path: arenas, reduction threads, direct memory, spinning.
Status localPathOptionsFrom(const Config& c, AgentOptions& o) {
  int64_t mb = c.getInt("arena-mb");
  if (mb < 16 || mb > (1 << 20)) return invalidArgument("--arena-mb must be between 16 and 1048576");
  o.arena_bytes = static_cast<uint64_t>(mb) << 20;
  o.reduce_threads = static_cast<int>(c.getInt("reduce-threads"));
  if (o.reduce_threads <= 0) {
    // The cores this agent may use (its affinity mask: a cpuset or
    // `taskset` splits a machine's cores between agents), not the machine's.
    cpu_set_t set;
    CPU_ZERO(&set);
    o.reduce_threads = ::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0
                           ? CPU_COUNT(&set)
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  o.inline_reduce_bytes = static_cast<uint64_t>(c.getInt("inline-reduce-kb")) << 10;
  if (c.getInt("direct-min-kb") < 0 || c.getInt("direct-min-kb") > (int64_t{1} << 30)) {
    return invalidArgument("--direct-min-kb must be between 0 (off) and 1073741824");
  }
  o.direct_min_bytes = static_cast<uint64_t>(c.getInt("direct-min-kb")) << 10;
  if (c.getInt("direct-alone-min-kb") < 0 || c.getInt("direct-alone-min-kb") > (int64_t{1} << 30)) {
    return invalidArgument("--direct-alone-min-kb must be between 0 (off) and 1073741824");
  }
  o.direct_alone_min_bytes = static_cast<uint64_t>(c.getInt("direct-alone-min-kb")) << 10;
  o.register_timeout_s = static_cast<int>(c.getInt("register-timeout-s"));
  o.coordinator_watch_retry_s = static_cast<int>(c.getInt("coordinator-watch-retry-s"));
  if (o.coordinator_watch_retry_s < 1 || o.coordinator_watch_retry_s > 3600) {
    return invalidArgument("--coordinator-watch-retry-s must be between 1 and 3600");
  }
  o.spin_us = std::clamp<int64_t>(c.getInt("spin-us"), 0, 1'000'000);
  return okStatus();
}

// The stall check, the backends, the device path, the cycle and the cache.
Status backendDeviceOptionsFrom(const Config& c, AgentOptions& o) {
  o.stall_check_time_s = c.getInt("stall-check-time-s");
  o.backend = backendOptionsFromConfig(c);
  RETURN_IF_ERROR(validateBackendOptions(o.backend));
  RETURN_IF_ERROR(parseReduceThread(c.getString("backend-reduce-thread")).status());
  o.backend_name = c.getString("backend");
  if (!isBackendSetting(o.backend_name)) {
    return invalidArgument("--backend must be auto, ucx or tcp, not '" + o.backend_name + "'");
  }
  ASSIGN_OR_RETURN(o.device_cross, gpu::parseDeviceCrossMode(c.getString("device-cross")));
  {
    auto kind = gpu::parseDeviceKind(c.getString("device"));
    if (!kind.isOk()) return invalidArgument("--" + kind.status().message());
    o.device = *kind;
  }
  ASSIGN_OR_RETURN(o.device_staging_timeout_s, intIn(c, "device-staging-timeout-s", 1, 86400));
  o.cache_capacity = static_cast<size_t>(std::max<int64_t>(0, c.getInt("cache-capacity")));
  o.idle_cycle_ms = std::max<int64_t>(1, c.getInt("idle-cycle-ms"));
  return okStatus();
}

// Fusion, the inline and pipelined cross-agent paths, streamed and split copies.
Status fusionOptionsFrom(const Config& c, AgentOptions& o) {
  if (c.getInt("fusion-threshold-mb") < 0) return invalidArgument("--fusion-threshold-mb must be >= 0");
  o.fusion_threshold_bytes = static_cast<uint64_t>(c.getInt("fusion-threshold-mb")) << 20;
  if (c.getInt("fusion-chunk-mb") < 0) return invalidArgument("--fusion-chunk-mb must be >= 0");
  o.fusion_chunk_bytes = static_cast<uint64_t>(c.getInt("fusion-chunk-mb")) << 20;
  if (c.getInt("fusion-max-tensor-kb") < 0) return invalidArgument("--fusion-max-tensor-kb must be >= 0");
  o.fusion_max_tensor_bytes = static_cast<uint64_t>(c.getInt("fusion-max-tensor-kb")) << 10;
  if (c.getInt("cross-inline-bytes") < 0 || c.getInt("cross-inline-bytes") > (1 << 20)) {
    return invalidArgument("--cross-inline-bytes must be between 0 and 1048576");
  }
  o.cross_inline_bytes = static_cast<uint64_t>(c.getInt("cross-inline-bytes"));
  if (c.getInt("cross-pipeline-kb") < 0) return invalidArgument("--cross-pipeline-kb must be >= 0");
  o.cross_pipeline_bytes = static_cast<uint64_t>(c.getInt("cross-pipeline-kb")) << 10;
  o.stream_copy_in = c.getBool("stream-copy-in");
  o.stream_copy_out = c.getBool("stream-copy-out");
  if (c.getInt("split-min-kb") < 0) return invalidArgument("--split-min-kb must be >= 0");
  o.split_min_bytes = static_cast<uint64_t>(c.getInt("split-min-kb")) << 10;
  return okStatus();
}

// The timeline, autotune and the stall shutdown.
Status timelineAutotuneOptionsFrom(const Config& c, AgentOptions& o) {
  o.timeline_filename = c.getString("timeline-filename");
  // "%a" stands for the agent id, so several agents on one host can share a setting.
  o.timeline_filename = substitutePathToken(o.timeline_filename, "%a", o.agent_id);
  o.timeline_mark_cycles = c.getBool("timeline-mark-cycles");
  o.timeline_dir = c.getString("timeline-dir");
  ASSIGN_OR_RETURN(int64_t tl_mb, intIn(c, "timeline-max-mb", 0, 1 << 24));
  o.timeline_max_bytes = static_cast<uint64_t>(tl_mb) << 20;
  o.autotune = c.getBool("autotune");
  o.autotune_log_file = c.getString("autotune-log-file");
  o.autotune_log_file = substitutePathToken(o.autotune_log_file, "%a", o.agent_id);
  o.autotune_warmup_samples = static_cast<int>(c.getInt("autotune-warmup-samples"));
  o.autotune_steps_per_sample = static_cast<int>(c.getInt("autotune-steps-per-sample"));
  o.autotune_max_samples = static_cast<int>(c.getInt("autotune-bayes-opt-max-samples"));
  o.autotune_gp_noise = c.getDouble("autotune-gaussian-process-noise");
  if (o.autotune_steps_per_sample < 1) return invalidArgument("--autotune-steps-per-sample must be >= 1");
  if (o.autotune_max_samples < 1) return invalidArgument("--autotune-bayes-opt-max-samples must be >= 1");
  if (o.autotune_warmup_samples < 0) return invalidArgument("--autotune-warmup-samples must be >= 0");
  if (!(o.autotune_gp_noise > 0)) return invalidArgument("--autotune-gaussian-process-noise must be > 0");
  // A value the user set is kept, not tuned (as in Horovod).
  o.autotune_fixed_fusion = c.find("fusion-threshold-mb")->source != "default";
  o.autotune_fixed_switch = c.find("small-message-bytes") != nullptr &&
                            c.find("small-message-bytes")->source != "default";
  o.stall_shutdown_time_s = c.getInt("stall-shutdown-time-s");
  o.stall_check_disable = c.getBool("stall-check-disable");
  return okStatus();
}

// The socket's limits and the security of both gRPC ends.
Status securityOptionsFrom(const Config& c, AgentOptions& o) {
  RETURN_IF_ERROR(limitsFrom(c, &o.limits));
  if (o.arena_bytes > o.limits.max_arena_bytes) {
    return invalidArgument("--arena-mb " + std::to_string(o.arena_bytes >> 20) +
                           " is larger than --max-arena-mb " +
                           std::to_string(o.limits.max_arena_bytes >> 20));
  }
  ASSIGN_OR_RETURN(o.coordinator_security, grpcClientSecurityFrom(c, "coordinator"));
  ASSIGN_OR_RETURN(o.coordinator_security.server_uid,
                   intIn(c, "coordinator-uid", -1, int64_t{1} << 32));
  if (c.getBool("rpc-auth-token-create")) {
    const std::string file = c.getString("rpc-auth-token-file");
    if (file.empty()) {
      return invalidArgument(
          "--rpc-auth-token-create needs --rpc-auth-token-file (the file to make)");
    }
    RETURN_IF_ERROR(createAdminTokenFileIfMissing(file, o.socket_group));
  }
  ASSIGN_OR_RETURN(o.rpc_security, grpcServerSecurityFrom(c, "rpc"));
  return okStatus();
}

}  // namespace

StatusOr<AgentOptions> agentOptionsFrom(const Config& c) {
  AgentOptions o;
  RETURN_IF_ERROR(identityOptionsFrom(c, o));
  RETURN_IF_ERROR(localPathOptionsFrom(c, o));
  RETURN_IF_ERROR(backendDeviceOptionsFrom(c, o));
  RETURN_IF_ERROR(fusionOptionsFrom(c, o));
  RETURN_IF_ERROR(timelineAutotuneOptionsFrom(c, o));
  RETURN_IF_ERROR(securityOptionsFrom(c, o));
  return o;
}

}  // namespace kolo
