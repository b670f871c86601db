// The algorithm layer of the point-to-point backends (ucx, tcp): each
// collective is a small state machine that posts messages and reductions
// through a CollectiveContext and is told when they complete. It knows
// nothing about transports; P2pBackend (p2p_backend.h) owns the progress
// thread, the deadlines and the failure handling, and a transport (UCX tag
// matching, plain TCP sockets) moves the messages. Everything here runs on
// the progress thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/backends/backend.h"
#include "common/dtype.h"
#include "common/status.h"

namespace kolo::coll {

// Messages of one collective are told apart by (peer, step, chunk), each
// 16 bits; a direction (sender -> receiver) must never reuse one.
constexpr uint32_t kMaxStep = 0xffff;
constexpr uint32_t kMaxChunk = 0xffff;

class CollectiveContext {
 public:
  virtual ~CollectiveContext() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const BackendOptions& options() const = 0;
  // Posts a message; Collective::onSent / onReceived(step, chunk) follow.
  // A receive must get exactly `bytes` bytes, else the collective fails.
  virtual void send(int peer, uint32_t step, uint32_t chunk, const void* buf, size_t bytes) = 0;
  virtual void recv(int peer, uint32_t step, uint32_t chunk, void* buf, size_t bytes) = 0;
  // dst = a OP b over `count` elements (dst may alias a or b), inline or on
  // the helper thread; Collective::onReduced(step, chunk) follows.
  virtual void reduce(uint32_t step, uint32_t chunk, DataType dtype, ReduceOp op, const void* a,
                      const void* b, void* dst, size_t count) = 0;
  // A buffer of at least `bytes`, owned by the backend and valid until the
  // collective ends; each call returns a distinct buffer.
  virtual std::byte* scratch(size_t bytes) = 0;
  // Ends the collective with `status` (e.g. inconsistent arguments).
  virtual void fail(Status status) = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual void start(CollectiveContext& ctx) = 0;
  virtual void onSent(uint32_t step, uint32_t chunk) {}
  virtual void onReceived(uint32_t step, uint32_t chunk) {}
  virtual void onReduced(uint32_t step, uint32_t chunk) {}
  // True once every message and reduction it planned has completed.
  virtual bool finished() const = 0;
  // "allreduce 1000 x float32 sum (ring)"
  virtual const std::string& describe() const = 0;
};

// A collective with nothing to exchange: runs `fn` (a local copy, or nothing) at start.
std::unique_ptr<Collective> makeLocalCollective(std::string what, std::function<void()> fn);

// Allreduce of `in` into `buf` (in == buf: in place; else disjoint, and `in`
// is only read): recursive doubling (latency-bound, for small buffers; it
// copies `in` into `buf` first) and the pipelined ring (reduce-scatter +
// allgather, bandwidth-bound; its first sends and its reductions read `in`,
// so out of place costs no copy).
std::unique_ptr<Collective> makeRecursiveDoublingAllreduce(const void* in, void* buf, size_t count,
                                                           DataType dtype, ReduceOp op);
std::unique_ptr<Collective> makeRingAllreduce(const void* in, void* buf, size_t count, DataType dtype,
                                              ReduceOp op);

// Broadcast: binomial tree (small) and a chunked chain (large).
std::unique_ptr<Collective> makeTreeBroadcast(void* buf, size_t bytes, int root);
std::unique_ptr<Collective> makeChainBroadcast(void* buf, size_t bytes, int root);

// Allgather of per-rank blocks of `recv_bytes` into `out`: the ring
// (bandwidth-bound) and Bruck's algorithm (ceil(log2 n) rounds, for small totals).
std::unique_ptr<Collective> makeRingAllgatherv(const void* in, void* out,
                                               std::vector<size_t> recv_bytes);
std::unique_ptr<Collective> makeBruckAllgatherv(const void* in, void* out,
                                                std::vector<size_t> recv_bytes);

// Reduce-scatter: the ring's first half (large) or a recursive-doubling
// allreduce of a scratch copy (small).
std::unique_ptr<Collective> makeRingReducescatter(const void* in, void* out,
                                                  std::vector<size_t> recv_counts, DataType dtype,
                                                  ReduceOp op);
std::unique_ptr<Collective> makeSmallReducescatter(const void* in, void* out,
                                                   std::vector<size_t> recv_counts, DataType dtype,
                                                   ReduceOp op);

// Every pair exchanges its block at once (UCX queues them).
std::unique_ptr<Collective> makeAlltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
                                          std::vector<size_t> recv_bytes);

// Dissemination barrier: ceil(log2 size) rounds of empty messages.
std::unique_ptr<Collective> makeDisseminationBarrier();

}  // namespace kolo::coll
