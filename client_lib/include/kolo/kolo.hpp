// kolo C++ API: a header-only layer over the C ABI (kolo/kolo_c.h).
//
//   kolo::Result r = kolo::init();            // reads KOLO_* set by kolorun
//   std::vector<float> grad(1024, 1.0f);
//   r = kolo::allreduce("grad.0", grad.data(), grad.data(), {1024},
//                       kolo::DataType::kFloat32, kolo::ReduceOp::kAverage);
//   if (!r.ok()) std::cerr << r.message << "\n";
//
// Asynchronous form: allreduceAsync() returns an Expected<Handle>; wait with
// synchronize(handle) (or handle.wait()). A Handle is move-only and releases
// its operation on destruction if nobody waited for it (the collective still
// runs; its result is then not copied to the output buffer).
//
// No exceptions: every call returns a Result {code, message}. Everything is
// thread-safe. Link with -lkolo.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kolo/kolo_c.h"

namespace kolo {
// Versioned so these names never clash with kolo's internal ones.
inline namespace api_v1 {

enum class DataType : int {
  kFloat16 = KOLO_FLOAT16,
  kBFloat16 = KOLO_BFLOAT16,
  kFloat32 = KOLO_FLOAT32,
  kFloat64 = KOLO_FLOAT64,
  kInt8 = KOLO_INT8,
  kUint8 = KOLO_UINT8,
  kInt32 = KOLO_INT32,
  kInt64 = KOLO_INT64,
};

// Average divides the sum by the number of ranks.
enum class ReduceOp : int {
  kAverage = KOLO_AVERAGE,
  kSum = KOLO_SUM,
  kMin = KOLO_MIN,
  kMax = KOLO_MAX,
  kProduct = KOLO_PRODUCT,
};

// The DataType of a C++ element type (float, double, int8_t, uint8_t,
// int32_t, int64_t); use the enum directly for float16/bfloat16.
template <typename T>
constexpr DataType dataTypeOf() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DataType::kFloat32;
  else if constexpr (std::is_same_v<U, double>) return DataType::kFloat64;
  else if constexpr (std::is_same_v<U, int8_t>) return DataType::kInt8;
  else if constexpr (std::is_same_v<U, uint8_t>) return DataType::kUint8;
  else if constexpr (std::is_same_v<U, int32_t>) return DataType::kInt32;
  else if constexpr (std::is_same_v<U, int64_t>) return DataType::kInt64;
  else static_assert(!sizeof(T), "no kolo::DataType for this element type");
}

inline size_t dataTypeSize(DataType t) { return kolo_dtype_size(static_cast<kolo_dtype_t>(t)); }

// The outcome of a call: code KOLO_OK or an error with its text.
struct Result {
  kolo_status_t code = KOLO_OK;
  std::string message;

  bool ok() const { return code == KOLO_OK; }
  explicit operator bool() const { return ok(); }
  const char* codeName() const { return kolo_status_string(code); }
  // "KOLO_ERR_TIMED_OUT: ..." (or "KOLO_OK").
  std::string toString() const { return ok() ? codeName() : std::string(codeName()) + ": " + message; }

  // Wraps a C status, taking the thread's last-error text for errors.
  static Result fromC(kolo_status_t code) {
    if (code == KOLO_OK || code == KOLO_IN_PROGRESS) return Result{code, {}};
    return Result{code, kolo_last_error()};
  }
};

// A value or the Result saying why there is none.
template <typename T>
class Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}                  // NOLINT(implicit)
  Expected(Result error) : result_(std::move(error)) {}            // NOLINT(implicit)

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Result& result() const { return result_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  std::optional<T> value_;
  Result result_;
};

// --- lifecycle -------------------------------------------------------------
inline Result init() { return Result::fromC(kolo_init()); }
inline Result shutdown() { return Result::fromC(kolo_shutdown()); }
inline bool isInitialized() { return kolo_is_initialized() != 0; }
// -1 when not initialized.
inline int rank() { return kolo_rank(); }
inline int size() { return kolo_size(); }
inline int localRank() { return kolo_local_rank(); }
inline int localSize() { return kolo_local_size(); }
inline int crossRank() { return kolo_cross_rank(); }
inline int crossSize() { return kolo_cross_size(); }

// --- handles ---------------------------------------------------------------
class Handle {
 public:
  Handle() = default;
  explicit Handle(kolo_handle_t id) : id_(id) {}
  ~Handle() { release(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, 0)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      release();
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  kolo_handle_t id() const { return id_; }
  bool valid() const { return id_ != 0; }

  // KOLO_IN_PROGRESS while running, then the final Result (without waiting).
  Result poll() const {
    return valid() ? Result::fromC(kolo_poll(id_)) : Result{KOLO_ERR_INVALID_ARGUMENT, "empty handle"};
  }
  // Waits up to timeout_ms (<0: KOLO_OP_TIMEOUT). The handle becomes empty
  // unless the wait timed out (then wait again).
  Result wait(int64_t timeout_ms = -1) {
    if (!valid()) return Result{KOLO_ERR_INVALID_ARGUMENT, "empty handle"};
    Result r = Result::fromC(kolo_synchronize(id_, timeout_ms));
    if (r.code != KOLO_ERR_TIMED_OUT) id_ = 0;
    return r;
  }
  // Forgets the operation without waiting (it still runs).
  void release() {
    if (id_ != 0) kolo_release(std::exchange(id_, 0));
  }

 private:
  kolo_handle_t id_ = 0;
};

inline Result poll(const Handle& h) { return h.poll(); }
inline Result synchronize(Handle& h, int64_t timeout_ms = -1) { return h.wait(timeout_ms); }

// --- allreduce -------------------------------------------------------------
// Reduces `in` (shape, dtype) across all ranks into `out` (may equal `in`).
// `name` must be the same on every rank and not in flight already. Both
// buffers must stay valid until the operation completes.
inline Expected<Handle> allreduceAsync(const std::string& name, const void* in, void* out,
                                       const std::vector<int64_t>& shape, DataType dtype,
                                       ReduceOp op, double prescale = 1.0,
                                       double postscale = 1.0) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_allreduce_async(name.c_str(), in, out, static_cast<int>(shape.size()),
                                         shape.data(), static_cast<kolo_dtype_t>(dtype),
                                         static_cast<kolo_op_t>(op), prescale, postscale, &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}

inline Result allreduce(const std::string& name, const void* in, void* out,
                        const std::vector<int64_t>& shape, DataType dtype, ReduceOp op,
                        double prescale = 1.0, double postscale = 1.0) {
  return Result::fromC(kolo_allreduce(name.c_str(), in, out, static_cast<int>(shape.size()),
                                      shape.data(), static_cast<kolo_dtype_t>(dtype),
                                      static_cast<kolo_op_t>(op), prescale, postscale));
}

// float32 allreduce sent as float16 / bfloat16 (see kolo_allreduce_compressed).
enum class Compression { kNone = KOLO_COMPRESS_NONE, kFp16 = KOLO_COMPRESS_FP16, kBf16 = KOLO_COMPRESS_BF16 };
inline Expected<Handle> allreduceCompressedAsync(const std::string& name, const float* in, float* out,
                                                 const std::vector<int64_t>& shape, ReduceOp op,
                                                 Compression compression, double prescale = 1.0,
                                                 double postscale = 1.0) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_allreduce_compressed_async(name.c_str(), in, out, static_cast<int>(shape.size()),
                                                    shape.data(), static_cast<kolo_op_t>(op), prescale, postscale,
                                                    static_cast<kolo_compression_t>(compression), &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result allreduceCompressed(const std::string& name, const float* in, float* out,
                                  const std::vector<int64_t>& shape, ReduceOp op, Compression compression,
                                  double prescale = 1.0, double postscale = 1.0) {
  return Result::fromC(kolo_allreduce_compressed(name.c_str(), in, out, static_cast<int>(shape.size()),
                                                 shape.data(), static_cast<kolo_op_t>(op), prescale, postscale,
                                                 static_cast<kolo_compression_t>(compression)));
}

// In place over `count` elements of a typed array.
template <typename T>
Result allreduce(const std::string& name, T* data, size_t count, ReduceOp op = ReduceOp::kSum) {
  return allreduce(name, data, data, {static_cast<int64_t>(count)}, dataTypeOf<T>(), op);
}

// --- grouped allreduce ------------------------------------------------------
// Negotiated as one atomic unit and fused together; see kolo_c.h.
struct GroupMember {
  std::string name;
  const void* in = nullptr;
  void* out = nullptr;
  std::vector<int64_t> shape;
  DataType dtype = DataType::kFloat32;
};
namespace detail {
struct GroupArrays {
  std::vector<const char*> names;
  std::vector<const void*> ins;
  std::vector<void*> outs;
  std::vector<int> ndims;
  std::vector<const int64_t*> shapes;
  std::vector<kolo_dtype_t> dtypes;
  explicit GroupArrays(const std::vector<GroupMember>& m) {
    for (const GroupMember& g : m) {
      names.push_back(g.name.c_str());
      ins.push_back(g.in);
      outs.push_back(g.out);
      ndims.push_back(static_cast<int>(g.shape.size()));
      shapes.push_back(g.shape.data());
      dtypes.push_back(static_cast<kolo_dtype_t>(g.dtype));
    }
  }
};
}  // namespace detail
inline Expected<std::vector<Handle>> groupedAllreduceAsync(const std::vector<GroupMember>& members, ReduceOp op,
                                                           double prescale = 1.0, double postscale = 1.0) {
  detail::GroupArrays a(members);
  std::vector<kolo_handle_t> hs(members.size(), 0);
  kolo_status_t s = kolo_grouped_allreduce_async(static_cast<int>(members.size()), a.names.data(), a.ins.data(),
                                                 a.outs.data(), a.ndims.data(), a.shapes.data(), a.dtypes.data(),
                                                 static_cast<kolo_op_t>(op), prescale, postscale, hs.data());
  if (s != KOLO_OK) return Result::fromC(s);
  std::vector<Handle> out;
  for (kolo_handle_t h : hs) out.emplace_back(h);
  return out;
}
inline Result groupedAllreduce(const std::vector<GroupMember>& members, ReduceOp op, double prescale = 1.0,
                               double postscale = 1.0) {
  detail::GroupArrays a(members);
  return Result::fromC(kolo_grouped_allreduce(static_cast<int>(members.size()), a.names.data(), a.ins.data(),
                                              a.outs.data(), a.ndims.data(), a.shapes.data(), a.dtypes.data(),
                                              static_cast<kolo_op_t>(op), prescale, postscale));
}

// --- broadcast, allgather, reducescatter, barrier ---------------------------
// See kolo_c.h for the semantics and docs/collectives.md.
// In place: `buf` is read on global rank `root` and overwritten elsewhere.
inline Expected<Handle> broadcastAsync(const std::string& name, void* buf, const std::vector<int64_t>& shape,
                                       DataType dtype, int root) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_broadcast_async(name.c_str(), buf, static_cast<int>(shape.size()), shape.data(),
                                         static_cast<kolo_dtype_t>(dtype), root, &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result broadcast(const std::string& name, void* buf, const std::vector<int64_t>& shape, DataType dtype,
                        int root) {
  return Result::fromC(kolo_broadcast(name.c_str(), buf, static_cast<int>(shape.size()), shape.data(),
                                      static_cast<kolo_dtype_t>(dtype), root));
}

// Out of place: `out` receives the root's `in` on every rank; `in` is never written.
inline Expected<Handle> broadcastOopAsync(const std::string& name, const void* in, void* out,
                                          const std::vector<int64_t>& shape, DataType dtype, int root) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_broadcast_oop_async(name.c_str(), in, out, static_cast<int>(shape.size()), shape.data(),
                                             static_cast<kolo_dtype_t>(dtype), root, &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result broadcastOop(const std::string& name, const void* in, void* out, const std::vector<int64_t>& shape,
                           DataType dtype, int root) {
  return Result::fromC(kolo_broadcast_oop(name.c_str(), in, out, static_cast<int>(shape.size()), shape.data(),
                                          static_cast<kolo_dtype_t>(dtype), root));
}

// The ranks' tensors concatenated along the first dimension, in rank order.
struct Gathered {
  std::vector<unsigned char> data;
  int64_t dim0 = 0;  // rows: the sum of the ranks' first dimensions
};
namespace detail {
inline Expected<Gathered> allgatherOn(int32_t ps, const std::string& name, const void* in,
                                      const std::vector<int64_t>& shape, DataType dtype, int64_t timeout_ms) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_ps_allgather_async(ps, name.c_str(), in, static_cast<int>(shape.size()), shape.data(),
                                            static_cast<kolo_dtype_t>(dtype), &h);
  if (s != KOLO_OK) return Result::fromC(s);
  s = kolo_synchronize(h, timeout_ms);
  if (s != KOLO_OK) {
    Result r = Result::fromC(s);
    kolo_release(h);
    return r;
  }
  void* data = nullptr;
  Gathered g;
  s = kolo_result(h, &data, &g.dim0);
  if (s != KOLO_OK) {
    Result r = Result::fromC(s);
    kolo_release(h);
    return r;
  }
  size_t row = dataTypeSize(dtype);
  for (size_t i = 1; i < shape.size(); ++i) row *= static_cast<size_t>(shape[i]);
  const auto* p = static_cast<const unsigned char*>(data);
  g.data.assign(p, p + static_cast<size_t>(g.dim0) * row);
  kolo_release(h);
  return g;
}
}  // namespace detail
inline Expected<Gathered> allgather(const std::string& name, const void* in, const std::vector<int64_t>& shape,
                                    DataType dtype, int64_t timeout_ms = -1) {
  return detail::allgatherOn(0, name, in, shape, dtype, timeout_ms);
}

// Rank r receives its block of rows of the reduced tensor in `out`.
inline Expected<Handle> reducescatterAsync(const std::string& name, const void* in, void* out,
                                           const std::vector<int64_t>& shape, DataType dtype, ReduceOp op) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_reducescatter_async(name.c_str(), in, out, static_cast<int>(shape.size()), shape.data(),
                                             static_cast<kolo_dtype_t>(dtype), static_cast<kolo_op_t>(op), &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result reducescatter(const std::string& name, const void* in, void* out, const std::vector<int64_t>& shape,
                            DataType dtype, ReduceOp op) {
  return Result::fromC(kolo_reducescatter(name.c_str(), in, out, static_cast<int>(shape.size()), shape.data(),
                                          static_cast<kolo_dtype_t>(dtype), static_cast<kolo_op_t>(op)));
}

inline Result barrier(int64_t timeout_ms = -1) { return Result::fromC(kolo_barrier(timeout_ms)); }

// --- process sets (see kolo_add_process_set) --------------------------------
// A subset of the job's ranks with its own negotiation; a default-made
// ProcessSet is the global set. Everything on a set is relative to it
// (Average divides by its size, gathers in its rank order); a broadcast root
// stays a global rank of the set.
class ProcessSet {
 public:
  ProcessSet() = default;
  explicit ProcessSet(int32_t id) : id_(id) {}
  int32_t id() const { return id_; }
  int rank() const { return kolo_process_set_rank(id_); }  // -1: not a member
  int size() const { return kolo_process_set_size(id_); }
  bool included() const { return rank() >= 0; }
  std::vector<int> ranks() const {
    int n = 0;
    if (kolo_process_set_ranks(id_, nullptr, 0, &n) != KOLO_OK || n <= 0) return {};
    std::vector<int> out(static_cast<size_t>(n));
    kolo_process_set_ranks(id_, out.data(), n, &n);
    return out;
  }

 private:
  int32_t id_ = 0;
};

// Collective over the whole job: every rank adds the same sets in the same order.
inline Expected<ProcessSet> addProcessSet(const std::vector<int>& ranks) {
  int32_t id = -1;
  kolo_status_t s = kolo_add_process_set(ranks.data(), static_cast<int>(ranks.size()), &id);
  if (s != KOLO_OK) return Result::fromC(s);
  return ProcessSet(id);
}
inline Result removeProcessSet(const ProcessSet& ps) { return Result::fromC(kolo_remove_process_set(ps.id())); }

inline Expected<Handle> allreduceAsync(const ProcessSet& ps, const std::string& name, const void* in, void* out,
                                       const std::vector<int64_t>& shape, DataType dtype, ReduceOp op,
                                       double prescale = 1.0, double postscale = 1.0) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_ps_allreduce_async(ps.id(), name.c_str(), in, out, static_cast<int>(shape.size()),
                                            shape.data(), static_cast<kolo_dtype_t>(dtype),
                                            static_cast<kolo_op_t>(op), prescale, postscale, &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result allreduce(const ProcessSet& ps, const std::string& name, const void* in, void* out,
                        const std::vector<int64_t>& shape, DataType dtype, ReduceOp op, double prescale = 1.0,
                        double postscale = 1.0) {
  auto h = allreduceAsync(ps, name, in, out, shape, dtype, op, prescale, postscale);
  return h.ok() ? h->wait() : h.result();
}
inline Expected<Handle> broadcastAsync(const ProcessSet& ps, const std::string& name, void* buf,
                                       const std::vector<int64_t>& shape, DataType dtype, int root) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_ps_broadcast_async(ps.id(), name.c_str(), buf, static_cast<int>(shape.size()), shape.data(),
                                            static_cast<kolo_dtype_t>(dtype), root, &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result broadcast(const ProcessSet& ps, const std::string& name, void* buf, const std::vector<int64_t>& shape,
                        DataType dtype, int root) {
  auto h = broadcastAsync(ps, name, buf, shape, dtype, root);
  return h.ok() ? h->wait() : h.result();
}
inline Expected<Gathered> allgather(const ProcessSet& ps, const std::string& name, const void* in,
                                    const std::vector<int64_t>& shape, DataType dtype, int64_t timeout_ms = -1) {
  return detail::allgatherOn(ps.id(), name, in, shape, dtype, timeout_ms);
}
inline Expected<Handle> reducescatterAsync(const ProcessSet& ps, const std::string& name, const void* in, void* out,
                                           const std::vector<int64_t>& shape, DataType dtype, ReduceOp op) {
  kolo_handle_t h = 0;
  kolo_status_t s = kolo_ps_reducescatter_async(ps.id(), name.c_str(), in, out, static_cast<int>(shape.size()),
                                                shape.data(), static_cast<kolo_dtype_t>(dtype),
                                                static_cast<kolo_op_t>(op), &h);
  if (s != KOLO_OK) return Result::fromC(s);
  return Handle(h);
}
inline Result barrier(const ProcessSet& ps, int64_t timeout_ms = -1) {
  return Result::fromC(kolo_ps_barrier(ps.id(), timeout_ms));
}

// This rank has run out of data: see kolo_join. Returns the last rank to join.
inline Expected<int> join(int64_t timeout_ms = -1) {
  int last = -1;
  kolo_status_t s = kolo_join(timeout_ms, &last);
  if (s != KOLO_OK) return Result::fromC(s);
  return last;
}

// --- zero copy -------------------------------------------------------------
// Memory inside the agent-shared arena: tensors that live here are reduced
// in place, with no copy in or out. Valid until freed or kolo::shutdown().
inline Expected<void*> allocShared(size_t bytes) {
  void* p = kolo_alloc_shared(bytes);
  if (p == nullptr) return Result{kolo_last_status(), kolo_last_error()};
  return p;
}
inline void freeShared(void* p) { kolo_free_shared(p); }

// RAII owner of a shared buffer.
class SharedBuffer {
 public:
  SharedBuffer() = default;
  static Expected<SharedBuffer> allocate(size_t bytes) {
    auto p = allocShared(bytes);
    if (!p.ok()) return p.result();
    return SharedBuffer(*p, bytes);
  }
  ~SharedBuffer() { reset(); }
  SharedBuffer(SharedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  SharedBuffer& operator=(SharedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  void reset() {
    if (data_ != nullptr) freeShared(std::exchange(data_, nullptr));
    bytes_ = 0;
  }

 private:
  SharedBuffer(void* p, size_t bytes) : data_(p), bytes_(bytes) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// --- CUDA streams (C ABI revision 2) ---------------------------------------
// The calling thread's stream for device collectives while this object
// lives (kolo_set_stream; `stream` a cudaStream_t of `device`, nullptr: the
// legacy default stream); the thread's previous stream is restored after.
// result() says whether the stream was accepted.
class ScopedStream {
 public:
  explicit ScopedStream(void* stream, int device = KOLO_DEVICE_ANY) {
    saved_ok_ = kolo_get_stream(&saved_) == KOLO_OK;
    kolo_stream_t s = KOLO_STREAM_INIT;
    s.device = device;
    s.stream = stream;
    result_ = Result::fromC(kolo_set_stream(&s));
  }
  ~ScopedStream() { (void)kolo_set_stream(saved_ok_ ? &saved_ : nullptr); }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
  const Result& result() const { return result_; }

 private:
  kolo_stream_t saved_ = KOLO_STREAM_INIT;
  bool saved_ok_ = false;
  Result result_;
};

// The CUDA device of this rank's device arena, or why it has none.
inline Expected<int> devicePath() {
  int device = -1;
  kolo_status_t st = kolo_device_path(&device);
  if (st != KOLO_OK) return Result::fromC(st);
  return device;
}

// --- zero copy on the device (C ABI revision 3) ------------------------------
// Device memory in this rank's device arena (kolo_device_alloc): an allreduce
// or broadcast of a tensor here is reduced in place by the agent, with no
// copy in or out. Mind the stream ordering of kolo_c.h: until the op's
// synchronize, no stream may touch the tensor.
inline Expected<void*> deviceAlloc(size_t bytes) {
  void* p = nullptr;
  kolo_status_t st = kolo_device_alloc(bytes, &p);
  if (st != KOLO_OK) return Result::fromC(st);
  return p;
}
// Reused once the calling thread's kolo stream has passed this point.
inline Result deviceFree(void* p) { return Result::fromC(kolo_device_free(p)); }

}  // namespace api_v1
}  // namespace kolo
