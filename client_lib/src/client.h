// Client: one process's connection to its node's kolo-agent.
//
// connect() does the handshake (Hello -> Welcome + arena/doorbell/completion
// descriptors -> WorldInfo). Every collective goes through submit()
// (client_submit.cc; docs/architecture.md, "One submission in libkolo"):
// the slot plan (common/slot_plan.h) says where the tensor goes in the
// shared arena (or that it is used in place when it already lives there),
// the bytes are copied in, a SubmitDesc is pushed into the submission ring
// and the doorbell rung. Completions come
// back through the completion ring; whichever thread is waiting drains them,
// copies results out and frees the slots.
//
// At most min(ring capacities) = 1024 ops are in flight; a submission beyond
// that, or one that finds the arena full, drains completions until there is
// room (bounded by the op timeout). A forked child never touches its
// parent's connection.
//
// Threading: every public function is thread-safe. mu_ guards the handle
// table and the submission ring (the single producer); at most one thread at
// a time "drains" (completion ring + socket), marked by draining_ under mu_;
// the others wait on cv_ with a short bounded timeout. The arena stays mapped
// and the descriptors open until the Client is destroyed, so threads still
// inside a call when shutdown() runs never touch freed memory.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "arena_allocator.h"
#include "client_options.h"
#include "device_client.h"
#include "common/dtype.h"
#include "common/fd.h"
#include "common/frame.h"
#include "common/ipc_layout.h"
#include "common/shm.h"
#include "common/slot_plan.h"
#include "common/status.h"

namespace kolo {

namespace ipc {
class AgentFrame;
class Hello;
}

struct WorldView {
  uint64_t generation = 0;
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  int local_size = -1;
  int cross_rank = -1;
  int cross_size = -1;
};

// One collective as submitted: every public entry (allreduce, broadcast,
// allgather, alltoall, reducescatter, grouped calls, barrier, join) fills
// one and hands it to Client::submit().
struct OpArgs {
  const char* name = nullptr;
  const void* input = nullptr;
  void* output = nullptr;
  int ndim = 0;
  const int64_t* shape = nullptr;
  int dtype = 0;      // DataType value (checked)
  int op = 0;         // ReduceOp value (checked)
  double prescale = 1.0;
  double postscale = 1.0;
  int collective = 0;  // CollectiveType (kAllreduce by default)
  int root = -1;       // broadcast: the root's global rank
  // Allgather (internal): every rank's first dimension, int64[world size].
  const int64_t* gather_dims = nullptr;
  // Alltoall (internal): the split matrix, int64[world size][world size].
  const int64_t* splits_matrix = nullptr;
  // Never work in place on `input` (out-of-place broadcast): copy it into a
  // slot even when it lives in the arena.
  bool out_of_place = false;
  // Compressed allreduce: `input`/`output` hold float32; the wire dtype
  // (`dtype`) is float16 or bfloat16, converted on the way in and out.
  bool compressed = false;
  // Grouped allreduce (set by groupedAllreduceAsync).
  uint64_t group_id = 0;
  uint64_t group_hash = 0;
  uint32_t group_size = 0;
  // Device path (docs/gpu.md): -1 = detect (device memory is recognised once
  // the process asked for a device arena with KOLO_DEVICE_ARENA_MB), 0 =
  // host, 1 = device. `stream`: the caller's cudaStream_t; the copies in and
  // out are ordered on it (NULL: the calling thread's kolo_set_stream
  // stream, by default the legacy default stream).
  int device = -1;
  void* stream = nullptr;
};

// The slot planner's view of `a` (common/slot_plan.h): its parameters and
// `bytes`; the arena offsets, if any, are the caller's to add.
SlotRequest slotRequest(const OpArgs& a, uint64_t bytes);
// The name OpArgs had when every collective went through allreduceAsync.
using AllreduceArgs = OpArgs;

class Client {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects and waits for the job's world (both bounded by the start timeout).
  static StatusOr<std::unique_ptr<Client>> connect(const ClientOptions& opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  WorldView world() const;
  const ClientOptions& options() const { return opts_; }
  pid_t ownerPid() const { return owner_pid_; }  // the process that connected

  // The one submit path (client_submit.cc): validates `args`, plans where
  // its pieces go in the arena (common/slot_plan.h) or stages it in the
  // device arena, copies in and publishes the descriptor; returns a fresh
  // nonzero handle. Errors name the collective ("broadcast of tensor 'x'").
  StatusOr<uint64_t> submit(const OpArgs& args);
  // submit() with args.collective as given (kAllreduce unless set).
  StatusOr<uint64_t> allreduceAsync(const AllreduceArgs& args);
  // Grouped allreduce: the members (allreduces) are negotiated as one
  // atomic unit (none runs before every member is ready on every rank) and
  // fused together. Every rank's n-th grouped allreduce must have the same
  // members in the same order. Returns one handle per member.
  StatusOr<std::vector<uint64_t>> groupedAllreduceAsync(std::vector<AllreduceArgs> members);
  // Grouped reducescatter / allgather: the same atomic negotiation for
  // reducescatters (members as reducescatterAsync's arguments) and
  // allgathers (as allgatherAsync's: the first dimensions of all members are
  // exchanged in one grouped allreduce first, waited for here).
  StatusOr<std::vector<uint64_t>> groupedReducescatterAsync(std::vector<AllreduceArgs> members);
  StatusOr<std::vector<uint64_t>> groupedAllgatherAsync(std::vector<AllreduceArgs> members);
  // In-place broadcast of `buf` from global rank `root` (buf is read on the
  // root and overwritten on the others).
  StatusOr<uint64_t> broadcastAsync(const char* name, void* buf, int ndim, const int64_t* shape,
                                    int dtype, int root);
  // Out-of-place broadcast: `output` receives the root's `input` on every
  // rank (the root included); `input` is never written (NULL is fine on the
  // other ranks).
  StatusOr<uint64_t> broadcastOopAsync(const char* name, const void* input, void* output, int ndim,
                                       const int64_t* shape, int dtype, int root);
  // Allreduce of float32 tensors sent as float16 / bfloat16 (`wire`): the
  // input is converted into the arena, reduced in that type, and the result
  // converted back into the float32 `output`.
  StatusOr<uint64_t> compressedAllreduceAsync(AllreduceArgs a, DataType wire);
  // Returns once every rank of the job has called barrier() (the n-th call
  // on each rank pairs with the n-th call on the others): a zero-byte
  // allreduce named "__kolo.barrier.<n>".
  Status barrier(std::chrono::milliseconds timeout);
  // Join (Horovod semantics): this rank takes no more part; the others'
  // allreduces go on with zeros in its place (allgathers with zero rows).
  // Returns once every rank has joined, with the last rank to join.
  StatusOr<int> join(std::chrono::milliseconds timeout);
  // Reducescatter: the tensors (same shape on every rank) are reduced and
  // rank r receives its block of rows (reducescatterRows() in ipc_layout.h)
  // in `output`.
  StatusOr<uint64_t> reducescatterAsync(const char* name, const void* input, void* output, int ndim,
                                        const int64_t* shape, int dtype, int op);
  // Allgather: the ranks' tensors concatenated along the first dimension,
  // in rank order (the first dimension may differ per rank). Two phases:
  // the first dimensions are exchanged first (an allreduce named
  // "<name>.__sizes", waited for here), then the gather is submitted.
  // After wait() succeeds, result() gives the library-owned output.
  StatusOr<uint64_t> allgatherAsync(const char* name, const void* input, int ndim, const int64_t* shape,
                                    int dtype);
  // Alltoall: rank r sends splits[d] rows (first dimension) of `input`, in
  // order, to each rank d (splits NULL: shape[0] / size each) and receives
  // the rows sent to it, from rank 0 first, as a result() like allgather's.
  // The split matrix is exchanged first ("<name>.__splits", waited for here).
  StatusOr<uint64_t> alltoallAsync(const char* name, const void* input, int ndim, const int64_t* shape, int dtype,
                                   const int64_t* splits);
  struct GatherResult {
    std::vector<char> data;
    int64_t dim0 = 0;
    // A device allgather / alltoall: the result stays in the device arena
    // (this address, ready on `stream`) until release(); data is empty.
    void* device = nullptr;
    DeviceClient::Staged staged;
    void* stream = nullptr;
    const void* bytes() const { return device != nullptr ? device : data.data(); }
  };
  // The output of a completed allgather, valid until release(handle).
  StatusOr<const GatherResult*> result(uint64_t handle) const;
  // Drains completions without blocking: kInProgress or the final status.
  Status poll(uint64_t handle);
  // Waits up to `timeout` (negative: the op timeout). Forgets the handle
  // unless the wait timed out (TIMED_OUT leaves it pending).
  Status wait(uint64_t handle, std::chrono::milliseconds timeout, int64_t* aux = nullptr);
  // Forgets a handle; the op still runs but its result is no longer copied
  // to the output buffer. Returns once no copy into that buffer is running.
  void release(uint64_t handle);

  // Zero-copy buffers inside the arena's data region.
  StatusOr<void*> allocShared(size_t bytes);
  Status freeShared(void* ptr);

  // Starts (path non-empty) or stops the agent's timeline and waits (10 s at
  // most) for the agent's answer: an error when it refused (e.g. a path
  // outside its --timeline-dir: the message names that folder).
  Status timelineControl(bool start, const std::string& path, bool mark_cycles);

  // Sends Goodbye, fails pending handles with ABORTED and refuses new work.
  // Idempotent. Memory and descriptors are released by the destructor.
  void shutdown();

  // Introspection for tests and diagnostics.
  size_t pendingOps() const;
  uint64_t arenaUsedBytes() const { return alloc_ ? alloc_->usedBytes() : 0; }
  uint64_t dataCapacity() const { return alloc_ ? alloc_->capacity() : 0; }
  // Device path: whether this process holds a device arena, and why not.
  bool deviceReady() const { return device_ && device_->ready(); }
  std::string deviceWhy() const { return device_ ? device_->why() : std::string(); }
  // The CUDA device of this process's device arena (-1: none).
  int deviceOrdinal() const { return deviceReady() ? device_->device() : -1; }
  // kolo_device_alloc / kolo_device_free (client_device_resident.cc).
  StatusOr<void*> deviceAlloc(size_t bytes);
  // The space is reused once `stream` has passed the free.
  Status deviceFree(void* ptr, void* stream);
  // Device copies libkolo enqueued so far (tests: zero copy copies nothing).
  uint64_t deviceCopies() const { return device_ ? device_->copiesEnqueued() : 0; }
  // Tests only: submits a descriptor flagged as a device tensor of `bytes`
  // uint8 at device offset 0, event 0, without any copy (the agent's checks
  // of device descriptors, on machines without a GPU).
  StatusOr<uint64_t> submitDeviceDescForTest(const char* name, uint64_t bytes);

 private:
  // kSplitting: a split op whose share is reduced, copying the others'
  // shares out as their owners finish them (client_split.cc).
  enum class OpState { kSubmitted, kCompleting, kSplitting, kDone };
  // Split reduction (ipc_layout.h kSubmitFlagSplit): the arenas of every
  // local rank of the job, mapped read-only from a PeerArenas frame.
  struct PeerArenas {
    uint64_t epoch = 0;
    std::vector<SharedRegion> arenas;  // by local rank
  };
  // A split op: what its share of the reduction needs at kSplitGo.
  struct SplitOp {
    std::shared_ptr<const PeerArenas> peers;
    const char* input = nullptr;  // the caller's tensor (its own share is read there)
    SplitHeader* header = nullptr;
    char* slot_data = nullptr;  // this rank's slot (its input, then its share's result)
    uint64_t header_bytes = 0;
    uint64_t count = 0;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    double prescale = 1.0;
    double postscale = 1.0;
    int index = 0;  // this rank's share
    int parts = 0;
    bool filled = false;  // released before kSplitGo: its own share was copied into the slot
    // From kSplitGo on: every rank's slot and header, the shares still to
    // copy out, and when waiting for them ends (KOLO_OP_TIMEOUT).
    std::vector<const char*> slots;
    std::vector<const SplitHeader*> headers;
    std::vector<int> pending;
    Clock::time_point deadline{};
    uint64_t seq = 0;  // SplitHeader::seq of this op
  };
  // A slot whose op ended but that the other ranks may still read: freed
  // once every other rank's `done` is set (or the job failed).
  struct SplitHold {
    uint64_t slot = 0;
    uint64_t seq = 0;
    std::vector<const SplitHeader*> others;
    std::shared_ptr<const PeerArenas> peers;  // keeps those headers mapped
  };
  struct Op {
    std::string name;
    CollectiveType collective = CollectiveType::kAllreduce;  // for errors
    void* output = nullptr;
    const char* result = nullptr;  // where the agent leaves the result (in the arena)
    const char* shared_input = nullptr;  // zero copy out of place: the input, in the arena too
    uint64_t bytes = 0;
    std::optional<uint64_t> slot;  // our staging slot, freed at completion
    bool gather = false;           // allgather: copy the result into results_
    int64_t gather_dim0 = 0;
    OpState state = OpState::kSubmitted;
    bool released = false;
    Status status;
    int64_t aux = 0;               // from the completion (join: the last rank to join)
    int decompress = -1;           // compressed allreduce: the wire DataType to convert to float32
    bool device = false;           // device path: the result is copied out on `stream`
    DeviceClient::Staged staged;
    uint64_t device_result_at = 0;  // device path: the result's offset in the staged slot
    void* stream = nullptr;
    uint64_t desc_bytes = 0;  // counted in bytes_in_flight_ while in flight
    // Streamed copy-in: the submitting thread still copies into the slot
    // (published already), so the slot outlives the op's end until it is done.
    bool copying = false;
    // Streamed copy-out (ipc_layout.h kStreamedFinalOffset): the agent's
    // count of the result's bytes final in the slot, and how many of them
    // are in `output` already; `out_copying` while the drainer copies more
    // (mu_ released: the op is not erased, nor released, meanwhile).
    std::atomic<uint64_t>* final_bytes = nullptr;
    uint64_t copied_out = 0;
    bool out_copying = false;
    // A host allreduce's descriptor, for a kSplitRetry (resubmitted whole).
    std::optional<SubmitDesc> desc;
    std::optional<SplitOp> split;
  };

  explicit Client(ClientOptions opts);
  Status connectSocket();
  Status handshake();
  void prepareDirectProbe(ipc::Hello* hello);
  Status waitForWorld(Clock::time_point deadline);
  Status attachArena(UniqueFd arena, UniqueFd doorbell, UniqueFd completion);
  // Receives one AgentFrame during the handshake (before any ops exist).
  Status recvAgentFrame(Clock::time_point deadline, ipc::AgentFrame* frame);

  // Runs progress until `done` (checked under mu_) holds or the deadline
  // passes; returns done(). `max_block` caps each blocking poll.
  bool progressUntil(const std::function<bool()>& done, Clock::time_point deadline,
                     std::chrono::milliseconds max_block);
  // Drainer-only (draining_ set by the caller): one non-blocking pass over
  // the completion ring and the socket; true if anything happened.
  bool drainOnce();
  void blockForEvents(Clock::time_point deadline, std::chrono::milliseconds max_block);
  void handleCompletion(const CompletionDesc& c);
  // Split reduction (client_split.cc). kSplitGo (drainer, mu_ not held, the
  // op kCompleting): this rank's share reduced into its output and slot;
  // then (mu_ held) the op is kSplitting. kSplitRetry (mu_ held): the op
  // resubmitted whole.
  Status reduceShare(Op& op);
  void retrySplitLocked(uint64_t handle, Op& op);
  // mu_ held (drainer): copies out the other ranks' shares that are ready
  // (mu_ released around each copy); finishes the op once all are, or when
  // its deadline passed. True if it finished.
  bool advanceSplitLocked(std::unique_lock<std::mutex>& lk, uint64_t handle);
  // One pass over every kSplitting op (drainer); true if any finished.
  bool advanceSplits();
  // Whether a kSplitting op has another share ready to copy out.
  bool splitShareReady() const;
  // Copies this rank's own share of a split op's input into its slot (once).
  static void fillOwnShare(SplitOp& s);
  // Frees the held slots no other rank reads any more (all: `all`).
  void reapSplitHoldsLocked(bool all);
  // The cache policy of a split op's copies (arenaCopy's `node_bytes`):
  // another rank's core reads each copied share at once, and the result
  // share is read by the caller next, so these copies may take twice the
  // budget of the agent's (non-temporal only past half the L3, not a
  // quarter: at N=2 8 MiB and N=4 4 MiB cached copies measured 1.2-1.9x
  // faster on the AMD VM, at 16 MiB non-temporal ones still won).
  static uint64_t splitCopyNodeBytes(uint64_t node_bytes) { return node_bytes / 2; }
  // Whether a host allreduce of this plan may be split, and its share.
  bool splittable(const OpArgs& a, const SlotPlan& plan, bool slot_taken) const;
  void attachPeers(const ipc::AgentFrame& f);
  void handleAgentFrame(const std::string& payload);
  void readSocket();
  // Fails every pending op and all later submissions (mu_ held; drainer or
  // shutdown only, so no op is kCompleting).
  void failAllLocked(const Status& status);
  void finishOpLocked(std::unordered_map<uint64_t, Op>::iterator it, Status status);
  Status usableLocked() const;
  uint64_t maxInFlight() const;
  // Whether one more op of `desc_bytes` may be published now (mu_ held):
  // a free ring slot and room in the agent's bytes quota. A lone op larger
  // than the quota goes anyway, for the agent to refuse with its reason.
  bool roomToPublishLocked(uint64_t desc_bytes) const;
  void ringDoorbell();

  // The submit path (client_submit.cc), in the order submit() runs it.
  Status validate(const OpArgs& a, uint64_t* bytes) const;
  // Claims `name` for this op (refused while another op of that name is in
  // flight) / gives it back when the submission fails.
  Status reserveName(CollectiveType collective, const std::string& name);
  void releaseName(const std::string& name);
  // Streamed copy-in (ipc_layout.h kSubmitFlagStreamed): the copy that
  // prepareHost left for after publish, and where its count of bytes
  // copied lies.
  struct StreamedCopy {
    char* dst = nullptr;
    const char* src = nullptr;
    uint64_t bytes = 0;  // 0: nothing left to copy
    std::atomic<uint64_t>* copied = nullptr;
    uint64_t node_bytes = 0;
  };
  // Host memory: plans the slot, allocates it, copies in (or, streamed,
  // leaves the copy in `streamed` for after publish); fills the descriptor
  // and the op. `what` names the op in errors.
  Status prepareHost(const OpArgs& a, uint64_t bytes, const std::string& what,
                     Clock::time_point deadline, SubmitDesc* d, Op* op, StreamedCopy* streamed);
  // prepareHost's first step, under mu_: the slot plan (direct or the
  // arena; KOLO_DIRECT=auto takes an arena slot, or a split one, at once
  // while there is room) and what the later steps read of the world.
  struct HostPlacement {
    StatusOr<SlotPlan> planned = internalError("not planned");
    std::optional<uint64_t> slot_taken;
    uint64_t node_bytes = 0;  // in flight on this node with this copy (arenaCopy)
    int cross_size = 1;
    bool split = false;  // split reduction (client_split.cc)
    std::shared_ptr<const PeerArenas> peers;
    WorldView world;
  };
  HostPlacement placeHostLocked(const OpArgs& a, const SlotRequest& r, uint64_t bytes);
  // Split reduction: the cleared header, and every share but this rank's
  // own copied into the slot.
  SplitOp startSplit(const OpArgs& a, const SlotPlan& plan, const HostPlacement& h, uint64_t slot,
                     uint64_t header);
  // After publish: copies a streamed input in order, 1 MiB at a time,
  // counting the bytes for the agent; then frees the slot if the op already
  // ended meanwhile (it failed: finishOpLocked leaves a copying op's slot).
  void copyStreamed(uint64_t handle, const StreamedCopy& s);
  // Streamed copy-out (drainer): copies into each op's output the bytes the
  // agent published as final since the last look; true if it copied any.
  bool advanceStreamOuts();
  // `node_bytes`: in flight on this node with the copy (arenaCopy).
  void copyIn(const OpArgs& a, const SlotPlan& plan, uint64_t slot, uint64_t node_bytes);
  // What this node's ranks have in flight, with `more` bytes of this one:
  // this process's collectives times the node's ranks (they share the L3).
  uint64_t nodeBytesInFlightLocked(uint64_t more) const;
  StatusOr<uint64_t> allocateSlot(uint64_t bytes, const std::string& what,
                                  Clock::time_point deadline);
  // Device memory (client_device.cc): whether the op goes there, whether
  // this rank can take it, and the staging copy into the device arena.
  bool wantsDevice(const OpArgs& a) const;
  Status deviceAdmits(const OpArgs& a, const std::string& what) const;
  // All device event pairs in flight: asks the agent for more
  // (client_device_events.cc); false when none could be had.
  bool growDeviceEvents();
  // A grouped allreduce of device tensors on one stream copies in with one
  // batched copy (DeviceClient::beginBatch); false when it does not apply.
  bool beginDeviceGroup(const std::vector<OpArgs>& members);
  void endDeviceGroup(size_t members);
  Status prepareDevice(const OpArgs& a, uint64_t bytes, const std::string& what,
                       Clock::time_point deadline, SubmitDesc* d, Op* op);
  // Zero copy (client_device_resident.cc): the op's tensor is the
  // kolo_device_alloc buffer at device-arena offset `at`.
  Status prepareResident(const OpArgs& a, uint64_t bytes, uint64_t at, const std::string& what,
                         Clock::time_point deadline, SubmitDesc* d, Op* op);
  // Runs `stage` until it gets its slot / event pair, draining completions
  // while ops in flight hold them (bounded by `deadline`).
  StatusOr<DeviceClient::Staged> stageDraining(
      const std::function<StatusOr<DeviceClient::Staged>()>& stage, Clock::time_point deadline);
  static void* deviceStream(const OpArgs& a);
  // Publishes a prepared op and its descriptor (ring + table), waiting for
  // in-flight room until `deadline`. On success `op` is moved into the
  // table; on failure it is left for abandon(), which frees what it holds.
  Status publish(SubmitDesc d, Op& op, Clock::time_point deadline, const std::string& what);
  void abandon(Op& op);
  // Submits `members` (all the same collective) as one group; `what` names
  // the call in errors.
  StatusOr<std::vector<uint64_t>> groupedAsync(std::vector<OpArgs> members, const char* what);
  static uint64_t freshHandle();

  ClientOptions opts_;
  UniqueFd sock_;
  UniqueFd doorbell_;
  UniqueFd completion_efd_;
  UniqueFd wake_efd_;   // written by shutdown() to interrupt a blocked drainer
  SharedRegion arena_;
  ArenaHeader* header_ = nullptr;
  SubmitRing submit_ring_;
  CompletionRing completion_ring_;
  char* data_begin_ = nullptr;
  char* data_end_ = nullptr;
  std::unique_ptr<ArenaAllocator> alloc_;
  FrameDecoder decoder_;           // drainer-only after connect()
  std::deque<UniqueFd> stray_fds_; // drainer-only
  Clock::time_point start_deadline_;  // connect(): KOLO_START_TIMEOUT from the first try
  int retry_after_ms_ = 0;         // handshake(): the agent's refusal was momentary
  // Direct user memory (docs/architecture.md): the bytes the agent reads
  // from this process at admission, and the size from which an allreduce
  // takes the direct path (0: off, or the agent may not).
  char direct_probe_[16] = {};
  uint64_t direct_min_bytes_ = 0;
  uint64_t direct_alone_min_bytes_ = 0;  // across agents, this rank alone on its agent
  uint64_t streamed_min_bytes_ = 0;      // Welcome.streamed_min_bytes (0: never)
  uint64_t split_min_bytes_ = 0;         // Welcome.split_min_bytes (0: never)
  std::shared_ptr<const PeerArenas> peers_;  // the last PeerArenas frame (mu_)
  std::vector<SplitHold> split_holds_;       // (mu_)
  std::vector<uint64_t> split_ops_;          // the handles of the ops in kSplitting (mu_)
  std::atomic<size_t> splitting_{0};         // split_ops_.size(), read without mu_
  int split_sleep_us_ = 0;  // drainer-only: the next sleep waiting for shares (0: spin first)
  std::vector<uint64_t> stream_out_ops_;  // in flight with Op::final_bytes (mu_)
  std::atomic<size_t> streaming_out_{0};  // stream_out_ops_.size(), read without mu_
  int stream_out_sleep_us_ = 0;           // drainer-only: the next sleep waiting for final bytes
  std::set<std::string, std::less<>>
      unsplit_names_;  // came back kSplitRetry: never split again (mu_)
  std::string direct_error_;
  uint64_t frames_seen_ = 0;       // drainer-only: ArenaHeader::frames_sent at the last socket read
  bool sock_readable_ = false;     // drainer-only: poll() reported the socket
  bool sock_eof_ = false;          // drainer-only (and shutdown once no drainer runs)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool draining_ = false;
  bool shutdown_ = false;
  Status failed_;                  // sticky: job failed / connection lost / shut down
  WorldView world_;
  std::unordered_map<uint64_t, Op> ops_;
  std::set<std::string, std::less<>> names_in_flight_;
  std::map<uint64_t, uint64_t> shared_;  // zero-copy buffers: offset -> bytes
  uint64_t space_epoch_ = 0;       // bumped whenever arena space is freed
  uint64_t unpublished_slots_ = 0; // slots allocated by a submission not yet in ops_
  uint64_t in_flight_ = 0;         // ops pushed and not finished (released ones too)
  // Their bytes as the agent's quota counts them (submitDescBytes), and the
  // quota (Welcome.max_bytes_in_flight; 0: not known, no limit kept here).
  uint64_t bytes_in_flight_ = 0;
  uint64_t max_bytes_in_flight_ = 0;
  std::atomic<uint64_t> barriers_{0};  // barrier() calls so far
  std::atomic<uint64_t> groups_{0};    // groupedAllreduceAsync() calls so far
  // Elastic: the generation that replaced the one this process last used;
  // its next submission fails once with MEMBERSHIP_CHANGED (docs/elastic.md).
  uint64_t generation_notice_ = 0;
  std::string stall_notice_;       // the agent's last stall report for this job (Notice)
  uint64_t timeline_replies_ = 0;  // the agent's answers to timelineControl so far
  // The agent's answers to DeviceEvents frames (growDeviceEvents, one at a time).
  std::mutex grow_mu_;
  uint64_t device_event_replies_ = 0;
  StatusOr<std::string> device_events_reply_{std::string()};
  Status timeline_reply_;                               // the last of them
  std::unordered_map<uint64_t, GatherResult> results_;  // allgather outputs until release()
  pid_t owner_pid_ = -1;
  std::unique_ptr<DeviceClient> device_;  // set in connect(); never null after
};

}  // namespace kolo
