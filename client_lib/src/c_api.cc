// The C ABI (include/kolo/kolo_c.h) over one process-global Client.
//
// The global is a shared_ptr behind a mutex: each call takes a reference and
// works without the mutex, so a slow wait never blocks other threads, and
// kolo_shutdown() never frees a Client another thread is still inside.
// Nothing thrown may cross this boundary: every entry point catches.

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "client.h"

#pragma GCC visibility push(default)
#include "kolo/kolo_c.h"
#pragma GCC visibility pop

static_assert(KOLO_ERR_PERMISSION_DENIED == static_cast<int>(kolo::Code::kPermissionDenied));
static_assert(KOLO_IN_PROGRESS == static_cast<int>(kolo::Code::kInProgress));
static_assert(KOLO_INT64 == static_cast<int>(kolo::DataType::kInt64));
static_assert(KOLO_PRODUCT == static_cast<int>(kolo::ReduceOp::kProduct));

namespace {

using kolo::Client;
using kolo::Code;
using kolo::Status;

// Never destroyed: no kolo teardown runs from static destructors at exit
// (kolo_shutdown is explicit; an exit without it closes the socket and the
// agent treats the rank as gone).
std::mutex& g_mu = *new std::mutex;
std::shared_ptr<Client>& g_client = *new std::shared_ptr<Client>;  // guarded by g_mu
uint64_t g_generation = 0;            // bumped by each successful kolo_init
thread_local std::string t_last_error;
thread_local kolo_status_t t_last_status = KOLO_OK;

std::shared_ptr<Client> current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_client;
}

kolo_status_t toC(Code c) { return static_cast<kolo_status_t>(c); }

kolo_status_t fail(const Status& s) {
  t_last_error = s.message();
  t_last_status = toC(s.code());
  return t_last_status;
}

kolo_status_t fail(Code c, std::string message) { return fail(Status(c, std::move(message))); }

kolo_status_t notInitialized() {
  return fail(Code::kInvalidArgument, "kolo has not been initialized; call kolo_init() first");
}

kolo_status_t report(const Status& s) { return s.isOk() ? KOLO_OK : fail(s); }

// The two endings every collective wrapper shares: hand a submitted op's
// handle to the caller (async forms), or wait for it (blocking forms; a
// timed-out op is released so its handle does not leak).
kolo_status_t handOut(const kolo::StatusOr<uint64_t>& h, kolo_handle_t* handle) {
  if (!h.isOk()) return fail(h.status());
  *handle = h.value();
  return KOLO_OK;
}

kolo_status_t waitFor(Client& c, const kolo::StatusOr<uint64_t>& h) {
  if (!h.isOk()) return fail(h.status());
  Status s = c.wait(h.value(), std::chrono::milliseconds(-1));
  if (s.code() == Code::kTimedOut) c.release(h.value());
  return report(s);
}

// A handle issued by a Client that was shut down since.
kolo_status_t staleHandle(kolo_handle_t h) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_generation == 0) return notInitialized();
  return fail(Code::kAborted, "handle " + std::to_string(h) +
                                  " belongs to a kolo session that was shut down (kolo_shutdown)");
}

kolo_status_t internal(const char* where, const std::exception* e) {
  return fail(Code::kInternal, std::string("unexpected error in ") + where + ": " +
                                   (e != nullptr ? e->what() : "unknown exception"));
}

#define KOLO_C_GUARD(where, ...)                      \
  try {                                               \
    __VA_ARGS__                                       \
  } catch (const std::exception& e) {                 \
    return internal(where, &e);                       \
  } catch (...) {                                     \
    return internal(where, nullptr);                  \
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

namespace {
kolo::StatusOr<uint64_t> submitCompressed(Client& c, const char* name, const float* input, float* output,
                                          int ndim, const int64_t* shape, kolo_op_t op, double prescale,
                                          double postscale, kolo_compression_t compression) {
  kolo::AllreduceArgs a;
  a.name = name;
  a.input = input;
  a.output = output;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = static_cast<int>(kolo::DataType::kFloat32);
  a.op = static_cast<int>(op);
  a.prescale = prescale;
  a.postscale = postscale;
  switch (compression) {
    case KOLO_COMPRESS_NONE: return c.allreduceAsync(a);
    case KOLO_COMPRESS_FP16: return c.compressedAllreduceAsync(a, kolo::DataType::kFloat16);
    case KOLO_COMPRESS_BF16: return c.compressedAllreduceAsync(a, kolo::DataType::kBFloat16);
  }
  return kolo::invalidArgument("compressed allreduce of tensor '" + std::string(name != nullptr ? name : "") +
                               "': unknown compression " + std::to_string(static_cast<int>(compression)));
}

kolo::StatusOr<std::vector<uint64_t>> submitGroup(Client& c, int count, const char* const* names,
                                                  const void* const* inputs, void* const* outputs, const int* ndims,
                                                  const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                                  kolo_op_t op, double prescale, double postscale) {
  if (count < 1) return kolo::invalidArgument("grouped allreduce: count is " + std::to_string(count));
  if (names == nullptr || inputs == nullptr || outputs == nullptr || ndims == nullptr || shapes == nullptr ||
      dtypes == nullptr) {
    return kolo::invalidArgument("grouped allreduce: names, inputs, outputs, ndims, shapes and dtypes must not be NULL");
  }
  std::vector<kolo::AllreduceArgs> members(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    kolo::AllreduceArgs& a = members[static_cast<size_t>(i)];
    a.name = names[i];
    a.input = inputs[i];
    a.output = outputs[i];
    a.ndim = ndims[i];
    a.shape = shapes[i];
    a.dtype = static_cast<int>(dtypes[i]);
    a.op = static_cast<int>(op);
    a.prescale = prescale;
    a.postscale = postscale;
    a.collective = static_cast<int>(kolo::CollectiveType::kAllreduce);
  }
  return c.groupedAllreduceAsync(std::move(members));
}
}  // namespace

extern "C" {

kolo_status_t kolo_init(void) {
  KOLO_C_GUARD("kolo_init", {
    // Held for the whole handshake: concurrent kolo_init calls connect once.
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_client && g_client->ownerPid() != ::getpid()) {
      g_client->shutdown();  // inherited through fork(): drop it without touching its fds
      g_client.reset();
    }
    if (g_client) return KOLO_OK;
    auto opts = kolo::ClientOptions::fromEnvironment();
    if (!opts.isOk()) return fail(opts.status());
    auto client = Client::connect(*opts);
    if (!client.isOk()) return fail(client.status());
    g_client = std::shared_ptr<Client>(std::move(client).value());
    ++g_generation;
    return KOLO_OK;
  })
}

kolo_status_t kolo_shutdown(void) {
  KOLO_C_GUARD("kolo_shutdown", {
    std::shared_ptr<Client> c;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      c = std::move(g_client);
      g_client.reset();
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

kolo_status_t kolo_allreduce_async(const char* name, const void* input, void* output, int ndim,
                                   const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                   double prescale, double postscale, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_allreduce_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_allreduce_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    kolo::AllreduceArgs a;
    a.name = name;
    a.input = input;
    a.output = output;
    a.ndim = ndim;
    a.shape = shape;
    a.dtype = static_cast<int>(dtype);
    a.op = static_cast<int>(op);
    a.prescale = prescale;
    a.postscale = postscale;
    return handOut(c->allreduceAsync(a), handle);
  })
}

kolo_status_t kolo_allreduce(const char* name, const void* input, void* output, int ndim,
                             const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                             double prescale, double postscale) {
  KOLO_C_GUARD("kolo_allreduce", {
    auto c = current();
    if (!c) return notInitialized();
    kolo::AllreduceArgs a;
    a.name = name;
    a.input = input;
    a.output = output;
    a.ndim = ndim;
    a.shape = shape;
    a.dtype = static_cast<int>(dtype);
    a.op = static_cast<int>(op);
    a.prescale = prescale;
    a.postscale = postscale;
    // A timed-out op is released: the caller has no handle to wait again
    // with, and nothing is copied into `output` later.
    return waitFor(*c, c->allreduceAsync(a));
  })
}


kolo_status_t kolo_grouped_allreduce_async(int count, const char* const* names, const void* const* inputs,
                                           void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                           const kolo_dtype_t* dtypes, kolo_op_t op, double prescale,
                                           double postscale, kolo_handle_t* handles) {
  KOLO_C_GUARD("kolo_grouped_allreduce_async", {
    if (handles == nullptr) return fail(Code::kInvalidArgument, "kolo_grouped_allreduce_async: handles is NULL");
    for (int i = 0; i < count; ++i) handles[i] = 0;
    auto c = current();
    if (!c) return notInitialized();
    auto hs = submitGroup(*c, count, names, inputs, outputs, ndims, shapes, dtypes, op, prescale, postscale);
    if (!hs.isOk()) return fail(hs.status());
    for (int i = 0; i < count; ++i) handles[i] = (*hs)[static_cast<size_t>(i)];
    return KOLO_OK;
  })
}

kolo_status_t kolo_grouped_allreduce(int count, const char* const* names, const void* const* inputs,
                                     void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                     const kolo_dtype_t* dtypes, kolo_op_t op, double prescale, double postscale) {
  KOLO_C_GUARD("kolo_grouped_allreduce", {
    auto c = current();
    if (!c) return notInitialized();
    auto hs = submitGroup(*c, count, names, inputs, outputs, ndims, shapes, dtypes, op, prescale, postscale);
    if (!hs.isOk()) return fail(hs.status());
    Status first;
    for (uint64_t h : *hs) {
      Status s = c->wait(h, std::chrono::milliseconds(-1));
      if (s.code() == Code::kTimedOut) c->release(h);
      if (first.isOk() && !s.isOk()) first = s;
    }
    return report(first);
  })
}

kolo_status_t kolo_broadcast_async(const char* name, void* buffer, int ndim, const int64_t* shape,
                                   kolo_dtype_t dtype, int root, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_broadcast_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_broadcast_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    return handOut(c->broadcastAsync(name, buffer, ndim, shape, static_cast<int>(dtype), root), handle);
  })
}

kolo_status_t kolo_broadcast(const char* name, void* buffer, int ndim, const int64_t* shape,
                             kolo_dtype_t dtype, int root) {
  KOLO_C_GUARD("kolo_broadcast", {
    auto c = current();
    if (!c) return notInitialized();
    return waitFor(*c, c->broadcastAsync(name, buffer, ndim, shape, static_cast<int>(dtype), root));
  })
}

kolo_status_t kolo_broadcast_oop_async(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, kolo_dtype_t dtype, int root, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_broadcast_oop_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_broadcast_oop_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    return handOut(c->broadcastOopAsync(name, input, output, ndim, shape, static_cast<int>(dtype), root), handle);
  })
}

kolo_status_t kolo_broadcast_oop(const char* name, const void* input, void* output, int ndim,
                                 const int64_t* shape, kolo_dtype_t dtype, int root) {
  KOLO_C_GUARD("kolo_broadcast_oop", {
    auto c = current();
    if (!c) return notInitialized();
    return waitFor(*c, c->broadcastOopAsync(name, input, output, ndim, shape, static_cast<int>(dtype), root));
  })
}

kolo_status_t kolo_allreduce_compressed_async(const char* name, const float* input, float* output, int ndim,
                                              const int64_t* shape, kolo_op_t op, double prescale, double postscale,
                                              kolo_compression_t compression, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_allreduce_compressed_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_allreduce_compressed_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    return handOut(submitCompressed(*c, name, input, output, ndim, shape, op, prescale, postscale, compression),
                   handle);
  })
}

kolo_status_t kolo_allreduce_compressed(const char* name, const float* input, float* output, int ndim,
                                        const int64_t* shape, kolo_op_t op, double prescale, double postscale,
                                        kolo_compression_t compression) {
  KOLO_C_GUARD("kolo_allreduce_compressed", {
    auto c = current();
    if (!c) return notInitialized();
    return waitFor(*c, submitCompressed(*c, name, input, output, ndim, shape, op, prescale, postscale, compression));
  })
}

kolo_status_t kolo_allgather_async(const char* name, const void* input, int ndim, const int64_t* shape,
                                   kolo_dtype_t dtype, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_allgather_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_allgather_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    return handOut(c->allgatherAsync(name, input, ndim, shape, static_cast<int>(dtype)), handle);
  })
}

kolo_status_t kolo_alltoall_async(const char* name, const void* input, int ndim, const int64_t* shape,
                                  kolo_dtype_t dtype, const int64_t* splits, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_alltoall_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_alltoall_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    return handOut(c->alltoallAsync(name, input, ndim, shape, static_cast<int>(dtype), splits), handle);
  })
}

kolo_status_t kolo_result(kolo_handle_t handle, void** data, int64_t* dim0) {
  KOLO_C_GUARD("kolo_result", {
    if (data == nullptr || dim0 == nullptr) return fail(Code::kInvalidArgument, "kolo_result: data or dim0 is NULL");
    *data = nullptr;
    *dim0 = 0;
    auto c = current();
    if (!c) return staleHandle(handle);
    auto r = c->result(handle);
    if (!r.isOk()) return fail(r.status());
    *data = const_cast<char*>((*r)->data.data());
    *dim0 = (*r)->dim0;
    return KOLO_OK;
  })
}

kolo_status_t kolo_reducescatter_async(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                       kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_reducescatter_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_reducescatter_async: handle is NULL");
    *handle = 0;
    auto c = current();
    if (!c) return notInitialized();
    return handOut(c->reducescatterAsync(name, input, output, ndim, shape, static_cast<int>(dtype), static_cast<int>(op)), handle);
  })
}

kolo_status_t kolo_reducescatter(const char* name, const void* input, void* output, int ndim,
                                 const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op) {
  KOLO_C_GUARD("kolo_reducescatter", {
    auto c = current();
    if (!c) return notInitialized();
    return waitFor(*c, c->reducescatterAsync(name, input, output, ndim, shape, static_cast<int>(dtype), static_cast<int>(op)));
  })
}

kolo_status_t kolo_barrier(int64_t timeout_ms) {
  KOLO_C_GUARD("kolo_barrier", {
    auto c = current();
    if (!c) return notInitialized();
    if (timeout_ms > int64_t{1} << 40) timeout_ms = int64_t{1} << 40;
    return report(c->barrier(std::chrono::milliseconds(timeout_ms)));
  })
}

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
    auto c = current();
    if (!c) return staleHandle(handle);
    Status s = c->poll(handle);
    if (s.code() == Code::kInProgress) return KOLO_IN_PROGRESS;
    return report(s);
  })
}

kolo_status_t kolo_synchronize(kolo_handle_t handle, int64_t timeout_ms) {
  KOLO_C_GUARD("kolo_synchronize", {
    auto c = current();
    if (!c) return staleHandle(handle);
    if (timeout_ms > int64_t{1} << 40) timeout_ms = int64_t{1} << 40;  // no overflow below
    return report(c->wait(handle, std::chrono::milliseconds(timeout_ms)));
  })
}

void kolo_release(kolo_handle_t handle) {
  try {
    if (auto c = current()) c->release(handle);
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
