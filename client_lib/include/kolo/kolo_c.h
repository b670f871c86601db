/* kolo C ABI: stable, closed error enum, no exceptions cross it.
 *
 * A training process calls kolo_init() (settings come from the environment
 * kolorun sets: KOLO_AGENT_SOCKET, KOLO_JOB_ID, KOLO_JOB_TOKEN, KOLO_SIZE,
 * KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE, KOLO_START_TIMEOUT), then submits named
 * collectives asynchronously and waits on handles. Every function is
 * thread-safe. On error a function returns a kolo_status_t other than
 * KOLO_OK and kolo_last_error() (thread-local) holds the text.
 */
#ifndef KOLO_KOLO_C_H_
#define KOLO_KOLO_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The C ABI's revision. It only grows by additions (new functions, types
 * and constants; no signature changes), so a program built against an
 * older revision runs against a newer libkolo.so.1 (the SONAME stays 1).
 * 1: everything marked "added in ABI 1". 2: CUDA streams (kolo_stream_t,
 * kolo_set_stream, kolo_get_stream, kolo_device_path); the symbols added
 * in 2 carry the version KOLO_2, so an older libkolo refuses to load a
 * program that uses them instead of failing at the call. 3: zero copy on
 * the device (kolo_device_alloc, kolo_device_free; version KOLO_3). */
#define KOLO_ABI_VERSION 3

typedef enum {
  KOLO_OK = 0,
  KOLO_IN_PROGRESS = 1,              /* not finished yet (kolo_poll) */
  KOLO_ERR_INVALID_ARGUMENT = 2,     /* bad input, mismatch across ranks, duplicate name */
  KOLO_ERR_UNAVAILABLE = 3,          /* agent not reachable / connection lost */
  KOLO_ERR_TIMED_OUT = 4,            /* a deadline passed */
  KOLO_ERR_ABORTED = 5,              /* the job was shut down (a rank left, drain) */
  KOLO_ERR_PEER_FAILURE = 6,         /* another rank or node of the job failed */
  KOLO_ERR_MEMBERSHIP_CHANGED = 7,   /* elastic: the generation changed */
  KOLO_ERR_INTERNAL = 8,             /* a bug or unexpected system error */
  KOLO_ERR_PERMISSION_DENIED = 9     /* wrong job token, or the agent socket refused this user */
} kolo_status_t;

typedef enum {
  KOLO_FLOAT16 = 0,
  KOLO_BFLOAT16 = 1,
  KOLO_FLOAT32 = 2,
  KOLO_FLOAT64 = 3,
  KOLO_INT8 = 4,
  KOLO_UINT8 = 5,
  KOLO_INT32 = 6,
  KOLO_INT64 = 7
} kolo_dtype_t;

typedef enum {
  KOLO_AVERAGE = 0,
  KOLO_SUM = 1,
  KOLO_MIN = 3,
  KOLO_MAX = 4,
  KOLO_PRODUCT = 5
} kolo_op_t;

/* Wire formats for kolo_allreduce_compressed[_async] (added in ABI 1). */
typedef enum {
  KOLO_COMPRESS_NONE = 0,
  KOLO_COMPRESS_FP16 = 1,
  KOLO_COMPRESS_BF16 = 2
} kolo_compression_t;

typedef uint64_t kolo_handle_t;   /* 0 is never a valid handle */

/* --- lifecycle ---------------------------------------------------------- */
kolo_status_t kolo_init(void);
kolo_status_t kolo_shutdown(void);
int kolo_is_initialized(void);
/* -1 when not initialized. */
int kolo_rank(void);
int kolo_size(void);
int kolo_local_rank(void);
int kolo_local_size(void);
int kolo_cross_rank(void);
int kolo_cross_size(void);

/* --- allreduce ---------------------------------------------------------- */
/* Reduces `input` (ndim dims of `shape`, dtype) across all ranks of the job
 * into `output` (may equal input). `name` identifies the tensor across ranks
 * (<= 255 bytes) and must not be in flight already on this rank. Average
 * divides by the job size; prescale multiplies each input before the
 * reduction, postscale the result after it. Buffers must stay valid until
 * the handle completes. */
kolo_status_t kolo_allreduce_async(const char* name, const void* input, void* output, int ndim,
                                   const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                   double prescale, double postscale, kolo_handle_t* handle);
kolo_status_t kolo_allreduce(const char* name, const void* input, void* output, int ndim,
                             const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                             double prescale, double postscale);

/* --- grouped allreduce (added in ABI 1, additive) ------------------------ */
/* `count` allreduces negotiated as one atomic unit: none of them runs until
 * every one is ready on every rank, and they are fused together (one
 * reduction across nodes while they fit the fusion threshold). Member i is
 * names[i], inputs[i] -> outputs[i] (may be equal), ndims[i] dims of
 * shapes[i], dtypes[i]; op and the scale factors apply to all. Every rank's
 * n-th grouped allreduce must list the same names in the same order
 * ("Mismatched group membership for tensor 'x': ..." otherwise, and the
 * whole group fails). Every member is checked before any is submitted.
 * handles[i] receives member i's handle (wait on each, or on all with
 * kolo_grouped_allreduce). */
kolo_status_t kolo_grouped_allreduce_async(int count, const char* const* names, const void* const* inputs,
                                           void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                           const kolo_dtype_t* dtypes, kolo_op_t op, double prescale,
                                           double postscale, kolo_handle_t* handles);
/* Blocking: returns the first member's error, after waiting for all. */
kolo_status_t kolo_grouped_allreduce(int count, const char* const* names, const void* const* inputs,
                                     void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                     const kolo_dtype_t* dtypes, kolo_op_t op, double prescale, double postscale);

/* --- broadcast (added in ABI 1, additive) -------------------------------- */
/* In place: on rank `root` (a global rank) `buffer` is the input; on every
 * other rank it is overwritten with the root's tensor once the handle
 * completes (kolo_synchronize). Every rank must pass the same name, shape,
 * dtype and root ("Mismatched broadcast root ranks ..." otherwise). */
kolo_status_t kolo_broadcast_async(const char* name, void* buffer, int ndim, const int64_t* shape,
                                   kolo_dtype_t dtype, int root, kolo_handle_t* handle);
kolo_status_t kolo_broadcast(const char* name, void* buffer, int ndim, const int64_t* shape,
                             kolo_dtype_t dtype, int root);

/* Out of place (added in ABI 1, additive): `output` receives the root's
 * `input` on every rank, the root included; `input` is never written and
 * may be NULL on the ranks other than the root. Same rules as above. */
kolo_status_t kolo_broadcast_oop_async(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, kolo_dtype_t dtype, int root, kolo_handle_t* handle);
kolo_status_t kolo_broadcast_oop(const char* name, const void* input, void* output, int ndim,
                                 const int64_t* shape, kolo_dtype_t dtype, int root);

/* --- compressed allreduce (added in ABI 1, additive) --------------------- */
/* Allreduce of a float32 tensor sent as float16 or bfloat16: the input is
 * rounded (to nearest even) into the shared arena, reduced in that type
 * (see docs/collectives.md for the accumulation precision), and the result
 * is widened back into the float32 `output` (may equal input). Arguments as
 * kolo_allreduce_async with dtype implied float32; KOLO_COMPRESS_NONE is a
 * plain float32 allreduce. The ranks must agree on the compression (they
 * otherwise disagree on the dtype: "Mismatched data types ..."). */
kolo_status_t kolo_allreduce_compressed_async(const char* name, const float* input, float* output, int ndim,
                                              const int64_t* shape, kolo_op_t op, double prescale, double postscale,
                                              kolo_compression_t compression, kolo_handle_t* handle);
kolo_status_t kolo_allreduce_compressed(const char* name, const float* input, float* output, int ndim,
                                        const int64_t* shape, kolo_op_t op, double prescale, double postscale,
                                        kolo_compression_t compression);

/* --- allgather (added in ABI 1, additive) -------------------------------- */
/* Concatenates every rank's `input` (ndim >= 1 dims of `shape`, dtype) along
 * the first dimension, in rank order. The first dimension may differ per
 * rank (0 included); the other dimensions, dtype and name must match
 * ("Mismatched allgather tensor shapes ..." otherwise). The call first
 * exchanges the ranks' first dimensions (an internal allreduce named
 * "<name>.__sizes", so names must stay <= 247 bytes), which blocks until
 * every rank has called it; `input` may be reused once it returns. After
 * kolo_synchronize(handle) returns KOLO_OK, kolo_result(handle, &data, &dim0)
 * gives a pointer to a library-owned copy of the output (dim0 = its first
 * dimension, the sum over ranks) that stays valid until
 * kolo_release(handle), which the caller must call to free it. A device
 * tensor's allgather (and alltoall) leaves its output in this rank's device
 * arena: `data` is then a device address, ready on the thread's stream
 * (kolo_set_stream), reused once that stream passed kolo_release. */
kolo_status_t kolo_allgather_async(const char* name, const void* input, int ndim, const int64_t* shape,
                                   kolo_dtype_t dtype, kolo_handle_t* handle);
kolo_status_t kolo_result(kolo_handle_t handle, void** data, int64_t* dim0);

/* --- reducescatter (added in ABI 1, additive) ---------------------------- */
/* Reduces `input` (same ndim >= 1, shape, dtype and op on every rank; op as
 * for allreduce, Average divides by the job size) and leaves rank r's block
 * of rows of the result in `output`: shape[0] / size rows each, and the first
 * shape[0] % size ranks one more (rank r's block starts at row
 * r * (shape[0] / size) + min(r, shape[0] % size)); the other dimensions are
 * kept. `output` must hold that many rows (it may be NULL when it is 0). */
kolo_status_t kolo_reducescatter_async(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                       kolo_handle_t* handle);
kolo_status_t kolo_reducescatter(const char* name, const void* input, void* output, int ndim,
                                 const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op);

/* --- alltoall (added in ABI 1, additive) --------------------------------- */
/* Rank r sends splits[d] rows (along the first dimension, in order) of
 * `input` to each rank d and receives the rows every rank sends it,
 * concatenated from rank 0 up. splits has kolo_size() entries adding up to
 * shape[0]; NULL splits evenly (shape[0] must divide by the size). The other
 * dimensions and the dtype must match across ranks. Like allgather, the call
 * first exchanges the splits ("<name>.__splits"; names <= 246 bytes), which
 * returns once every rank has called it, and the output is read with
 * kolo_result(handle, &data, &dim0) after kolo_synchronize (dim0 = rows
 * received), valid until kolo_release(handle). */
kolo_status_t kolo_alltoall_async(const char* name, const void* input, int ndim, const int64_t* shape,
                                  kolo_dtype_t dtype, const int64_t* splits, kolo_handle_t* handle);

/* --- barrier (added in ABI 1, additive) ---------------------------------- */
/* Returns once every rank of the job has entered the barrier (the n-th
 * kolo_barrier call of each rank pairs with the n-th of the others).
 * timeout_ms < 0: the op timeout (KOLO_OP_TIMEOUT). */
kolo_status_t kolo_barrier(int64_t timeout_ms);

/* --- join (added in ABI 1, additive) ------------------------------------ */
/* For a rank that has run out of data (Horovod's join): from this call on
 * the rank takes no part in collectives; the other ranks' allreduces go on
 * with zeros in its place (Average still divides by the job size) and their
 * allgathers with zero rows from it; any other collective fails with
 * KOLO_ERR_INVALID_ARGUMENT while a rank has joined. Returns once every rank
 * has joined; *last_joined_rank (may be NULL) is then the global rank that
 * joined last, the same on every rank. timeout_ms < 0: KOLO_OP_TIMEOUT. See
 * docs/collectives.md. */
kolo_status_t kolo_join(int64_t timeout_ms, int* last_joined_rank);

/* --- grouped allgather and reducescatter (added in ABI 1, additive) ------ */
/* Like kolo_grouped_allreduce: `count` members negotiated as one atomic
 * unit (none runs before every member is ready on every rank), with the same
 * membership rule and error. Grouped allgather: member i is as
 * kolo_allgather_async (names[i], inputs[i], ndims[i] dims of shapes[i],
 * dtypes[i]); the first dimensions of all members are exchanged in one
 * grouped step, then the gathers run; each handles[i] gives its output
 * through kolo_result. Grouped reducescatter: member i is as
 * kolo_reducescatter_async, op applies to all. */
kolo_status_t kolo_grouped_allgather_async(int count, const char* const* names, const void* const* inputs,
                                           const int* ndims, const int64_t* const* shapes,
                                           const kolo_dtype_t* dtypes, kolo_handle_t* handles);
kolo_status_t kolo_grouped_reducescatter_async(int count, const char* const* names, const void* const* inputs,
                                               void* const* outputs, const int* ndims,
                                               const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                               kolo_op_t op, kolo_handle_t* handles);
kolo_status_t kolo_grouped_reducescatter(int count, const char* const* names, const void* const* inputs,
                                         void* const* outputs, const int* ndims, const int64_t* const* shapes,
                                         const kolo_dtype_t* dtypes, kolo_op_t op);

/* --- process sets (added in ABI 1, additive) ----------------------------- */
/* A process set is a subset of the job's ranks with its own negotiation,
 * response cache and (across nodes) its own agent ring, so collectives on
 * different sets run concurrently and never wait for each other. Set 0 is
 * the global set (every rank); every function without a process-set
 * argument uses it.
 *
 * kolo_add_process_set is collective over the whole job (Horovod's
 * add_process_set): every rank calls it, in the same order, with the same
 * `ranks` (global ranks, any order, no duplicates). It returns once the
 * members have connected the set (bounded by KOLO_START_TIMEOUT) and gives
 * every rank the same *id (ids are never reused within a session). Ranks
 * outside the set get the id too but may not run collectives on it. A list
 * the ranks disagree on fails on every rank with the lists named; a list
 * equal to an existing set's is refused ("already exists as process set
 * N"). kolo_remove_process_set is collective too; it fails pending ops of
 * the set with KOLO_ERR_ABORTED. kolo_shutdown removes every set. */
kolo_status_t kolo_add_process_set(const int* ranks, int count, int32_t* id);
kolo_status_t kolo_remove_process_set(int32_t id);
/* This rank's rank within the set (-1: not a member or unknown set), the
 * set's size (-1: unknown set), and its ranks (global, ascending; *count
 * gets the size; at most `capacity` are written). */
int kolo_process_set_rank(int32_t id);
int kolo_process_set_size(int32_t id);
kolo_status_t kolo_process_set_ranks(int32_t id, int* ranks, int capacity, int* count);

/* The collectives on a process set. Everything is relative to the set:
 * Average divides by the set's size, allgather concatenates and
 * reducescatter / alltoall split in the set's rank order (ascending global
 * rank), alltoall's splits have kolo_process_set_size(ps) entries, and the
 * broadcast root stays a GLOBAL rank (Horovod's convention) that must be in
 * the set. Names are per set: the same name may be in flight on two sets at
 * once. A rank outside the set gets KOLO_ERR_INVALID_ARGUMENT. Handles work
 * with kolo_poll / kolo_synchronize / kolo_result / kolo_release as usual. */
kolo_status_t kolo_ps_allreduce_async(int32_t ps, const char* name, const void* input, void* output, int ndim,
                                      const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                      double postscale, kolo_handle_t* handle);
kolo_status_t kolo_ps_allreduce_compressed_async(int32_t ps, const char* name, const float* input, float* output,
                                                 int ndim, const int64_t* shape, kolo_op_t op, double prescale,
                                                 double postscale, kolo_compression_t compression,
                                                 kolo_handle_t* handle);
kolo_status_t kolo_ps_grouped_allreduce_async(int32_t ps, int count, const char* const* names,
                                              const void* const* inputs, void* const* outputs, const int* ndims,
                                              const int64_t* const* shapes, const kolo_dtype_t* dtypes, kolo_op_t op,
                                              double prescale, double postscale, kolo_handle_t* handles);
kolo_status_t kolo_ps_broadcast_async(int32_t ps, const char* name, void* buffer, int ndim, const int64_t* shape,
                                      kolo_dtype_t dtype, int root, kolo_handle_t* handle);
kolo_status_t kolo_ps_broadcast_oop_async(int32_t ps, const char* name, const void* input, void* output, int ndim,
                                          const int64_t* shape, kolo_dtype_t dtype, int root,
                                          kolo_handle_t* handle);
kolo_status_t kolo_ps_allgather_async(int32_t ps, const char* name, const void* input, int ndim,
                                      const int64_t* shape, kolo_dtype_t dtype, kolo_handle_t* handle);
kolo_status_t kolo_ps_grouped_allgather_async(int32_t ps, int count, const char* const* names,
                                              const void* const* inputs, const int* ndims,
                                              const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                              kolo_handle_t* handles);
kolo_status_t kolo_ps_reducescatter_async(int32_t ps, const char* name, const void* input, void* output, int ndim,
                                          const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                          kolo_handle_t* handle);
kolo_status_t kolo_ps_grouped_reducescatter_async(int32_t ps, int count, const char* const* names,
                                                  const void* const* inputs, void* const* outputs, const int* ndims,
                                                  const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                                  kolo_op_t op, kolo_handle_t* handles);
kolo_status_t kolo_ps_alltoall_async(int32_t ps, const char* name, const void* input, int ndim,
                                     const int64_t* shape, kolo_dtype_t dtype, const int64_t* splits,
                                     kolo_handle_t* handle);
kolo_status_t kolo_ps_barrier(int32_t ps, int64_t timeout_ms);

/* --- handles ------------------------------------------------------------ */
/* KOLO_IN_PROGRESS while running; otherwise the final status (the handle
 * stays valid until kolo_synchronize/kolo_release). */
kolo_status_t kolo_poll(kolo_handle_t handle);
/* Waits up to timeout_ms (<0: the op timeout, KOLO_OP_TIMEOUT, default 600 s)
 * and releases the handle unless the wait timed out. Copies the result to
 * the output buffer if it was not zero-copy. */
kolo_status_t kolo_synchronize(kolo_handle_t handle, int64_t timeout_ms);
/* Forgets a handle without waiting for its result (the op still runs). */
void kolo_release(kolo_handle_t handle);

/* --- zero copy ---------------------------------------------------------- */
/* Memory inside the agent-shared arena: tensors allocated here are reduced
 * in place with no copy-in or copy-out. An allreduce whose input and output
 * both lie here (different buffers, not overlapping) writes the result into
 * the output and leaves the input unchanged, with no copy either. NULL (and
 * kolo_last_error) if the arena is full or kolo is not initialized. */
void* kolo_alloc_shared(size_t bytes);
void kolo_free_shared(void* ptr);

/* --- timeline (added in ABI 1, additive) -------------------------------- */
/* Starts the agent's Chrome-trace timeline, written to `path` on the
 * agent's machine (as `kolo timeline start PATH`, HOROVOD's
 * start_timeline); `mark_cycles` adds a mark per negotiation cycle. Stop
 * closes the file as valid JSON. The call waits (10 s at most) for the
 * agent's answer and returns its refusal, e.g. KOLO_ERR_PERMISSION_DENIED
 * for a path outside the agent's timeline directory (kolo_last_error()
 * names that directory). */
kolo_status_t kolo_start_timeline(const char* path, int mark_cycles);
kolo_status_t kolo_stop_timeline(void);

/* --- CUDA streams (added in ABI 2, additive) ---------------------------- */
/* Device tensors (CUDA device or managed memory) take libkolo's device path
 * once the process asked for it: KOLO_DEVICE_ARENA_MB > 0 in the environment
 * at kolo_init, which gives the process a device arena on its current CUDA
 * device (docs/gpu.md). Each device collective then runs on a CUDA stream:
 * its input is copied into the arena on that stream (after the work already
 * queued there: nothing blocks the host), and when kolo_synchronize (or
 * kolo_poll) sees it complete, the stream waits on the agent's event and the
 * result is copied into the output on that stream. The result is therefore
 * ready *on that stream*: later work on the same stream sees it; another
 * stream must wait on it (cudaStreamWaitEvent), and the host must
 * synchronize the stream before reading it.
 *
 * Which stream: the calling thread's kolo stream, named with kolo_set_stream
 * before the submission (as cudaSetDevice names a thread's device, and as
 * PyTorch's current stream is per thread): it applies to every asynchronous
 * collective the thread submits afterwards (kolo_allreduce_async,
 * kolo_grouped_*, kolo_broadcast*, kolo_ps_*: one call covers them all,
 * including the process-set forms), until the thread names another. A
 * thread that never called it uses the legacy default stream (NULL), as
 * before ABI 2. Host tensors ignore the stream: they behave exactly as
 * before. The stream must stay valid until the op's handle is synchronized
 * or released.
 *
 * kolo_stream_t is versioned by its size: set struct_size to
 * sizeof(kolo_stream_t) (KOLO_STREAM_INIT does), so that later revisions can
 * append fields; a libkolo accepts a larger struct as long as the fields it
 * does not know are zero. */
#define KOLO_DEVICE_ANY (-1)

typedef struct kolo_stream {
  size_t struct_size; /* sizeof(kolo_stream_t) as the caller compiled it */
  int device;         /* the CUDA device ordinal of `stream` (and of the tensors),
                         or KOLO_DEVICE_ANY: the device of this rank's device arena */
  void* stream;       /* a cudaStream_t of that device; NULL: the legacy default stream */
} kolo_stream_t;

#define KOLO_STREAM_INIT {sizeof(kolo_stream_t), KOLO_DEVICE_ANY, NULL}

/* Names the calling thread's stream (NULL `s`: back to the legacy default
 * stream on any device). Needs no kolo_init. KOLO_ERR_INVALID_ARGUMENT for
 * a struct_size smaller than ABI 2's kolo_stream_t, unknown trailing fields
 * that are not zero, or a device below KOLO_DEVICE_ANY. A device tensor
 * submitted later with a `device` other than the one of the rank's device
 * arena (or a tensor that lives on another GPU than the arena) fails its
 * submission with KOLO_ERR_INVALID_ARGUMENT naming both devices. */
kolo_status_t kolo_set_stream(const kolo_stream_t* s);
/* The calling thread's stream (s->struct_size must be set; fields beyond
 * it are not written). */
kolo_status_t kolo_get_stream(kolo_stream_t* s);
/* Whether this rank can hand kolo device tensors: KOLO_OK with *device (may
 * be NULL) the CUDA device ordinal of its device arena, or
 * KOLO_ERR_UNAVAILABLE (and *device = -1) with the reason in kolo_last_error
 * (KOLO_DEVICE_ARENA_MB not set, no GPU, the agent granted none, a libkolo
 * built without CUDA, ...). KOLO_ERR_INVALID_ARGUMENT before kolo_init. */
kolo_status_t kolo_device_path(int* device);

/* --- zero copy on the device (added in ABI 3, additive) ----------------- */
/* Device memory inside this rank's device arena (the one kolo_device_path
 * reports; KOLO_DEVICE_ARENA_MB sizes it), which the agent maps too: an
 * allreduce or broadcast whose tensor lies in such a buffer is "resident":
 * nothing is copied into a staging slot before it or out after it; the
 * agent reduces (broadcast: copies) in place in the buffer. In place
 * (input == output) it moves no byte besides the reduction itself; out of
 * place with the output resident, the input is copied into the output on
 * the stream first (one copy) and the op runs in place there.
 *
 * Ordering on the op's stream (kolo_set_stream): the agent starts after the
 * work queued on that stream before the submission (the tensor's producer)
 * and nothing else; until kolo_synchronize / kolo_poll has seen the op
 * complete (which makes that stream wait for the agent), no work on any
 * stream may write the input or touch the output, the op's own stream
 * included (with user memory the input may be rewritten on the op's stream
 * right after the submission: the copy-in came first; here there is none).
 * After it the result is ready on the op's stream, as with user memory.
 *
 * kolo_device_alloc: KOLO_OK and *ptr (64-byte aligned, on the arena's
 * device), or *ptr = NULL and KOLO_ERR_UNAVAILABLE when this rank has no
 * device arena (the reason) or the arena has no free block that large (its
 * size, what kolo_device_alloc buffers and ops in flight hold, the largest
 * free block, and the knob: KOLO_DEVICE_ARENA_MB), KOLO_ERR_INVALID_ARGUMENT
 * for size 0 or ptr NULL, or before kolo_init. Buffers and the staging
 * slots of user-memory ops share the arena. A buffer is valid until
 * kolo_device_free or kolo_shutdown.
 *
 * kolo_device_free: NULL is a no-op. KOLO_ERR_INVALID_ARGUMENT for a pointer
 * kolo_device_alloc did not return (or freed already), and for a buffer an
 * op still in flight uses (its name). Like cudaFreeAsync, the space is
 * reused once the calling thread's kolo stream has passed the free: free a
 * buffer on the stream its ops ran on (the agent may still be working in it
 * when kolo_synchronize returns; that stream waits for it), or after
 * synchronizing that stream. */
kolo_status_t kolo_device_alloc(size_t bytes, void** ptr);
kolo_status_t kolo_device_free(void* ptr);
/* The same as an allocator hook of the shape torch's CUDAPluggableAllocator
 * (and cudaMallocAsync) use: kolo.torch installs them with
 * KOLO_DEVICE_ZERO_COPY=1 so that every CUDA tensor lives in the device
 * arena. kolo_device_alloc_stream returns NULL for size 0 and on any error
 * (then kolo_last_error and stderr say why; `device` >= 0 must be the
 * arena's); the buffer is usable on any stream. kolo_device_free_stream
 * reuses the space once `stream` passed the free (size and device are
 * ignored); an error goes to kolo_last_error and stderr. */
void* kolo_device_alloc_stream(size_t bytes, int device, void* stream);
void kolo_device_free_stream(void* ptr, size_t bytes, int device, void* stream);

/* --- errors ------------------------------------------------------------- */
const char* kolo_status_string(kolo_status_t status);  /* "KOLO_ERR_TIMED_OUT" */
const char* kolo_last_error(void);                     /* thread-local text of the last error */
/* Added in ABI 1 (additive): the thread-local code that went with
 * kolo_last_error() (KOLO_OK before any error), for the calls that report
 * errors by returning NULL (kolo_alloc_shared) or nothing (kolo_free_shared). */
kolo_status_t kolo_last_status(void);
size_t kolo_dtype_size(kolo_dtype_t dtype);

#ifdef __cplusplus
}
#endif
#endif /* KOLO_KOLO_C_H_ */
