// An emulated NCCL communicator (docs/gpu.md, "The NCCL emulation"): its
// rank, the mesh of loopback connections to the other ranks, the state
// ncclCommGetAsyncError reports, and the abort flag every wait checks.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/fd.h"
#include "common/status.h"

namespace kolo::nccl::emu {

// What the emulation's ncclUniqueId carries: rank 0's listener and a nonce
// that tells this communicator's connections from strays.
struct IdBytes {
  char magic[16];
  uint64_t nonce;
  uint16_t port;
};
static_assert(sizeof(IdBytes) <= sizeof(ncclUniqueId));

// Rank 0's listener, made by ncclGetUniqueId in this process.
Status makeUniqueId(ncclUniqueId* id);

class Comm {
 public:
  Comm(int rank, int size) : rank_(rank), size_(size) {}
  ~Comm();
  // Starts the bootstrap on a thread of its own; state() is InProgress
  // until every rank is connected.
  void start(const ncclUniqueId& id);
  // Sets the aborted flag and joins the bootstrap (bounded: it polls it).
  void abort();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::vector<int>& fds() const { return fds_; }
  ncclResult_t state() const { return state_.load(); }
  bool aborted() const { return aborted_.load(); }
  // The first failure wins; later ones are dropped.
  void fail(ncclResult_t r, const std::string& why);
  std::string lastError();
  // Counts a collective; true once the injected async error is due
  // (KOLO_NCCL_EMU_FAULTS=async-error-after=N).
  bool faultDue();

 private:
  Status bootstrap(const IdBytes& id);
  Status bootstrapRoot(const IdBytes& id, std::vector<uint16_t>* ports);
  Status bootstrapPeer(const IdBytes& id);

  const int rank_;
  const int size_;
  std::atomic<ncclResult_t> state_{ncclInProgress};
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::string last_error_;
  std::vector<UniqueFd> peers_;
  std::vector<int> fds_;
  std::thread init_;
  std::atomic<int64_t> collectives_{0};
  int64_t fault_after_ = -1;
};

ncclResult_t resultOf(const Status& s);

// One NCCL call, kept until its group is enqueued.
struct Call {
  enum Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kReduce, kSend, kRecv } kind;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;  // elements
  DataType dtype = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  int peer = 0;  // root or peer
};

// Runs a group's calls on the comm's mesh (on the stream's worker).
Status runCalls(Comm& c, const std::vector<Call>& calls, const std::function<bool()>& cancelled);

}  // namespace kolo::nccl::emu
