#include "agent/backends/backend.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "agent/backends/kv_store.h"
#include "agent/backends/nccl/factory.h"
#include "agent/backends/tcp/factory.h"
#include "agent/backends/ucx/factory.h"
#include "common/config.h"

namespace kolo {

bool reduceThreadByDefault() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                                   : static_cast<int>(std::thread::hardware_concurrency());
  return cpus >= 4;
}

StatusOr<bool> parseReduceThread(const std::string& value) {
  if (value == "auto") return reduceThreadByDefault();
  if (value == "true") return true;
  if (value == "false") return false;
  return invalidArgument("backend-reduce-thread must be auto, true or false, got '" + value + "'");
}

Status validateBackendOptions(const BackendOptions& o) {
  if (o.size < 1)
    return invalidArgument("backend size must be >= 1, got " + std::to_string(o.size));
  if (o.rank < 0 || o.rank >= o.size) {
    return invalidArgument("backend rank " + std::to_string(o.rank) + " out of range [0, " +
                           std::to_string(o.size) + ")");
  }
  if (o.timeout.count() <= 0) return invalidArgument("backend timeout must be > 0 ms");
  if (o.chunk_bytes < 64) return invalidArgument("backend chunk-bytes must be >= 64");
  if (o.pipeline_depth < 1) return invalidArgument("backend pipeline-depth must be >= 1");
  if (o.ucx_tcp_tx_seg_bytes > 0 && o.ucx_tcp_rx_seg_bytes > 0 && o.ucx_tcp_rx_seg_bytes < o.ucx_tcp_tx_seg_bytes) {
    return invalidArgument("ucx-tcp-rx-seg-bytes (" + std::to_string(o.ucx_tcp_rx_seg_bytes) +
                           ") must be at least ucx-tcp-tx-seg-bytes (" + std::to_string(o.ucx_tcp_tx_seg_bytes) +
                           ")");
  }
  return okStatus();
}

void defineBackendKnobs(Config& config) {
  const BackendOptions d;
  config.define("backend-timeout-ms", KnobType::kInt, std::to_string(d.timeout.count()),
                "Agent-to-agent deadline: rendezvous, and time without progress inside a "
                "collective before it fails with PeerFailure");
  config.define("small-message-bytes", KnobType::kInt, std::to_string(d.small_message_bytes),
                "Below this size allreduce/broadcast/reducescatter/allgatherv use latency-bound "
                "algorithms (recursive doubling, binomial tree, Bruck), at or above it the "
                "pipelined ring; 0 = ring always");
  config.define("backend-chunk-bytes", KnobType::kInt, std::to_string(d.chunk_bytes),
                "Pipelining chunk of the ring/chain algorithms (bytes)");
  config.define("backend-pipeline-depth", KnobType::kInt, std::to_string(d.pipeline_depth),
                "Chunks in flight (receive buffers) per collective");
  config.define("backend-reduce-thread", KnobType::kString, "auto",
                "Reduce large chunks on a helper thread so reduction overlaps transfers: true, false, or "
                "auto (true when the agent may run on 4 or more CPUs; with fewer, the progress thread "
                "reduces)");
  config.define("backend-spin-us", KnobType::kInt, std::to_string(d.spin_us),
                "While a collective runs, the progress thread polls this many microseconds before it sleeps "
                "when nothing moves (0 = sleep at once)");
  config.define("ucx-tcp-tx-seg-bytes", KnobType::kInt, std::to_string(d.ucx_tcp_tx_seg_bytes),
                "UCX over TCP: send segment size (UCX_TCP_TX_SEG_SIZE, which wins when set); 0 = "
                "UCX's default (8 KiB)");
  config.define("ucx-tcp-rx-seg-bytes", KnobType::kInt, std::to_string(d.ucx_tcp_rx_seg_bytes),
                "UCX over TCP: receive segment size, at least the send segment (UCX_TCP_RX_SEG_SIZE, "
                "which wins when set); 0 = UCX's default (64 KiB)");
  config.define("backend-tcp-address", KnobType::kString, "",
                "tcp backend: the address (IPv4 or host name) this agent listens on and gives its peers; "
                "empty = every interface, with all of its IPv4 addresses given (loopback first)");
}

BackendOptions backendOptionsFromConfig(const Config& config) {
  BackendOptions o;
  o.timeout = std::chrono::milliseconds(config.getInt("backend-timeout-ms"));
  o.small_message_bytes =
      static_cast<size_t>(std::max<int64_t>(0, config.getInt("small-message-bytes")));
  o.chunk_bytes = static_cast<size_t>(std::max<int64_t>(0, config.getInt("backend-chunk-bytes")));
  o.pipeline_depth = static_cast<int>(config.getInt("backend-pipeline-depth"));
  // (An unknown value keeps the default; agentOptionsFrom reports it.)
  if (auto rt = parseReduceThread(config.getString("backend-reduce-thread")); rt.isOk()) o.reduce_thread = rt.value();
  o.spin_us = static_cast<int>(std::clamp<int64_t>(config.getInt("backend-spin-us"), 0, 1'000'000));
  o.ucx_tcp_tx_seg_bytes = static_cast<size_t>(std::max<int64_t>(0, config.getInt("ucx-tcp-tx-seg-bytes")));
  o.ucx_tcp_rx_seg_bytes = static_cast<size_t>(std::max<int64_t>(0, config.getInt("ucx-tcp-rx-seg-bytes")));
  o.tcp_address = config.getString("backend-tcp-address");
  return o;
}

StatusOr<std::unique_ptr<Backend>> createBackend(std::string_view backend,
                                                 const BackendOptions& options, KvStore& kv) {
  if (backend == "tcp") return createTcpBackend(options, kv);
  if (backend == "ucx") return createUcxBackend(options, kv);
  // Device memory; on the calling thread's current CUDA device.
  if (backend == "nccl") return createNcclBackend(options, kv);
  return invalidArgument("unknown backend '" + std::string(backend) + "' (known: tcp, ucx, nccl)");
}

std::vector<std::string> compiledBackends() {
  std::vector<std::string> names{"tcp"};
#ifdef KOLO_HAVE_UCX
  names.push_back("ucx");
#endif
  // nccl is not listed: these are the host-memory backends (the conformance
  // suite and the agent's cross-agent host path iterate them); see
  // ncclBackendCompiled() in nccl/factory.h for the device backend.
  return names;
}

}  // namespace kolo
