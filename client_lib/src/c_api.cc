// The C ABI (include/kolo/kolo_c.h) over one process-global Client (the
// global set) and one Client per process set this rank belongs to
// (c_api_sets.cc). Nothing thrown may cross this boundary: every entry
// point catches.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#pragma GCC visibility push(default)
#include "kolo/kolo_c.h"
#pragma GCC visibility pop

#include "c_api_internal.h"
#include "client.h"
#include "current_pid.h"

static_assert(KOLO_ERR_PERMISSION_DENIED == static_cast<int>(kolo::Code::kPermissionDenied));
static_assert(KOLO_IN_PROGRESS == static_cast<int>(kolo::Code::kInProgress));
static_assert(KOLO_INT64 == static_cast<int>(kolo::DataType::kInt64));
static_assert(KOLO_PRODUCT == static_cast<int>(kolo::ReduceOp::kProduct));

namespace kolo::capi {

// Never destroyed: no kolo teardown runs from static destructors at exit
// (kolo_shutdown is explicit; an exit without it closes the socket and the
// agent treats the rank as gone).
std::mutex& mu() {
  static std::mutex& m = *new std::mutex;
  return m;
}
std::shared_ptr<Client>& globalClient() {
  static std::shared_ptr<Client>& c = *new std::shared_ptr<Client>;
  return c;
}
uint64_t& sessionGeneration() {
  static uint64_t g = 0;
  return g;
}
std::map<int32_t, ProcessSetEntry>& processSets() {
  static auto& m = *new std::map<int32_t, ProcessSetEntry>;
  return m;
}
int32_t& nextProcessSetId() {
  static int32_t id = 1;
  return id;
}

namespace {
thread_local std::string t_last_error;
thread_local kolo_status_t t_last_status = KOLO_OK;
kolo_status_t toC(Code c) { return static_cast<kolo_status_t>(c); }
}  // namespace

std::shared_ptr<Client> current() {
  std::lock_guard<std::mutex> lock(mu());
  return globalClient();
}

kolo_status_t fail(const Status& s) {
  t_last_error = s.message();
  t_last_status = toC(s.code());
  return t_last_status;
}

kolo_status_t fail(Code c, std::string message) { return fail(Status(c, std::move(message))); }

Status notInitializedStatus() {
  return invalidArgument("kolo has not been initialized; call kolo_init() first");
}

kolo_status_t notInitialized() { return fail(notInitializedStatus()); }

kolo_status_t report(const Status& s) { return s.isOk() ? KOLO_OK : fail(s); }

kolo_status_t handOut(const StatusOr<uint64_t>& h, int32_t ps, kolo_handle_t* handle) {
  if (!h.isOk()) return fail(h.status());
  *handle = tagHandle(ps, h.value());
  return KOLO_OK;
}

kolo_status_t handOutAll(const StatusOr<std::vector<uint64_t>>& hs, int32_t ps, int count, kolo_handle_t* handles) {
  if (!hs.isOk()) return fail(hs.status());
  for (int i = 0; i < count; ++i) handles[i] = tagHandle(ps, hs.value()[static_cast<size_t>(i)]);
  return KOLO_OK;
}

kolo_status_t internal(const char* where, const std::exception* e) {
  return fail(Code::kInternal, std::string("unexpected error in ") + where + ": " +
                                   (e != nullptr ? e->what() : "unknown exception"));
}

StatusOr<std::vector<AllreduceArgs>> groupMembers(const char* what, int count, const char* const* names,
                                                  const void* const* inputs, void* const* outputs, const int* ndims,
                                                  const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                                  kolo_op_t op, double prescale, double postscale) {
  if (count < 1) return invalidArgument(std::string(what) + ": count is " + std::to_string(count));
  if (names == nullptr || inputs == nullptr || ndims == nullptr || shapes == nullptr || dtypes == nullptr) {
    return invalidArgument(std::string(what) + ": names, inputs, ndims, shapes and dtypes must not be NULL");
  }
  std::vector<AllreduceArgs> members(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    AllreduceArgs& a = members[static_cast<size_t>(i)];
    a.name = names[i];
    a.input = inputs[i];
    a.output = outputs != nullptr ? outputs[i] : nullptr;
    a.ndim = ndims[i];
    a.shape = shapes[i];
    a.dtype = static_cast<int>(dtypes[i]);
    a.op = static_cast<int>(op);
    a.prescale = prescale;
    a.postscale = postscale;
    a.collective = static_cast<int>(CollectiveType::kAllreduce);
  }
  return members;
}

}  // namespace kolo::capi

namespace {

using kolo::Client;
using kolo::Code;
using kolo::Status;
using namespace kolo::capi;  // NOLINT

// A handle issued by a Client that was shut down since (or by a process set
// removed since).
kolo_status_t staleHandle(kolo_handle_t h) {
  std::lock_guard<std::mutex> lock(mu());
  if (sessionGeneration() == 0) return notInitialized();
  const int32_t ps = static_cast<int32_t>(h >> kSetShift);
  if (ps != 0 && globalClient()) {
    return fail(Code::kAborted, "handle " + std::to_string(h) + " belongs to process set " + std::to_string(ps) +
                                    ", which was removed (kolo_remove_process_set)");
  }
  return fail(Code::kAborted, "handle " + std::to_string(h) +
                                  " belongs to a kolo session that was shut down (kolo_shutdown)");
}

// The client that issued `h` and its own handle value (null client: gone).
std::pair<std::shared_ptr<Client>, uint64_t> route(kolo_handle_t h) {
  const int32_t ps = static_cast<int32_t>(h >> kSetShift);
  std::lock_guard<std::mutex> lock(mu());
  if (ps == 0) return {globalClient(), h};
  auto it = processSets().find(ps);
  if (it == processSets().end()) return {nullptr, h & kRawMask};
  return {it->second.client, h & kRawMask};
}

// The blocking forms: the asynchronous form's status and handle, waited for
// (a timed-out op is released: the caller has no handle to wait again with,
// and nothing is copied into its output later). `h` is a reference: it is
// read after the submission, which is an argument of the same call.
kolo_status_t waitOne(kolo_status_t submitted, const kolo_handle_t& h) {
  KOLO_C_GUARD("kolo_synchronize", {
    if (submitted != KOLO_OK) return submitted;
    auto [c, raw] = route(h);
    if (!c) return staleHandle(h);
    Status s = c->wait(raw, std::chrono::milliseconds(-1));
    if (s.code() == Code::kTimedOut) c->release(raw);
    return report(s);
  })
}

// The same for a group: waits for every member, returns the first error.
kolo_status_t waitAll(kolo_status_t submitted, const std::vector<kolo_handle_t>& hs) {
  if (submitted != KOLO_OK) return submitted;
  kolo_status_t first = KOLO_OK;
  std::string first_error;
  for (kolo_handle_t h : hs) {
    if (h == 0) continue;  // the spare entry of an empty group
    kolo_status_t st = waitOne(KOLO_OK, h);
    if (first == KOLO_OK && st != KOLO_OK) {
      first = st;
      first_error = kolo_last_error();
    }
  }
  if (first != KOLO_OK) fail(static_cast<Code>(first), first_error);
  return first;
}

int worldField(int kolo::WorldView::*field) {
  try {
    auto c = current();
    return c ? c->world().*field : -1;
  } catch (...) {
    return -1;
  }
}

}  // namespace

std::string kolo::capi::incarnationJobId(const std::string& job_id, uint64_t session) {
  return session <= 1 ? job_id : job_id + ".i" + std::to_string(session);
}

namespace {

// Whether this process started the agent's timeline from KOLO_TIMELINE_FILENAME
// (kolo_shutdown stops it, so the file ends as valid JSON).
bool& timelineFromEnv() {
  static bool started = false;
  return started;
}

// kolorun's --timeline-filename (KOLO_TIMELINE_FILENAME) on an agent kolorun
// did not start (a system agent, the hosts of -H): the job's local rank 0 on
// each agent asks it for the timeline, as hvd.start_timeline does, and a
// refusal fails kolo_init with the agent's reason (which names the folder it
// writes timelines in). kolorun's embedded agents (KOLO_EMBEDDED_AGENT=1)
// take the name as their own --timeline-filename instead.
Status startTimelineFromEnv(Client& c) {
  const char* file = std::getenv("KOLO_TIMELINE_FILENAME");
  const char* embedded = std::getenv("KOLO_EMBEDDED_AGENT");
  if (file == nullptr || *file == '\0' || (embedded != nullptr && std::string(embedded) == "1")) {
    return kolo::okStatus();
  }
  if (c.world().local_rank != 0) return kolo::okStatus();
  const char* marks = std::getenv("HOROVOD_TIMELINE_MARK_CYCLES");
  Status st = c.timelineControl(true, file, marks != nullptr && std::string(marks) == "1");
  if (!st.isOk()) {
    return Status(st.code(),
                  "KOLO_TIMELINE_FILENAME=" + std::string(file) +
                      " (kolorun --timeline-filename): the kolo agent writes no timeline there: " +
                      st.message() + "; give a name inside that folder, or leave the option out");
  }
  timelineFromEnv() = true;
  return kolo::okStatus();
}

// Shuts down every process set's connection (kolo_shutdown, or a fork).
void dropProcessSetsLocked() {
  for (auto& [id, e] : processSets()) {
    if (e.client) e.client->shutdown();
  }
  processSets().clear();
  nextProcessSetId() = 1;
}

// Direct launch: kolo's rank is the coordinator's (the agents' order by
// host name, then the local rank); say so when srun's or mpirun's differs.
void warnIfLauncherRankDiffers(const kolo::ClientOptions& o, int rank) {
  if (o.launcher_rank < 0 || o.launcher_rank == rank) return;
  std::string line = "kolo: warning: kolo rank " + std::to_string(rank) + " is " + o.launcher +
                     " rank " + std::to_string(o.launcher_rank) +
                     ": kolo numbers the nodes by host name and the ranks on a node by local rank "
                     "(use block distribution, srun -m block; docs/slurm.md)\n";
  (void)!::write(2, line.data(), line.size());
}

}  // namespace

extern "C" {

kolo_status_t kolo_init(void) {
  KOLO_C_GUARD("kolo_init", {
    // Held for the whole handshake: concurrent kolo_init calls connect once.
    std::lock_guard<std::mutex> lock(mu());
    auto& g = globalClient();
    if (g && g->ownerPid() != kolo::currentPid()) {
      // Inherited through fork(): drop it (and the process sets' connections)
      // without touching their fds.
      dropProcessSetsLocked();
      g->shutdown();
      g.reset();
    }
    if (g) return KOLO_OK;
    auto opts = kolo::ClientOptions::fromEnvironment();
    if (!opts.isOk()) return fail(opts.status());
    // Init after shutdown (Horovod allows it any number of times): the job
    // a rank shut down has ended on its agent and on the coordinator, so the
    // n-th session of this process joins a fresh incarnation of the job,
    // "<job>.i<n>". Every rank of the job counts its own sessions the same
    // way (Horovod's init/shutdown are collective), so they meet there. A
    // failed attempt counts too: when one rank's init times out, the
    // incarnation it tried is over for everyone (the others' attempts at it
    // fail as well), and the next attempt on every rank meets at the next one.
    // The count is per job: a process reused for another job (a Spark
    // Python worker, kolo.spark.run) starts that job's count afresh.
    static pid_t counted_pid = 0;
    static std::string counted_job;
    static uint64_t attempts = 0;
    if (counted_pid != kolo::currentPid() || counted_job != opts->job_id) {
      counted_pid = kolo::currentPid();
      counted_job = opts->job_id;
      attempts = 0;
    }
    opts->job_id = incarnationJobId(opts->job_id, ++attempts);
    auto client = Client::connect(*opts);
    if (!client.isOk()) return fail(client.status());
    g = std::shared_ptr<Client>(std::move(client).value());
    ++sessionGeneration();
    warnIfLauncherRankDiffers(*opts, g->world().rank);
    if (Status tl = startTimelineFromEnv(*g); !tl.isOk()) {
      g->shutdown();
      g.reset();
      return fail(tl);
    }
    return KOLO_OK;
  })
}

kolo_status_t kolo_shutdown(void) {
  KOLO_C_GUARD("kolo_shutdown", {
    std::shared_ptr<Client> c;
    {
      std::lock_guard<std::mutex> lock(mu());
      dropProcessSetsLocked();
      c = std::move(globalClient());
      globalClient().reset();
    }
    if (c && timelineFromEnv()) {
      timelineFromEnv() = false;
      (void)c->timelineControl(false, "", false);  // (best effort: the file ends as valid JSON)
    }
    if (c) c->shutdown();
    return KOLO_OK;
  })
}

int kolo_is_initialized(void) { return current() ? 1 : 0; }
int kolo_rank(void) { return worldField(&kolo::WorldView::rank); }
int kolo_size(void) { return worldField(&kolo::WorldView::size); }
int kolo_local_rank(void) { return worldField(&kolo::WorldView::local_rank); }
int kolo_local_size(void) { return worldField(&kolo::WorldView::local_size); }
int kolo_cross_rank(void) { return worldField(&kolo::WorldView::cross_rank); }
int kolo_cross_size(void) { return worldField(&kolo::WorldView::cross_size); }

// The global set's asynchronous collectives are the process-set ones with
// set 0 (c_api_sets.cc); the blocking forms wait on the handle (waitOne).

kolo_status_t kolo_allreduce_async(const char* name, const void* input, void* output, int ndim,
                                   const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                   double prescale, double postscale, kolo_handle_t* handle) {
  return kolo_ps_allreduce_async(0, name, input, output, ndim, shape, dtype, op, prescale, postscale, handle);
}

kolo_status_t kolo_allreduce(const char* name, const void* input, void* output, int ndim,
                             const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                             double prescale, double postscale) {
  kolo_handle_t h = 0;
  return waitOne(kolo_allreduce_async(name, input, output, ndim, shape, dtype, op, prescale, postscale, &h), h);
}

kolo_status_t kolo_grouped_allreduce_async(int count, const char* const* names, const void* const* inputs,
                                           void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                           const kolo_dtype_t* dtypes, kolo_op_t op, double prescale,
                                           double postscale, kolo_handle_t* handles) {
  return kolo_ps_grouped_allreduce_async(0, count, names, inputs, outputs, ndims, shapes, dtypes, op, prescale,
                                         postscale, handles);
}

kolo_status_t kolo_grouped_allreduce(int count, const char* const* names, const void* const* inputs,
                                     void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                     const kolo_dtype_t* dtypes, kolo_op_t op, double prescale, double postscale) {
  std::vector<kolo_handle_t> hs(static_cast<size_t>(std::max(count, 1)));  // data() never NULL
  return waitAll(kolo_grouped_allreduce_async(count, names, inputs, outputs, ndims, shapes, dtypes, op, prescale,
                                              postscale, hs.data()),
                 hs);
}

kolo_status_t kolo_grouped_allgather_async(int count, const char* const* names, const void* const* inputs,
                                           const int* ndims, const int64_t* const* shapes,
                                           const kolo_dtype_t* dtypes, kolo_handle_t* handles) {
  return kolo_ps_grouped_allgather_async(0, count, names, inputs, ndims, shapes, dtypes, handles);
}

kolo_status_t kolo_grouped_reducescatter_async(int count, const char* const* names, const void* const* inputs,
                                               void* const* outputs, const int* ndims,
                                               const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                               kolo_op_t op, kolo_handle_t* handles) {
  return kolo_ps_grouped_reducescatter_async(0, count, names, inputs, outputs, ndims, shapes, dtypes, op, handles);
}

kolo_status_t kolo_grouped_reducescatter(int count, const char* const* names, const void* const* inputs,
                                         void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                         const kolo_dtype_t* dtypes, kolo_op_t op) {
  std::vector<kolo_handle_t> hs(static_cast<size_t>(std::max(count, 1)));  // data() never NULL
  return waitAll(kolo_grouped_reducescatter_async(count, names, inputs, outputs, ndims, shapes, dtypes, op, hs.data()),
                 hs);
}

kolo_status_t kolo_broadcast_async(const char* name, void* buffer, int ndim, const int64_t* shape,
                                   kolo_dtype_t dtype, int root, kolo_handle_t* handle) {
  return kolo_ps_broadcast_async(0, name, buffer, ndim, shape, dtype, root, handle);
}

kolo_status_t kolo_broadcast(const char* name, void* buffer, int ndim, const int64_t* shape,
                             kolo_dtype_t dtype, int root) {
  kolo_handle_t h = 0;
  return waitOne(kolo_broadcast_async(name, buffer, ndim, shape, dtype, root, &h), h);
}

kolo_status_t kolo_broadcast_oop_async(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, kolo_dtype_t dtype, int root, kolo_handle_t* handle) {
  return kolo_ps_broadcast_oop_async(0, name, input, output, ndim, shape, dtype, root, handle);
}

kolo_status_t kolo_broadcast_oop(const char* name, const void* input, void* output, int ndim,
                                 const int64_t* shape, kolo_dtype_t dtype, int root) {
  kolo_handle_t h = 0;
  return waitOne(kolo_broadcast_oop_async(name, input, output, ndim, shape, dtype, root, &h), h);
}

kolo_status_t kolo_allreduce_compressed_async(const char* name, const float* input, float* output, int ndim,
                                              const int64_t* shape, kolo_op_t op, double prescale, double postscale,
                                              kolo_compression_t compression, kolo_handle_t* handle) {
  return kolo_ps_allreduce_compressed_async(0, name, input, output, ndim, shape, op, prescale, postscale,
                                            compression, handle);
}

kolo_status_t kolo_allreduce_compressed(const char* name, const float* input, float* output, int ndim,
                                        const int64_t* shape, kolo_op_t op, double prescale, double postscale,
                                        kolo_compression_t compression) {
  kolo_handle_t h = 0;
  return waitOne(
      kolo_allreduce_compressed_async(name, input, output, ndim, shape, op, prescale, postscale, compression, &h), h);
}

kolo_status_t kolo_allgather_async(const char* name, const void* input, int ndim, const int64_t* shape,
                                   kolo_dtype_t dtype, kolo_handle_t* handle) {
  return kolo_ps_allgather_async(0, name, input, ndim, shape, dtype, handle);
}

kolo_status_t kolo_alltoall_async(const char* name, const void* input, int ndim, const int64_t* shape,
                                  kolo_dtype_t dtype, const int64_t* splits, kolo_handle_t* handle) {
  return kolo_ps_alltoall_async(0, name, input, ndim, shape, dtype, splits, handle);
}

kolo_status_t kolo_result(kolo_handle_t handle, void** data, int64_t* dim0) {
  KOLO_C_GUARD("kolo_result", {
    if (data == nullptr || dim0 == nullptr) return fail(Code::kInvalidArgument, "kolo_result: data or dim0 is NULL");
    *data = nullptr;
    *dim0 = 0;
    auto [c, raw] = route(handle);
    if (!c) return staleHandle(handle);
    auto r = c->result(raw);
    if (!r.isOk()) return fail(r.status());
    *data = const_cast<void*>((*r)->bytes());  // (device ops: a device address)
    *dim0 = (*r)->dim0;
    return KOLO_OK;
  })
}

kolo_status_t kolo_reducescatter_async(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                       kolo_handle_t* handle) {
  return kolo_ps_reducescatter_async(0, name, input, output, ndim, shape, dtype, op, handle);
}

kolo_status_t kolo_reducescatter(const char* name, const void* input, void* output, int ndim,
                                 const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op) {
  kolo_handle_t h = 0;
  return waitOne(kolo_reducescatter_async(name, input, output, ndim, shape, dtype, op, &h), h);
}

kolo_status_t kolo_barrier(int64_t timeout_ms) { return kolo_ps_barrier(0, timeout_ms); }

kolo_status_t kolo_start_timeline(const char* path, int mark_cycles) {
  KOLO_C_GUARD("kolo_start_timeline", {
    auto c = current();
    if (!c) return notInitialized();
    if (path == nullptr) return report(kolo::invalidArgument("kolo_start_timeline: path is NULL"));
    return report(c->timelineControl(true, path, mark_cycles != 0));
  })
}

kolo_status_t kolo_stop_timeline(void) {
  KOLO_C_GUARD("kolo_stop_timeline", {
    auto c = current();
    if (!c) return notInitialized();
    return report(c->timelineControl(false, "", false));
  })
}

kolo_status_t kolo_join(int64_t timeout_ms, int* last_joined_rank) {
  KOLO_C_GUARD("kolo_join", {
    if (last_joined_rank != nullptr) *last_joined_rank = -1;
    auto c = current();
    if (!c) return notInitialized();
    if (timeout_ms > int64_t{1} << 40) timeout_ms = int64_t{1} << 40;
    auto r = c->join(std::chrono::milliseconds(timeout_ms));
    if (!r.isOk()) return fail(r.status());
    if (last_joined_rank != nullptr) *last_joined_rank = *r;
    return KOLO_OK;
  })
}

kolo_status_t kolo_poll(kolo_handle_t handle) {
  KOLO_C_GUARD("kolo_poll", {
    auto [c, raw] = route(handle);
    if (!c) return staleHandle(handle);
    Status s = c->poll(raw);
    if (s.code() == Code::kInProgress) return KOLO_IN_PROGRESS;
    return report(s);
  })
}

kolo_status_t kolo_synchronize(kolo_handle_t handle, int64_t timeout_ms) {
  KOLO_C_GUARD("kolo_synchronize", {
    auto [c, raw] = route(handle);
    if (!c) return staleHandle(handle);
    if (timeout_ms > int64_t{1} << 40) timeout_ms = int64_t{1} << 40;  // no overflow below
    return report(c->wait(raw, std::chrono::milliseconds(timeout_ms)));
  })
}

void kolo_release(kolo_handle_t handle) {
  try {
    auto [c, raw] = route(handle);
    if (c) c->release(raw);
  } catch (...) {
  }
}

void* kolo_alloc_shared(size_t bytes) {
  try {
    auto c = current();
    if (!c) {
      notInitialized();
      return nullptr;
    }
    auto p = c->allocShared(bytes);
    if (!p.isOk()) {
      fail(p.status());
      return nullptr;
    }
    return *p;
  } catch (const std::exception& e) {
    internal("kolo_alloc_shared", &e);
  } catch (...) {
    internal("kolo_alloc_shared", nullptr);
  }
  return nullptr;
}

void kolo_free_shared(void* ptr) {
  if (ptr == nullptr) return;
  try {
    auto c = current();
    if (!c) {
      notInitialized();
      return;
    }
    Status s = c->freeShared(ptr);
    if (!s.isOk()) fail(s);
  } catch (const std::exception& e) {
    internal("kolo_free_shared", &e);
  } catch (...) {
    internal("kolo_free_shared", nullptr);
  }
}

// --- CUDA streams (ABI 2) ----------------------------------------------------

// kolo_stream_t as ABI 2 defines it: the size a caller must pass at least.
static constexpr size_t kStreamV2Size = offsetof(kolo_stream_t, stream) + sizeof(void*);
static_assert(sizeof(kolo_stream_t) >= kStreamV2Size);

kolo_status_t kolo_set_stream(const kolo_stream_t* s) {
  KOLO_C_GUARD("kolo_set_stream", {
    if (s == nullptr) {
      kolo::threadStream() = kolo::ThreadStream{};
      return KOLO_OK;
    }
    if (s->struct_size < kStreamV2Size) {
      return fail(Code::kInvalidArgument, "kolo_set_stream: struct_size is " + std::to_string(s->struct_size) +
                                              "; a kolo_stream_t has at least " + std::to_string(kStreamV2Size) +
                                              " bytes (initialize it with KOLO_STREAM_INIT)");
    }
    // Fields of a later ABI revision this libkolo does not know: refused
    // unless zero (their default), never silently ignored.
    const auto* bytes = reinterpret_cast<const unsigned char*>(s);
    for (size_t i = sizeof(kolo_stream_t); i < s->struct_size && i < 4096; ++i) {
      if (bytes[i] != 0) {
        return fail(Code::kInvalidArgument,
                    "kolo_set_stream: the kolo_stream_t has " + std::to_string(s->struct_size) +
                        " bytes with fields after byte " + std::to_string(sizeof(kolo_stream_t)) +
                        " set, which this libkolo (ABI " + std::to_string(KOLO_ABI_VERSION) + ") does not know");
      }
    }
    if (s->device < KOLO_DEVICE_ANY) {
      return fail(Code::kInvalidArgument, "kolo_set_stream: device is " + std::to_string(s->device) +
                                              "; it must be a CUDA device ordinal or KOLO_DEVICE_ANY (-1)");
    }
    kolo::threadStream() = kolo::ThreadStream{s->device, s->stream};
    return KOLO_OK;
  })
}

kolo_status_t kolo_get_stream(kolo_stream_t* s) {
  KOLO_C_GUARD("kolo_get_stream", {
    if (s == nullptr) return fail(Code::kInvalidArgument, "kolo_get_stream: s is NULL");
    if (s->struct_size < kStreamV2Size) {
      return fail(Code::kInvalidArgument, "kolo_get_stream: struct_size is " + std::to_string(s->struct_size) +
                                              "; a kolo_stream_t has at least " + std::to_string(kStreamV2Size) +
                                              " bytes (initialize it with KOLO_STREAM_INIT)");
    }
    const kolo::ThreadStream& t = kolo::threadStream();
    s->device = t.device;
    s->stream = t.stream;
    return KOLO_OK;
  })
}

kolo_status_t kolo_device_path(int* device) {
  KOLO_C_GUARD("kolo_device_path", {
    if (device != nullptr) *device = -1;
    auto c = current();
    if (!c) return notInitialized();
    if (!c->deviceReady()) {
      return fail(Code::kUnavailable, "this rank has no device arena: " + c->deviceWhy());
    }
    if (device != nullptr) *device = c->deviceOrdinal();
    return KOLO_OK;
  })
}

const char* kolo_status_string(kolo_status_t status) {
  switch (status) {
    case KOLO_OK: return "KOLO_OK";
    case KOLO_IN_PROGRESS: return "KOLO_IN_PROGRESS";
    case KOLO_ERR_INVALID_ARGUMENT: return "KOLO_ERR_INVALID_ARGUMENT";
    case KOLO_ERR_UNAVAILABLE: return "KOLO_ERR_UNAVAILABLE";
    case KOLO_ERR_TIMED_OUT: return "KOLO_ERR_TIMED_OUT";
    case KOLO_ERR_ABORTED: return "KOLO_ERR_ABORTED";
    case KOLO_ERR_PEER_FAILURE: return "KOLO_ERR_PEER_FAILURE";
    case KOLO_ERR_MEMBERSHIP_CHANGED: return "KOLO_ERR_MEMBERSHIP_CHANGED";
    case KOLO_ERR_INTERNAL: return "KOLO_ERR_INTERNAL";
    case KOLO_ERR_PERMISSION_DENIED: return "KOLO_ERR_PERMISSION_DENIED";
  }
  return "KOLO_ERR_UNKNOWN";
}

const char* kolo_last_error(void) { return t_last_error.c_str(); }
kolo_status_t kolo_last_status(void) { return t_last_status; }

size_t kolo_dtype_size(kolo_dtype_t dtype) {
  int v = static_cast<int>(dtype);
  return kolo::isValidDataType(v) ? kolo::dataTypeSize(static_cast<kolo::DataType>(v)) : 0;
}

}  // extern "C"
