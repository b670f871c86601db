#include "bench/kolo_session.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "kolo/kolo_c.h"

namespace kolo::bench {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kAgentDefaultArena = 1024 * kMiB;  // the agent's --arena-mb default
constexpr uint64_t kStagingSlack = 64 * kMiB;
constexpr size_t kPage = 4096;

Status fromKolo(kolo_status_t st, const std::string& what) {
  if (st == KOLO_OK) return okStatus();
  return Status(static_cast<Code>(st), what + ": " + kolo_last_error());
}

}  // namespace

void KoloSession::reserveArena(uint64_t bytes) {
  uint64_t need = bytes + kStagingSlack;
  if (std::getenv("KOLO_ARENA_MB") != nullptr || need <= kAgentDefaultArena) return;
  std::string mb = std::to_string((need + kMiB - 1) / kMiB);
  setenv("KOLO_ARENA_MB", mb.c_str(), 0);
}

StatusOr<std::unique_ptr<KoloSession>> KoloSession::start() {
  RETURN_IF_ERROR(fromKolo(kolo_init(), "kolo_init"));
  return std::unique_ptr<KoloSession>(new KoloSession());
}

KoloSession::~KoloSession() { kolo_shutdown(); }

int KoloSession::rank() const { return kolo_rank(); }
int KoloSession::size() const { return kolo_size(); }
int KoloSession::localRank() const { return kolo_local_rank(); }
int KoloSession::localSize() const { return kolo_local_size(); }
int KoloSession::crossSize() const { return kolo_cross_size(); }

std::string KoloSession::describeAgents() const {
  const char* sock = std::getenv("KOLO_AGENT_SOCKET");
  std::string path = sock != nullptr ? sock : "/run/kolo/agent.sock";
  std::string base = path.substr(path.find_last_of('/') + 1);
  // kolorun's private agents: DIR/agent-<i>.sock; multi_agent_run.sh's: DIR/node<i>.sock.
  const char* mode = base.rfind("agent-", 0) == 0  ? "embedded by kolorun"
                     : base.rfind("node", 0) == 0 ? "started by multi_agent_run.sh"
                                                  : "node agent";
  return std::to_string(crossSize()) + " agent(s), " + std::to_string(localSize()) +
         " local rank(s) on rank 0's agent, " + mode + " (" + path + ")";
}

KoloSession::Buffer& KoloSession::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    shared_ = o.shared_;
    o.ptr_ = nullptr;
  }
  return *this;
}

void KoloSession::Buffer::reset() {
  if (ptr_ == nullptr) return;
  if (shared_) {
    kolo_free_shared(ptr_);
  } else {
    std::free(ptr_);
  }
  ptr_ = nullptr;
}

StatusOr<KoloSession::Buffer> KoloSession::allocate(uint64_t bytes, bool shared) {
  if (shared) {
    void* p = kolo_alloc_shared(bytes);
    if (p == nullptr) {
      return Status(Code::kUnavailable, "kolo_alloc_shared(" + std::to_string(bytes) +
                                            ") failed: " + kolo_last_error() +
                                            " (a larger KOLO_ARENA_MB may help)");
    }
    return Buffer(p, true);
  }
  void* p = std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
  if (p == nullptr)
    return internalError("out of memory allocating " + std::to_string(bytes) + " bytes");
  return Buffer(p, false);
}

StatusOr<uint64_t> KoloSession::submitAllreduce(const std::string& name, const void* input,
                                                void* output, uint64_t count, DataType dtype,
                                                ReduceOp op) {
  const int64_t shape[1] = {static_cast<int64_t>(count)};
  kolo_handle_t h = 0;
  RETURN_IF_ERROR(fromKolo(
      kolo_allreduce_async(name.c_str(), input, output, 1, shape, static_cast<kolo_dtype_t>(dtype),
                           static_cast<kolo_op_t>(op), 1.0, 1.0, &h),
      "kolo_allreduce_async(" + name + ")"));
  return static_cast<uint64_t>(h);
}

Status KoloSession::wait(uint64_t handle, const std::string& name) {
  return fromKolo(kolo_synchronize(static_cast<kolo_handle_t>(handle), -1),
                  "kolo_synchronize(" + name + ")");
}

Status KoloSession::allreduce(const std::string& name, const void* input, void* output,
                              uint64_t count, DataType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(uint64_t h, submitAllreduce(name, input, output, count, dtype, op));
  return wait(h, name);
}

Status KoloSession::broadcast(const std::string& name, void* buffer, uint64_t count, DataType dtype,
                              int root) {
  const int64_t shape[1] = {static_cast<int64_t>(count)};
  kolo_handle_t h = 0;
  RETURN_IF_ERROR(fromKolo(kolo_broadcast_async(name.c_str(), buffer, 1, shape,
                                                static_cast<kolo_dtype_t>(dtype), root, &h),
                           "kolo_broadcast_async(" + name + ")"));
  return wait(h, name);
}

Status KoloSession::broadcastOop(const std::string& name, const void* input, void* output,
                                 uint64_t count, DataType dtype, int root) {
  const int64_t shape[1] = {static_cast<int64_t>(count)};
  kolo_handle_t h = 0;
  RETURN_IF_ERROR(fromKolo(kolo_broadcast_oop_async(name.c_str(), input, output, 1, shape,
                                                    static_cast<kolo_dtype_t>(dtype), root, &h),
                           "kolo_broadcast_oop_async(" + name + ")"));
  return wait(h, name);
}

Status KoloSession::reducescatter(const std::string& name, const void* input, void* output,
                                  uint64_t count_total, DataType dtype, ReduceOp op) {
  const int64_t shape[1] = {static_cast<int64_t>(count_total)};
  kolo_handle_t h = 0;
  RETURN_IF_ERROR(fromKolo(
      kolo_reducescatter_async(name.c_str(), input, output, 1, shape,
                               static_cast<kolo_dtype_t>(dtype), static_cast<kolo_op_t>(op), &h),
      "kolo_reducescatter_async(" + name + ")"));
  return wait(h, name);
}

namespace {
Status memcpyResult(void* dst, const void* src, uint64_t bytes) {
  std::memcpy(dst, src, bytes);
  return okStatus();
}
KoloSession::ResultCopy g_result_copy = memcpyResult;
}  // namespace

void KoloSession::setResultCopy(ResultCopy copy) {
  g_result_copy = copy != nullptr ? copy : memcpyResult;
}

namespace {

// Waits for an allgather / alltoall handle, checks the received size, copies
// the library-owned result to `output` when asked, and releases the handle.
Status finishGathered(kolo_handle_t h, const std::string& name, const char* what, int64_t want_dim0,
                      size_t esize, void* output) {
  Status st = fromKolo(kolo_synchronize(h, -1), std::string("kolo_synchronize(") + name + ")");
  if (st.isOk()) {
    void* data = nullptr;
    int64_t dim0 = 0;
    st = fromKolo(kolo_result(h, &data, &dim0), std::string("kolo_result(") + name + ")");
    if (st.isOk() && dim0 != want_dim0) {
      st = internalError(std::string(what) + " of " + name + " returned " + std::to_string(dim0) +
                         " elements, expected " + std::to_string(want_dim0));
    }
    if (st.isOk() && output != nullptr && dim0 > 0) {
      st = g_result_copy(output, data, static_cast<uint64_t>(dim0) * esize);
    }
  }
  kolo_release(h);
  return st;
}

}  // namespace

Status KoloSession::allgather(const std::string& name, const void* input, uint64_t count,
                              DataType dtype, void* output) {
  const int64_t shape[1] = {static_cast<int64_t>(count)};
  kolo_handle_t h = 0;
  RETURN_IF_ERROR(fromKolo(
      kolo_allgather_async(name.c_str(), input, 1, shape, static_cast<kolo_dtype_t>(dtype), &h),
      "kolo_allgather_async(" + name + ")"));
  return finishGathered(h, name, "allgather", static_cast<int64_t>(count) * size(),
                        dataTypeSize(dtype), output);
}

Status KoloSession::alltoall(const std::string& name, const void* input, uint64_t block,
                             DataType dtype, void* output) {
  const int64_t total = static_cast<int64_t>(block) * size();
  const int64_t shape[1] = {total};
  kolo_handle_t h = 0;
  RETURN_IF_ERROR(fromKolo(kolo_alltoall_async(name.c_str(), input, 1, shape,
                                               static_cast<kolo_dtype_t>(dtype), nullptr, &h),
                           "kolo_alltoall_async(" + name + ")"));
  return finishGathered(h, name, "alltoall", total, dataTypeSize(dtype), output);
}

Status KoloSession::barrier() { return fromKolo(kolo_barrier(-1), "kolo_barrier"); }

Status KoloSession::maxAcrossRanks(const std::string& name, std::vector<double>& values) {
  return allreduce(name, values.data(), values.data(), values.size(), DataType::kFloat64,
                   ReduceOp::kMax);
}

Status KoloSession::sumAcrossRanks(const std::string& name, std::vector<int64_t>& values) {
  return allreduce(name, values.data(), values.data(), values.size(), DataType::kInt64,
                   ReduceOp::kSum);
}

}  // namespace kolo::bench
