// The NCCL backend (factory.h). One progress thread per backend owns the
// communicator and a CUDA stream: it takes queued collectives in posting
// order, enqueues their NCCL calls (one ncclGroupStart/End per collective),
// records an event and polls it together with ncclCommGetAsyncError until
// done, failed, aborted or past the deadline. While idle it keeps polling
// the communicator's async error (the watchdog), so a peer's failure breaks
// the backend even with nothing in flight. Breaking = ncclCommAbort, fail
// the running and queued collectives, and every later one, with the status.
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0): every NCCL
// call may answer ncclInProgress, and we then poll ncclCommGetAsyncError
// under the deadline, so neither creation nor teardown can hang.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include "agent/backends/nccl/call_plan.h"
#include "agent/backends/nccl/factory.h"
#include "agent/backends/nccl/nccl_api.h"
#include "agent/gpu/device_api.h"
#include "common/log.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::microseconds(50);
constexpr auto kWatchdogInterval = std::chrono::milliseconds(100);

// The process's NCCL (libnccl, or the emulation with the host-emulated
// device), set once by createNcclBackend before any backend exists.
const nccl::NcclApi* g_nccl = &nccl::realNccl();

Status ncclStatus(ncclResult_t r, std::string_view api, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return okStatus();
  std::string msg = std::string(api) + ": " + g_nccl->getErrorString(r);
  const char* last = g_nccl->getLastError(comm);
  if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return invalidArgument(std::move(msg));
    case ncclRemoteError:
    case ncclSystemError:
      return peerFailure(std::move(msg));
    case ncclInProgress:
      return Status(Code::kInProgress, std::move(msg));
    default:
      return internalError(std::move(msg));
  }
}

StatusOr<ncclDataType_t> ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  return invalidArgument("nccl: unknown dtype " + std::to_string(static_cast<int>(t)));
}

StatusOr<ncclRedOp_t> ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage:  // reduced as Sum: the caller divides (backend.h)
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return invalidArgument("nccl: unknown op " + std::to_string(static_cast<int>(op)));
}

// Polls a non-blocking communicator until its pending call settles.
Status waitComm(ncclComm_t comm, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = g_nccl->commGetAsyncError(comm, &state);
    if (r != ncclSuccess) return ncclStatus(r, "ncclCommGetAsyncError", comm);
    if (state == ncclSuccess) return okStatus();
    if (state != ncclInProgress) return ncclStatus(state, what, comm);
    if (Clock::now() >= deadline) return timedOut(std::string(what) + ": still in progress at the deadline");
    std::this_thread::sleep_for(kPollInterval);
  }
}

// An NCCL call on a non-blocking communicator: in-progress is fine, then wait.
Status settle(ncclResult_t r, ncclComm_t comm, Clock::time_point deadline, std::string_view api) {
  if (r != ncclSuccess && r != ncclInProgress) return ncclStatus(r, api, comm);
  return waitComm(comm, deadline, api);
}

class NcclBackend final : public Backend {
 public:
  // Enqueues the NCCL calls of one collective on (comm, stream), between
  // ncclGroupStart/End done by the caller.
  using Enqueue = std::function<Status(ncclComm_t, cudaStream_t)>;

  NcclBackend(const BackendOptions& o, int device, gpu::DeviceApi* dev)
      : opts_(o), device_(device), dev_(dev), log_(log::get("agent.nccl")) {}

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      if (abort_why_.isOk()) abort_why_ = aborted("nccl backend destroyed");
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (comm_ != nullptr) (void)g_nccl->commAbort(comm_);  // never hangs, unlike destroy
    if (scratch_ != nullptr) dev_->freeDevice(scratch_);
  }

  Status init(KvStore& kv) {
    RETURN_IF_ERROR(dev_->setDevice(device_));
    const auto deadline = Clock::now() + opts_.timeout;
    ncclUniqueId id;
    const std::string key = opts_.key_prefix + "/0";
    if (opts_.rank == 0) {
      RETURN_IF_ERROR(ncclStatus(g_nccl->getUniqueId(&id), "ncclGetUniqueId"));
      RETURN_IF_ERROR(kv.put(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
    } else {
      auto v = kv.get(key, opts_.timeout);
      if (!v.isOk()) {
        return peerFailure("agent rank 0 unreachable: no NCCL unique id under '" + key +
                           "': " + v.status().message());
      }
      if (v->size() != sizeof(id))
        return internalError("nccl: unique id under '" + key + "' has " + std::to_string(v->size()) +
                             " bytes, want " + std::to_string(sizeof(id)));
      std::memcpy(&id, v->data(), sizeof(id));
    }
    ASSIGN_OR_RETURN(stream_, dev_->createStream());
    ASSIGN_OR_RETURN(done_event_, dev_->createEvent(false));
    ASSIGN_OR_RETURN(scratch_, dev_->allocDevice(sizeof(int32_t)));
    const int32_t zero = 0;
    RETURN_IF_ERROR(dev_->copyAsync(scratch_, &zero, sizeof(zero), stream_->get()));
    RETURN_IF_ERROR(dev_->streamSynchronize(stream_->get(), opts_.timeout.count()));

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = g_nccl->commInitRankConfig(&comm_, opts_.size, id, opts_.rank, &config);
    Status s = settle(r, comm_, deadline, "ncclCommInitRankConfig");
    if (!s.isOk()) {
      if (comm_ != nullptr) (void)g_nccl->commAbort(comm_);
      comm_ = nullptr;
      if (s.code() == Code::kTimedOut)
        return peerFailure("nccl: communicator of " + std::to_string(opts_.size) +
                           " ranks not up after " + std::to_string(opts_.timeout.count()) +
                           " ms (a peer did not join)");
      if (s.message().find("invalid usage") != std::string::npos) {
        // NCCL's refusal of two ranks of one communicator on one GPU.
        s = Status(s.code(), s.message() +
                                 " (several processes on one GPU need their own NCCL_HOSTID "
                                 "each, and CUDA MPS)");
      }
      return s.withContext("nccl init");
    }
    log_->debug("{}: NCCL ({}) rank {}/{} up on device {}", opts_.name, g_nccl->name, opts_.rank,
                opts_.size, device_);
    thread_ = std::thread([this] { progressLoop(); });
    return okStatus();
  }

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }

  void allreduceOutOfPlace(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                           Done done) override {
    auto t = ncclType(dtype);
    auto o = ncclOp(op);
    if (!t.isOk() || !o.isOk()) return done(!t.isOk() ? t.status() : o.status());
    post("allreduce", std::move(done), [=, t = *t, o = *o](ncclComm_t c, cudaStream_t s) {
      if (count == 0) return okStatus();
      return ncclStatus(g_nccl->allReduce(in, out, count, t, o, c, s), "ncclAllReduce", c);
    });
  }

  void broadcast(void* buf, size_t bytes, int root, Done done) override {
    if (root < 0 || root >= opts_.size)
      return done(invalidArgument("broadcast root " + std::to_string(root) + " out of range"));
    post("broadcast", std::move(done), [=](ncclComm_t c, cudaStream_t s) {
      if (bytes == 0) return okStatus();
      return ncclStatus(g_nccl->broadcast(buf, buf, bytes, ncclUint8, root, c, s), "ncclBroadcast",
                        c);
    });
  }

  void allgatherv(const void* in, size_t in_bytes, void* out, std::vector<size_t> recv_bytes,
                  Done done) override {
    if (static_cast<int>(recv_bytes.size()) != opts_.size || in_bytes != recv_bytes[opts_.rank])
      return done(invalidArgument("allgatherv: recv_bytes must have one entry per rank and match in_bytes"));
    post("allgatherv", std::move(done),
         [=, calls = nccl::planAllgatherv(opts_.rank, recv_bytes)](ncclComm_t c, cudaStream_t s) {
           for (const nccl::Call& k : calls) {
             char* dst = static_cast<char*>(out) + k.out_offset;
             if (k.kind == nccl::Call::kAllGather) {
               RETURN_IF_ERROR(ncclStatus(g_nccl->allGather(in, out, k.count, ncclUint8, c, s),
                                          "ncclAllGather", c));
             } else {
               const void* src = k.use_in ? in : dst;
               RETURN_IF_ERROR(
                   ncclStatus(g_nccl->broadcast(src, dst, k.count, ncclUint8, k.peer, c, s),
                              "ncclBroadcast", c));
             }
           }
           return okStatus();
         });
  }

  void reducescatter(const void* in, void* out, std::vector<size_t> recv_counts, DataType dtype,
                     ReduceOp op, Done done) override {
    auto t = ncclType(dtype);
    auto o = ncclOp(op);
    if (!t.isOk() || !o.isOk()) return done(!t.isOk() ? t.status() : o.status());
    if (static_cast<int>(recv_counts.size()) != opts_.size)
      return done(invalidArgument("reducescatter: recv_counts must have one entry per rank"));
    const int me = opts_.rank;
    const size_t es = dataTypeSize(dtype);
    post("reducescatter", std::move(done),
         [=, calls = nccl::planReducescatter(me, recv_counts), t = *t, o = *o](ncclComm_t c, cudaStream_t s) {
           for (const nccl::Call& k : calls) {
             if (k.kind == nccl::Call::kReduceScatter) {
               RETURN_IF_ERROR(ncclStatus(g_nccl->reduceScatter(in, out, k.count, t, o, c, s),
                                          "ncclReduceScatter", c));
             } else {
               const char* src = static_cast<const char*>(in) + k.in_offset * es;
               // recvbuff only matters on the root; elsewhere any valid pointer.
               void* dst = k.peer == me ? out : const_cast<char*>(src);
               RETURN_IF_ERROR(ncclStatus(g_nccl->reduce(src, dst, k.count, t, o, k.peer, c, s),
                                          "ncclReduce", c));
             }
           }
           return okStatus();
         });
  }

  void alltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
                 std::vector<size_t> recv_bytes, Done done) override {
    if (static_cast<int>(send_bytes.size()) != opts_.size ||
        static_cast<int>(recv_bytes.size()) != opts_.size)
      return done(invalidArgument("alltoallv: send_bytes and recv_bytes need one entry per rank"));
    post("alltoallv", std::move(done),
         [=, calls = nccl::planAlltoallv(send_bytes, recv_bytes)](ncclComm_t c, cudaStream_t s) {
           for (const nccl::Call& k : calls) {
             if (k.kind == nccl::Call::kSend) {
               RETURN_IF_ERROR(ncclStatus(g_nccl->send(static_cast<const char*>(in) + k.in_offset,
                                                       k.count, ncclUint8, k.peer, c, s),
                                          "ncclSend", c));
             } else {
               RETURN_IF_ERROR(ncclStatus(g_nccl->recv(static_cast<char*>(out) + k.out_offset,
                                                       k.count, ncclUint8, k.peer, c, s),
                                          "ncclRecv", c));
             }
           }
           return okStatus();
         });
  }

  void barrier(Done done) override {
    void* scratch = scratch_;
    post("barrier", std::move(done), [scratch](ncclComm_t c, cudaStream_t s) {
      return ncclStatus(g_nccl->allReduce(scratch, scratch, 1, ncclInt32, ncclSum, c, s),
                        "ncclAllReduce", c);
    });
  }

  // ncclWaitBeforeNext (factory.h).
  void waitBeforeNext(std::shared_ptr<gpu::DevEvent> ready) {
    std::lock_guard<std::mutex> lock(mu_);
    next_after_ = std::move(ready);
  }

  void abort(Status why) override {
    if (why.isOk()) why = aborted("nccl backend aborted");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_why_.isOk()) abort_why_ = std::move(why);
    }
    cv_.notify_all();
  }

 private:
  struct Op {
    std::string what;
    Enqueue enqueue;
    Done done;
    std::shared_ptr<gpu::DevEvent> after;  // the stream waits for it first (ncclWaitBeforeNext)
  };

  void post(std::string what, Done done, Enqueue enqueue) {
    Status broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.isOk()) {
        queue_.push_back(
            Op{std::move(what), std::move(enqueue), std::move(done), std::move(next_after_)});
      } else {
        broken = broken_;
      }
      next_after_.reset();
    }
    if (!broken.isOk()) return done(std::move(broken));  // complete outside the lock
    cv_.notify_all();
  }

  // Progress thread ----------------------------------------------------------

  void progressLoop() {
    log::setThreadName("kolo-nccl-" + std::to_string(opts_.rank));
    (void)dev_->setDevice(device_);
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, kWatchdogInterval, [&] {
          return stop_ || !queue_.empty() || (!abort_why_.isOk() && broken_.isOk());
        });
        if (!abort_why_.isOk() && broken_.isOk()) {
          Status why = abort_why_;
          lock.unlock();
          breakWith(why);
          lock.lock();
        }
        if (stop_ && queue_.empty()) return;
        if (queue_.empty()) {
          lock.unlock();
          watchdog();
          continue;
        }
        op = std::move(queue_.front());
        queue_.pop_front();
        if (!broken_.isOk()) {
          Status s = broken_;
          lock.unlock();
          op.done(std::move(s));
          continue;
        }
      }
      Status s = run(op);
      if (s.isOk()) {
        op.done(std::move(s));
      } else {
        s = s.withContext("nccl " + op.what);
        log_->warn("{}: {}", opts_.name, s.toString());
        breakWith(s, &op);  // the running op completes before the queued ones
      }
    }
  }

  // Idle check of the communicator: a peer's failure surfaces here.
  void watchdog() {
    if (comm_ == nullptr) return;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = g_nccl->commGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return breakWith(ncclStatus(r, "ncclCommGetAsyncError", comm_));
    if (state != ncclSuccess && state != ncclInProgress)
      breakWith(ncclStatus(state, "nccl async error", comm_).withContext("watchdog"));
  }

  Status abortRequested() {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_why_;
  }

  Status run(const Op& op) {
    const auto deadline = Clock::now() + opts_.timeout;
    if (op.after != nullptr) RETURN_IF_ERROR(op.after->streamWait(stream_->get()));
    Status s = settle(g_nccl->groupStart(), comm_, deadline, "ncclGroupStart");
    if (!s.isOk()) return s;
    Status enq = op.enqueue(comm_, static_cast<cudaStream_t>(stream_->get()));
    // End the group even when enqueueing failed half way, so NCCL's group
    // state is clean before the abort.
    s = settle(g_nccl->groupEnd(), comm_, deadline, "ncclGroupEnd");
    RETURN_IF_ERROR(enq);
    RETURN_IF_ERROR(s);
    RETURN_IF_ERROR(done_event_->record(stream_->get()));
    for (;;) {
      Status q = done_event_->query();
      if (q.isOk()) return okStatus();
      if (q.code() != Code::kInProgress) return q;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = g_nccl->commGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return ncclStatus(r, "ncclCommGetAsyncError", comm_);
      if (state != ncclSuccess && state != ncclInProgress) return ncclStatus(state, "nccl async error", comm_);
      Status why = abortRequested();
      if (!why.isOk()) return why;
      if (Clock::now() >= deadline) {
        return peerFailure("not complete after " + std::to_string(opts_.timeout.count()) +
                           " ms (a peer is missing or stuck)");
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // Aborts the communicator and fails `running` (if any), then everything
  // queued, in posting order; later posts fail at once.
  void breakWith(Status why, Op* running = nullptr) {
    std::deque<Op> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.isOk()) broken_ = why;
      pending.swap(queue_);
    }
    if (comm_ != nullptr) {
      (void)g_nccl->commAbort(comm_);
      comm_ = nullptr;
    }
    if (running != nullptr) running->done(why);
    for (Op& op : pending) op.done(why);
  }

  const BackendOptions opts_;
  const int device_;
  gpu::DeviceApi* const dev_;  // the device seam: CUDA, or the host emulation
  std::shared_ptr<spdlog::logger> log_;
  ncclComm_t comm_ = nullptr;  // progress thread only, after init
  std::unique_ptr<gpu::DevStream> stream_;
  std::unique_ptr<gpu::DevEvent> done_event_;
  void* scratch_ = nullptr;
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  std::shared_ptr<gpu::DevEvent> next_after_;  // for the next post; guarded by mu_
  Status broken_;     // first failure; guarded by mu_
  Status abort_why_;  // abort()/destructor request; guarded by mu_
  bool stop_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions& options, KvStore& kv) {
  gpu::DeviceApi* dev = gpu::deviceApi();
  if (dev == nullptr) return unavailable("not viable: this build has no device implementation");
  auto n = dev->deviceCount();
  if (!n.isOk()) return unavailable("not viable: " + n.status().message());
  ASSIGN_OR_RETURN(int device, dev->currentDevice());
  return createNcclBackend(options, kv, device);
}

StatusOr<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions& options, KvStore& kv,
                                                     int device) {
  RETURN_IF_ERROR(validateBackendOptions(options));
  gpu::DeviceApi* dev = gpu::deviceApi();
  if (dev == nullptr) return unavailable("not viable: this build has no device implementation");
  auto n = dev->deviceCount();
  if (!n.isOk()) return unavailable("not viable: " + n.status().message());
  if (device < 0 || device >= *n)
    return invalidArgument("nccl: CUDA device " + std::to_string(device) + " out of range [0, " +
                           std::to_string(*n) + ")");
  ASSIGN_OR_RETURN(const nccl::NcclApi* api, nccl::processNccl());
  static std::once_flag chosen;  // the device seam is chosen once per process, so is NCCL
  std::call_once(chosen, [api] { g_nccl = api; });
  auto b = std::make_unique<NcclBackend>(options, device, dev);
  RETURN_IF_ERROR(b->init(kv));
  return std::unique_ptr<Backend>(std::move(b));
}

bool ncclBackendCompiled() { return true; }

Status ncclUsable() { return nccl::processNccl().status(); }

Status ncclWaitBeforeNext(Backend& nccl, std::shared_ptr<gpu::DevEvent> ready) {
  auto* b = dynamic_cast<NcclBackend*>(&nccl);
  if (b == nullptr)
    return invalidArgument("ncclWaitBeforeNext on the " + std::string(nccl.name()) + " backend");
  b->waitBeforeNext(std::move(ready));
  return okStatus();
}

}  // namespace kolo
