// The NCCL emulation's C API (nccl_api.h's emulatedNccl()): the subset of
// NCCL the nccl backend calls, over emulated device memory (host memory)
// and loopback TCP between the ranks. Collectives run on the host
// emulation's stream worker (agent/gpu/emu/host_stream.h), in stream order,
// as NCCL's kernels do. Like NCCL: communicators are non-blocking when
// asked (init answers ncclInProgress, ncclCommGetAsyncError reports the
// state), a failed collective (a peer gone) sets the async error and keeps
// its stream blocked until ncclCommAbort, and a stuck peer just blocks it.
#include <nccl.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/backends/nccl/emu/emu_comm.h"
#include "agent/backends/nccl/nccl_api.h"
#include "agent/gpu/emu/host_stream.h"

namespace kolo::nccl {
namespace emu {
namespace {

struct Handle {
  std::shared_ptr<Comm> comm;
};

Comm* commOf(ncclComm_t c) {
  auto* h = reinterpret_cast<Handle*>(c);
  return h == nullptr ? nullptr : h->comm.get();
}
std::shared_ptr<Comm> sharedOf(ncclComm_t c) { return reinterpret_cast<Handle*>(c)->comm; }

thread_local std::string t_last_error;

ncclResult_t failCall(ncclResult_t r, std::string why) {
  t_last_error = std::move(why);
  return r;
}

struct Pending {
  std::shared_ptr<Comm> comm;
  void* stream;
  Call call;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Pending> t_pending;

// The calls of one (comm, stream) run as one task on the stream's worker.
void enqueue(std::shared_ptr<Comm> comm, void* stream, std::vector<Call> calls) {
  gpu::emu::HostStream::of(stream)->enqueue(
      [comm = std::move(comm), calls = std::move(calls)](const std::atomic<bool>& stop) {
        auto cancelled = [&] { return stop.load() || comm->aborted(); };
        if (comm->state() != ncclSuccess || cancelled()) return;
        Status s =
            comm->faultDue()
                ? Status(Code::kInternal, "injected fault (KOLO_NCCL_EMU_FAULTS=async-error-after)")
                : runCalls(*comm, calls, cancelled);
        if (s.isOk() || cancelled()) return;
        // As a NCCL kernel whose peer is gone: the error is reported
        // asynchronously and the stream stays blocked until the abort.
        comm->fail(resultOf(s), s.message());
        while (!cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      });
}

void flush() {
  std::vector<Pending> pending;
  pending.swap(t_pending);
  size_t i = 0;
  while (i < pending.size()) {
    std::vector<Call> calls;
    const Pending& first = pending[i];
    size_t j = i;
    for (; j < pending.size() && pending[j].comm == first.comm && pending[j].stream == first.stream;
         ++j)
      calls.push_back(pending[j].call);
    enqueue(first.comm, first.stream, std::move(calls));
    i = j;
  }
}

ncclResult_t post(ncclComm_t c, cudaStream_t s, Call call) {
  Comm* comm = commOf(c);
  if (comm == nullptr) return failCall(ncclInvalidArgument, "comm is NULL");
  const ncclResult_t st = comm->state();
  if (st == ncclInProgress)
    return failCall(ncclInvalidUsage, "the communicator is still initialising");
  if (st != ncclSuccess) return st;
  if ((call.kind == Call::kBroadcast || call.kind == Call::kReduce || call.kind == Call::kSend ||
       call.kind == Call::kRecv) &&
      (call.peer < 0 || call.peer >= comm->size()))
    return failCall(ncclInvalidArgument,
                    "root or peer " + std::to_string(call.peer) + " out of range");
  t_pending.push_back(Pending{sharedOf(c), static_cast<void*>(s), call});
  if (t_group_depth == 0) flush();
  return ncclSuccess;
}

bool dtypeOf(ncclDataType_t t, DataType* out) {
  switch (t) {
    case ncclInt8:
      *out = DataType::kInt8;
      return true;
    case ncclUint8:
      *out = DataType::kUint8;
      return true;
    case ncclInt32:
      *out = DataType::kInt32;
      return true;
    case ncclInt64:
      *out = DataType::kInt64;
      return true;
    case ncclFloat16:
      *out = DataType::kFloat16;
      return true;
    case ncclFloat32:
      *out = DataType::kFloat32;
      return true;
    case ncclFloat64:
      *out = DataType::kFloat64;
      return true;
    case ncclBfloat16:
      *out = DataType::kBFloat16;
      return true;
    default:
      return false;
  }
}

bool opOf(ncclRedOp_t op, ReduceOp* out) {
  switch (op) {
    case ncclSum:
      *out = ReduceOp::kSum;
      return true;
    case ncclProd:
      *out = ReduceOp::kProduct;
      return true;
    case ncclMin:
      *out = ReduceOp::kMin;
      return true;
    case ncclMax:
      *out = ReduceOp::kMax;
      return true;
    default:
      return false;
  }
}

ncclResult_t make(Call::Kind kind, const void* in, void* out, size_t count, ncclDataType_t t,
                  ncclRedOp_t op, int peer, ncclComm_t c, cudaStream_t s) {
  Call k;
  k.kind = kind;
  k.in = in;
  k.out = out;
  k.count = count;
  k.peer = peer;
  if (!dtypeOf(t, &k.dtype))
    return failCall(ncclInvalidArgument, "the emulation has no data type " + std::to_string(t));
  if (!opOf(op, &k.op))
    return failCall(ncclInvalidArgument, "the emulation has no op " + std::to_string(op));
  return post(c, s, k);
}

// --- the API -----------------------------------------------------------------

ncclResult_t getUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return failCall(ncclInvalidArgument, "uniqueId is NULL");
  Status s = makeUniqueId(id);
  return s.isOk() ? ncclSuccess : failCall(ncclSystemError, s.message());
}

ncclResult_t commInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                ncclConfig_t* config) {
  if (out == nullptr) return failCall(ncclInvalidArgument, "comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return failCall(ncclInvalidArgument,
                    "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  auto* h = new Handle{std::make_shared<Comm>(rank, nranks)};
  h->comm->start(id);
  *out = reinterpret_cast<ncclComm_t>(h);
  if (config != nullptr && config->blocking == 0) return ncclInProgress;
  while (h->comm->state() == ncclInProgress)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return h->comm->state();
}

ncclResult_t commGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  Comm* comm = commOf(c);
  if (comm == nullptr || state == nullptr)
    return failCall(ncclInvalidArgument, "comm or state is NULL");
  *state = comm->state();
  return ncclSuccess;
}

ncclResult_t commAbort(ncclComm_t c) {
  auto* h = reinterpret_cast<Handle*>(c);
  if (h == nullptr) return ncclSuccess;
  h->comm->abort();  // the stream tasks see it within a poll slice and let go
  delete h;
  return ncclSuccess;
}

ncclResult_t groupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t groupEnd() {
  if (t_group_depth == 0) return failCall(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth == 0) flush();
  return ncclSuccess;
}

ncclResult_t allReduce(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op,
                       ncclComm_t c, cudaStream_t s) {
  return make(Call::kAllReduce, in, out, count, t, op, 0, c, s);
}
ncclResult_t broadcast(const void* in, void* out, size_t count, ncclDataType_t t, int root,
                       ncclComm_t c, cudaStream_t s) {
  return make(Call::kBroadcast, in, out, count, t, ncclSum, root, c, s);
}
ncclResult_t allGather(const void* in, void* out, size_t count, ncclDataType_t t, ncclComm_t c,
                       cudaStream_t s) {
  return make(Call::kAllGather, in, out, count, t, ncclSum, 0, c, s);
}
ncclResult_t reduceScatter(const void* in, void* out, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return make(Call::kReduceScatter, in, out, count, t, op, 0, c, s);
}
ncclResult_t reduce(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op,
                    int root, ncclComm_t c, cudaStream_t s) {
  return make(Call::kReduce, in, out, count, t, op, root, c, s);
}
ncclResult_t send(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                  cudaStream_t s) {
  return make(Call::kSend, buf, nullptr, count, t, ncclSum, peer, c, s);
}
ncclResult_t recv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                  cudaStream_t s) {
  return make(Call::kRecv, nullptr, buf, count, t, ncclSum, peer, c, s);
}

// NCCL's own texts, so messages read the same as with libnccl.
const char* errorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* lastError(ncclComm_t c) {
  Comm* comm = commOf(c);
  if (comm != nullptr) {
    const std::string e = comm->lastError();
    t_last_error = e.empty() ? std::string() : "emulated NCCL: " + e;
  } else if (!t_last_error.empty() && t_last_error.rfind("emulated NCCL: ", 0) != 0) {
    t_last_error = "emulated NCCL: " + t_last_error;
  }
  return t_last_error.c_str();
}

}  // namespace
}  // namespace emu

const NcclApi* emulatedNccl() {
  static const NcclApi api{
      "host-emulated", emu::getUniqueId, emu::commInitRankConfig, emu::commGetAsyncError,
      emu::commAbort,  emu::groupStart,  emu::groupEnd,           emu::allReduce,
      emu::broadcast,  emu::allGather,   emu::reduceScatter,      emu::reduce,
      emu::send,       emu::recv,        emu::errorString,        emu::lastError,
  };
  return &api;
}

}  // namespace kolo::nccl
