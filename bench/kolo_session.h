// kolo-bench's thin RAII layer over libkolo's C ABI: init/shutdown, buffers
// (user memory or kolo_alloc_shared), one blocking call per collective and
// the small agreement allreduces that run outside the timed region.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kolo::bench {

class KoloSession {
 public:
  using Clock = std::chrono::steady_clock;
  static Clock::time_point now() { return Clock::now(); }
  static double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Before start(): asks for a shared arena big enough for `bytes` of
  // buffers plus staging room, by setting KOLO_ARENA_MB when it is unset
  // and the agent's default (1 GiB) would be too small.
  static void reserveArena(uint64_t bytes);
  // kolo_init(); the session calls kolo_shutdown() when destroyed.
  static StatusOr<std::unique_ptr<KoloSession>> start();
  ~KoloSession();
  KoloSession(const KoloSession&) = delete;
  KoloSession& operator=(const KoloSession&) = delete;

  int rank() const;
  int size() const;
  int localRank() const;
  int localSize() const;
  int crossSize() const;  // on rank 0 (local rank 0): the number of agents
  // "2 agent(s), 1 local rank(s) on rank 0's agent, embedded by kolorun (SOCKET)".
  std::string describeAgents() const;

  // A page-aligned host buffer, or one inside the agent-shared arena
  // (zero copy). Must be destroyed before the session.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(void* ptr, bool shared) : ptr_(ptr), shared_(shared) {}
    Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), shared_(o.shared_) { o.ptr_ = nullptr; }
    Buffer& operator=(Buffer&& o) noexcept;
    ~Buffer() { reset(); }
    void* get() const { return ptr_; }
    void reset();

   private:
    void* ptr_ = nullptr;
    bool shared_ = false;
  };
  StatusOr<Buffer> allocate(uint64_t bytes, bool shared);

  // kolo_allreduce_async + kolo_synchronize of a 1-D tensor.
  Status allreduce(const std::string& name, const void* input, void* output, uint64_t count,
                   DataType dtype, ReduceOp op);
  // The two halves of allreduce(): submit (returns the handle, never 0) and
  // wait. Every submitted handle must be waited on.
  StatusOr<uint64_t> submitAllreduce(const std::string& name, const void* input, void* output,
                                     uint64_t count, DataType dtype, ReduceOp op);
  Status wait(uint64_t handle, const std::string& name);

  // kolo_broadcast_async + kolo_synchronize, in place, from global rank `root`.
  Status broadcast(const std::string& name, void* buffer, uint64_t count, DataType dtype, int root);
  // kolo_broadcast_oop_async + kolo_synchronize (kolo-bench --device without --inplace).
  Status broadcastOop(const std::string& name, const void* input, void* output, uint64_t count,
                      DataType dtype, int root);
  // How allgather / alltoall copy a library-owned result to `output`
  // (default: memcpy; kolo-bench --device: a device-to-host copy).
  using ResultCopy = Status (*)(void* dst, const void* src, uint64_t bytes);
  static void setResultCopy(ResultCopy copy);
  // kolo_reducescatter_async + kolo_synchronize: `input` holds count_total
  // elements (a multiple of size()), `output` this rank's count_total / size().
  Status reducescatter(const std::string& name, const void* input, void* output,
                       uint64_t count_total, DataType dtype, ReduceOp op);
  // kolo_allgather_async (which exchanges the ranks' sizes first) +
  // kolo_synchronize + kolo_result + kolo_release: `count` elements from each
  // rank, size() * count gathered. The result stays in the library's buffer
  // unless `output` is not null (then it is copied there, for the check).
  Status allgather(const std::string& name, const void* input, uint64_t count, DataType dtype,
                   void* output);
  // kolo_alltoall_async with even splits (it exchanges the splits first) +
  // kolo_synchronize + kolo_result + kolo_release: `input` holds size()
  // blocks of `block` elements, one per destination rank; as many are
  // received. `output`: as for allgather.
  Status alltoall(const std::string& name, const void* input, uint64_t block, DataType dtype,
                  void* output);
  // kolo_barrier with the op timeout.
  Status barrier();
  // Element-wise max / sum across ranks, in place (not zero copy).
  Status maxAcrossRanks(const std::string& name, std::vector<double>& values);
  Status sumAcrossRanks(const std::string& name, std::vector<int64_t>& values);

 private:
  KoloSession() = default;
};

}  // namespace kolo::bench
