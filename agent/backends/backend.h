// The agent-to-agent data plane: one Backend object per agent per job
// generation connects the `size` agents of that generation and runs
// collectives over buffers in host memory (device memory for nccl later).
//
// Every collective is non-blocking: it is posted, and `done(status)` runs
// later on the backend's own progress thread (the agent forwards it to its
// loop). All agents must post the same collectives in the same order with
// matching arguments; a backend runs its collectives one after another in
// posting order. Buffers must stay valid and untouched until `done` has run.
//
// Failure model (see docs/backends.md): a peer that dies or does not answer
// within options.timeout fails the collective with PeerFailure
// "agent rank R unreachable: ..."; after the first failure the backend is
// broken for good (the generation is over) and every later collective
// completes at once with the same status. A peer that went away fails only
// the collectives that still need it: what it sent before leaving is still
// received (an agent leaves once its own part of the last collective is done). A backend that cannot run at all
// says so at creation with Unavailable "not viable: <reason>".
//
// Threading: the collective methods and abort() are thread-safe. `done` must
// not block for long and must not destroy the backend; it may post further
// collectives. Destroying a backend completes whatever is still queued with
// Aborted before the destructor returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kolo {

class Config;
class KvStore;

// The default of BackendOptions::reduce_thread: a helper thread pays off only
// with a spare core, so true when this process may run on at least 4 CPUs
// (its affinity mask), false below.
bool reduceThreadByDefault();
// backend-reduce-thread's values: "auto" (reduceThreadByDefault()), "true", "false".
StatusOr<bool> parseReduceThread(const std::string& value);

// One options struct shared by every backend (a backend ignores what it does
// not use). The agent fills rank/size/key_prefix; the tuning fields come from
// the configuration registry (defineBackendKnobs / backendOptionsFromConfig).
struct BackendOptions {
  int rank = 0;  // this agent's rank among the generation's agents
  int size = 1;  // number of agents in the generation
  // Rendezvous keys are "<key_prefix>/<rank>", e.g. "g3/ucx/0": scope it by
  // job and generation so that two generations never read each other's keys.
  std::string key_prefix = "ucx";
  // Every wait has this deadline: creation's rendezvous, and within a
  // collective the time without any progress (a message or a completion)
  // before it fails with PeerFailure naming the rank it waits for.
  std::chrono::milliseconds timeout{30000};
  // Allreduce/broadcast/reducescatter below this many bytes use latency-bound
  // algorithms (recursive doubling, binomial tree); at or above it the
  // bandwidth-bound pipelined ring/chain. 0 forces the ring everywhere.
  size_t small_message_bytes = 64 * 1024;
  // Ring and chain collectives move each segment in chunks of this many bytes
  // (rounded down to whole elements) so sending, receiving and reducing overlap.
  size_t chunk_bytes = 256 * 1024;
  // Chunks received (and receive buffers held) at once per collective.
  int pipeline_depth = 4;
  // Reduce large chunks on a helper thread so reduction overlaps transfers;
  // false reduces on the progress thread (better where the agents' threads
  // already use every core: measured in docs/backends.md).
  bool reduce_thread = reduceThreadByDefault();
  // While a collective runs, the progress thread polls this long before it
  // sleeps when nothing moves (microseconds; 0 = sleep at once).
  int spin_us = 50;
  // UCX over TCP: the size of the segments UCX sends and receives (bytes;
  // 0 keeps UCX's own default, 8 KiB and 64 KiB). Larger segments mean
  // fewer system calls per byte on the ring (docs/backends.md). A UCX_TCP_
  // TX/RX_SEG_SIZE variable in the agent's environment wins over these.
  size_t ucx_tcp_tx_seg_bytes = 256 * 1024;
  size_t ucx_tcp_rx_seg_bytes = 1024 * 1024;
  // The tcp backend listens on this address (IPv4 or host name) and gives
  // peers only it; empty: every interface, all of its IPv4 addresses given.
  std::string tcp_address;
  // Shown in log lines and thread names (e.g. "job7/g3").
  std::string name;
};

// Checks the fields every backend relies on.
Status validateBackendOptions(const BackendOptions& options);

// Registers the backend tuning knobs (backend-timeout-ms, small-message-bytes,
// backend-chunk-bytes, backend-pipeline-depth, backend-reduce-thread).
void defineBackendKnobs(Config& config);
// Tuning fields from a loaded Config; rank/size/key_prefix/name stay default.
BackendOptions backendOptionsFromConfig(const Config& config);

class Backend {
 public:
  using Done = std::function<void(Status)>;

  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;  // "tcp", "ucx"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The result of reducing `count` elements of `in` goes to `out`; `in` is
  // only read (`in` == `out`: in place; otherwise they must not overlap).
  // Average reduces as Sum: the caller applies the division.
  virtual void allreduceOutOfPlace(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                                   Done done) = 0;
  // In place over `count` elements of `buf`.
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op, Done done) {
    allreduceOutOfPlace(buf, buf, count, dtype, op, std::move(done));
  }
  // `bytes` of `buf` on `root` are copied into `buf` on every rank.
  virtual void broadcast(void* buf, size_t bytes, int root, Done done) = 0;
  // Rank i contributes recv_bytes[i] bytes (in_bytes on this rank must equal
  // recv_bytes[rank]); `out` receives them concatenated in rank order.
  // `in` may be `out` + offset of this rank (in place).
  virtual void allgatherv(const void* in, size_t in_bytes, void* out,
                          std::vector<size_t> recv_bytes, Done done) = 0;
  // `in` holds sum(recv_counts) elements; block i (recv_counts[i] elements,
  // blocks in rank order) is reduced across ranks and lands in rank i's `out`.
  // `out` may be `in` + offset of this rank's block (in place), else must not
  // overlap `in`.
  virtual void reducescatter(const void* in, void* out, std::vector<size_t> recv_counts,
                             DataType dtype, ReduceOp op, Done done) = 0;
  // Rank r sends send_bytes[i] bytes (blocks of `in` in rank order) to rank i
  // and receives recv_bytes[i] bytes from rank i into `out` (blocks in rank
  // order). send_bytes[i] on rank r must equal recv_bytes[r] on rank i.
  virtual void alltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
                         std::vector<size_t> recv_bytes, Done done) = 0;
  virtual void barrier(Done done) = 0;

  // Changes the small/large algorithm switch point (BackendOptions::
  // small_message_bytes) for collectives posted from now on. Called from the
  // thread that posts collectives, at the same point of the collective
  // sequence on every rank (the autotuner's agreed parameters), so every rank
  // keeps choosing the same algorithm. A backend without such a switch
  // ignores it.
  virtual void setSmallMessageBytes(size_t bytes) { (void)bytes; }

  // Fails the running and queued collectives with `why` and breaks the
  // backend (later collectives fail with `why` too). For the agent when the
  // generation ends for another reason (a lost lease, a local rank's exit).
  virtual void abort(Status why) = 0;
};

// Every backend has a factory of this shape in <name>/factory.h:
//   StatusOr<std::unique_ptr<Backend>> create<Name>Backend(const BackendOptions&, KvStore&);
// It blocks until the backend is connected to all peers (the KvStore is only
// used during creation) and returns Unavailable "not viable: <reason>" when
// the backend cannot run here, PeerFailure when a peer does not show up.
//
// By name ("tcp", "ucx"): the backends compiled into this build.
StatusOr<std::unique_ptr<Backend>> createBackend(std::string_view backend,
                                                 const BackendOptions& options, KvStore& kv);
std::vector<std::string> compiledBackends();

}  // namespace kolo
