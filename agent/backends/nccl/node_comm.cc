// node_comm.h over the process's NCCL call table (libnccl, or the NCCL
// emulation with the host-emulated device).
#include "agent/backends/nccl/node_comm.h"

#include <nccl.h>

#include <mutex>
#include <string>
#include <thread>

#include "agent/backends/nccl/nccl_api.h"
#include "agent/gpu/device_api.h"
#include "common/log.h"

namespace kolo::nccl {

namespace {

using Clock = std::chrono::steady_clock;

Status callStatus(const NcclApi& n, ncclResult_t r, const std::string& what, ncclComm_t c) {
  std::string msg = what + ": " + n.getErrorString(r);
  const char* last = n.getLastError(c);
  if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? invalidArgument(msg)
                                                           : internalError(msg);
}

StatusOr<ncclDataType_t> typeOf(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
  }
  return invalidArgument("node-local NCCL: unknown dtype");
}

StatusOr<ncclRedOp_t> opOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage:  // the caller applies the postscale
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  return invalidArgument("node-local NCCL: unknown op");
}

class Comms final : public NodeComm {
 public:
  Comms(const NcclApi& n, std::vector<int> devices) : n_(n), devices_(std::move(devices)) {}
  ~Comms() override {
    for (ncclComm_t c : comms_) {
      if (c != nullptr) (void)n_.commAbort(c);
    }
  }
  const std::vector<int>& devices() const override { return devices_; }

  Status init(std::chrono::milliseconds timeout) {
    ncclUniqueId id{};
    ncclResult_t r = n_.getUniqueId(&id);
    if (r != ncclSuccess) return callStatus(n_, r, "ncclGetUniqueId", nullptr);
    const int k = static_cast<int>(devices_.size());
    comms_.assign(devices_.size(), nullptr);
    (void)n_.groupStart();
    Status st;
    for (int i = 0; i < k && st.isOk(); ++i) {
      st = gpu::deviceApi()->setDevice(devices_[i]);
      if (!st.isOk()) break;
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      r = n_.commInitRankConfig(&comms_[i], k, id, i, &config);
      if (r != ncclSuccess && r != ncclInProgress)
        st = callStatus(n_, r, "ncclCommInitRank (rank " + std::to_string(i) + ")", comms_[i]);
    }
    r = n_.groupEnd();
    if (st.isOk() && r != ncclSuccess && r != ncclInProgress)
      st = callStatus(n_, r, "ncclGroupEnd", nullptr);
    if (!st.isOk()) return st;
    return settle(Clock::now() + timeout, "ncclCommInitRank");
  }

  Status allreduce(const std::vector<void*>& bufs, const std::vector<void*>& streams, size_t count,
                   DataType dtype, ReduceOp op) override {
    ASSIGN_OR_RETURN(ncclDataType_t t, typeOf(dtype));
    ASSIGN_OR_RETURN(ncclRedOp_t o, opOf(op));
    return group(bufs, streams, "ncclAllReduce", [&](int i, ncclComm_t c, cudaStream_t s) {
      return n_.allReduce(bufs[i], bufs[i], count, t, o, c, s);
    });
  }
  Status broadcast(const std::vector<void*>& bufs, const std::vector<void*>& streams, size_t bytes,
                   int root) override {
    if (root < 0 || root >= static_cast<int>(comms_.size()))
      return invalidArgument("node-local NCCL broadcast: root " + std::to_string(root));
    return group(bufs, streams, "ncclBroadcast", [&](int i, ncclComm_t c, cudaStream_t s) {
      return n_.broadcast(bufs[i], bufs[i], bytes, ncclUint8, root, c, s);
    });
  }
  Status asyncError() override {
    for (ncclComm_t c : comms_) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = n_.commGetAsyncError(c, &state);
      if (r != ncclSuccess) return callStatus(n_, r, "ncclCommGetAsyncError", c);
      if (state != ncclSuccess && state != ncclInProgress)
        return callStatus(n_, state, "node-local NCCL", c);
    }
    return okStatus();
  }

 private:
  template <typename Call>
  Status group(const std::vector<void*>& bufs, const std::vector<void*>& streams,
               const std::string& what, Call call) {
    if (bufs.size() != comms_.size() || streams.size() != comms_.size())
      return internalError(what + ": one buffer and one stream per GPU");
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(asyncError());
    (void)n_.groupStart();
    Status st;
    for (size_t i = 0; i < comms_.size() && st.isOk(); ++i) {
      st = gpu::deviceApi()->setDevice(devices_[i]);
      if (!st.isOk()) break;
      const ncclResult_t r =
          call(static_cast<int>(i), comms_[i], static_cast<cudaStream_t>(streams[i]));
      if (r != ncclSuccess && r != ncclInProgress) st = callStatus(n_, r, what, comms_[i]);
    }
    const ncclResult_t r = n_.groupEnd();
    if (st.isOk() && r != ncclSuccess && r != ncclInProgress)
      st = callStatus(n_, r, "ncclGroupEnd", nullptr);
    if (!st.isOk()) return st;
    return settle(Clock::now() + std::chrono::seconds(30), what);
  }

  // Polls every rank's communicator until its pending call settled.
  Status settle(Clock::time_point deadline, const std::string& what) {
    for (ncclComm_t c : comms_) {
      for (;;) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = n_.commGetAsyncError(c, &state);
        if (r != ncclSuccess) return callStatus(n_, r, "ncclCommGetAsyncError", c);
        if (state == ncclSuccess) break;
        if (state != ncclInProgress) return callStatus(n_, state, what, c);
        if (Clock::now() >= deadline) return timedOut(what + ": still in progress at the deadline");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return okStatus();
  }

  const NcclApi& n_;
  const std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::mutex mu_;
};

}  // namespace

bool nodeCommBuilt() { return true; }

StatusOr<std::unique_ptr<NodeComm>> createNodeComm(const std::vector<int>& devices,
                                                   std::chrono::milliseconds timeout) {
  if (gpu::deviceApi() == nullptr) return unavailable("node-local NCCL: no device");
  if (devices.size() < 2) return internalError("node-local NCCL over fewer than two GPUs");
  ASSIGN_OR_RETURN(const NcclApi* n, processNccl());
  auto c = std::make_unique<Comms>(*n, devices);
  Status st = c->init(timeout);
  if (!st.isOk()) {
    return st.withContext("node-local NCCL communicator over " + std::to_string(devices.size()) +
                          " GPUs not created");
  }
  log::get("agent.nccl")
      ->info("node-local NCCL communicator over {} GPUs ({})", devices.size(), n->name);
  return std::unique_ptr<NodeComm>(std::move(c));
}

}  // namespace kolo::nccl
