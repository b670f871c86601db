#include "client.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "client_text.h"
#include "common/half.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/stream_copy.h"
#include "common/unix_socket.h"
#include "current_pid.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kWaiterRecheck{20};   // a non-draining waiter re-checks this often
constexpr milliseconds kDrainerBlockMax{1000};
constexpr milliseconds kShutdownDrainerWait{10'000};
// How long a drainer polls for the other ranks' shares of a split op
// before it sleeps between looks (client_split.cc).
constexpr std::chrono::microseconds kSplitSpin{2000};

std::shared_ptr<spdlog::logger> logger() {
  static auto l = log::get("client");
  return l;
}

// Handles are unique across Client instances of the process, so a handle
// from before a re-init is never mistaken for a new one.
uint64_t nextHandle() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

using client_text::fmtSeconds;
using client_text::quoteName;
using client_text::wireStatus;

}  // namespace

Client::Client(ClientOptions opts) : opts_(std::move(opts)) {}

Client::~Client() { shutdown(); }

// ---------------------------------------------------------------------------
// Submission: client_submit.cc (the submit path), client_collectives.cc (the
// public entries), client_device.cc (device memory).

uint64_t Client::freshHandle() { return nextHandle(); }

Status Client::usableLocked() const {
  if (currentPid() != owner_pid_) {
    return invalidArgument("kolo was initialized by process " + std::to_string(owner_pid_) +
                           "; a forked child cannot use its connection (call kolo_init() in "
                           "the child to connect on its own)");
  }
  if (!failed_.isOk()) return failed_;
  if (shutdown_) return aborted("kolo was shut down (kolo_shutdown)");
  return okStatus();
}

StatusOr<const Client::GatherResult*> Client::result(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = results_.find(handle);
  if (it != results_.end()) return &it->second;
  auto op = ops_.find(handle);
  if (op != ops_.end() && op->second.state != OpState::kDone) {
    return invalidArgument("kolo_result: handle " + std::to_string(handle) +
                           " has not completed; call kolo_synchronize first");
  }
  return invalidArgument("kolo_result: handle " + std::to_string(handle) +
                         " has no result (not an allgather, failed, or released)");
}

void Client::ringDoorbell() {
  // After the push: an agent that is awake polls the ring before it sleeps,
  // and clears agent_polling (then fences and looks again) before it does.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header_->agent_polling.load(std::memory_order_relaxed) != 0) return;
  uint64_t one = 1;
  while (::write(doorbell_.get(), &one, sizeof one) < 0 && errno == EINTR) {
  }
}

// ---------------------------------------------------------------------------
// Progress

bool Client::progressUntil(const std::function<bool()>& done, Clock::time_point deadline,
                           milliseconds max_block) {
  std::unique_lock<std::mutex> lk(mu_);
  bool first = true;
  for (;;) {
    if (done()) return true;
    if (shutdown_) return false;
    auto now = Clock::now();
    bool expired = now >= deadline;
    if (expired && !first) return false;
    first = false;
    if (!draining_) {
      draining_ = true;
      lk.unlock();
      bool progressed = drainOnce();
      if (!progressed && !expired) {
        blockForEvents(deadline, max_block);
        drainOnce();
      }
      lk.lock();
      draining_ = false;
      cv_.notify_all();
    } else {
      if (expired) return done();
      cv_.wait_until(lk, std::min(deadline, now + kWaiterRecheck));
    }
  }
}

bool Client::drainOnce() {
  bool any = false;
  CompletionDesc c;
  while (completion_ring_.tryPop(&c)) {
    handleCompletion(c);
    any = true;
  }
  if (splitting_.load(std::memory_order_relaxed) > 0 && advanceSplits()) any = true;
  if (streaming_out_.load(std::memory_order_relaxed) > 0 && advanceStreamOuts()) {
    any = true;
    stream_out_sleep_us_ = 0;
  }
  if (!sock_eof_) {
    // Read the socket only when the agent wrote a frame since the last read
    // or poll() said so (the agent's exit: EOF): a recvmsg per completion
    // that finds nothing costs a small collective's latency.
    Status s;
    const uint64_t sent = header_ ? header_->frames_sent.load(std::memory_order_acquire) : 0;
    if (header_ == nullptr || sent != frames_seen_ || sock_readable_) {
      frames_seen_ = sent;
      sock_readable_ = false;
      s = readAvailable(sock_.get(), &decoder_, &stray_fds_);
    }
    std::string payload;
    while (decoder_.next(&payload)) {
      handleAgentFrame(payload);  // (a PeerArenas frame takes its descriptors)
      any = true;
    }
    // Only a frame not yet whole can own what is left (a PeerArenas frame's
    // descriptors come with its first bytes); anything beyond that is stray.
    while (stray_fds_.size() > 256) stray_fds_.pop_front();
    if (!s.isOk()) {
      sock_eof_ = true;
      std::lock_guard<std::mutex> lock(mu_);
      if (s.code() == Code::kUnavailable) {
        failAllLocked(unavailable("lost the connection to the kolo agent at " + opts_.socket_path +
                                  " (the agent exited or dropped this process)"));
      } else {
        failAllLocked(internalError("the connection to the kolo agent at " + opts_.socket_path +
                                    " broke: " + s.message()));
      }
      any = true;
    }
  }
  return any;
}

void Client::blockForEvents(Clock::time_point deadline, milliseconds max_block) {
  Clock::duration wait = std::min<Clock::duration>(deadline - Clock::now(), max_block);
  if (splitting_.load(std::memory_order_relaxed) > 0) {
    // A split op waits for the other ranks' shares, which ring no eventfd
    // here; they finish about when this rank's did: poll for a while
    // (yielding the core), then sleep between looks (woken at once by a
    // completion or a frame), 20 us at first and twice as long each time
    // nothing came, up to 1 ms (a rank still computing costs its peers no
    // core).
    if (split_sleep_us_ == 0) {
      auto spin_end = std::min<Clock::time_point>(Clock::now() + kSplitSpin, deadline);
      do {
        if (!completion_ring_.empty() || splitShareReady()) return;
        if (header_->frames_sent.load(std::memory_order_relaxed) != frames_seen_) return;
        ::sched_yield();
      } while (Clock::now() < spin_end);
      split_sleep_us_ = 20;
    }
    wait = std::min<Clock::duration>(wait, std::chrono::microseconds(split_sleep_us_));
    split_sleep_us_ = std::min(split_sleep_us_ * 2, 1000);
  } else if (streaming_out_.load(std::memory_order_relaxed) > 0) {
    // Streamed copy-out: the agent publishes a large allreduce's result
    // chunk by chunk (milliseconds apart) and rings nothing for it: look
    // again after 50 us, twice as long each time nothing came, up to 500
    // us (the op's completion still wakes us at once).
    stream_out_sleep_us_ = stream_out_sleep_us_ == 0 ? 50 : std::min(stream_out_sleep_us_ * 2, 500);
    wait = std::min<Clock::duration>(wait, std::chrono::microseconds(stream_out_sleep_us_));
  } else if (opts_.spin.count() > 0) {
    // A small collective completes in tens of microseconds: poll the ring
    // for that long first, so the common case needs no sleep and no wake-up.
    auto spin_end = std::min<Clock::time_point>(Clock::now() + opts_.spin, deadline);
    for (int i = 0; !sock_eof_; ++i) {
      if (!completion_ring_.empty()) return;
      if (header_->frames_sent.load(std::memory_order_relaxed) != frames_seen_) return;
      if (Clock::now() >= spin_end) break;
      ::sched_yield();  // on oversubscribed cores, let the agent run
    }
  }
  // Tell the agent we are about to sleep, then look at the ring once more:
  // a completion pushed before it saw the flag is caught here, one pushed
  // after it rings the eventfd.
  header_->client_waiting.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!completion_ring_.empty()) {
    header_->client_waiting.store(0, std::memory_order_relaxed);
    return;
  }
  const auto ns =
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count());
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  pollfd fds[3] = {{completion_efd_.get(), POLLIN, 0},
                   {sock_eof_ ? -1 : sock_.get(), POLLIN, 0},
                   {wake_efd_.get(), POLLIN, 0}};
  int r = ::ppoll(fds, 3, &ts, nullptr);
  header_->client_waiting.store(0, std::memory_order_relaxed);
  if (r > 0 && fds[1].revents != 0) sock_readable_ = true;
  if (r > 0 && (fds[0].revents & POLLIN)) {
    uint64_t v;
    (void)!::read(completion_efd_.get(), &v, sizeof v);  // reset; the ring is the truth
  }
}

void Client::handleCompletion(const CompletionDesc& c) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = ops_.find(c.handle);
  if (it == ops_.end() || it->second.state != OpState::kSubmitted) {
    // Expected after a failure (the op was failed already), a bug otherwise.
    logger()->log(failed_.isOk() ? spdlog::level::warn : spdlog::level::debug,
                  "completion for unknown handle {} ignored", c.handle);
    return;
  }
  Op& op = it->second;
  op.aux = c.aux;
  Status st;
  if (c.code != 0) {
    size_t len = std::min<size_t>(c.msg_len, kMaxErrorBytes);
    st = wireStatus(c.code, std::string(c.msg, strnlen(c.msg, len)), Code::kInternal);
  }
  // (aux is op-specific: join's last rank; a host allreduce's split answer)
  if (st.isOk() && c.aux == kSplitRetry && op.collective == CollectiveType::kAllreduce &&
      !op.device) {
    if (op.desc) {
      retrySplitLocked(c.handle, op);  // (still in flight: no finish)
      return;
    }
    st = internalError("the kolo agent asked to resubmit " +
                       describeTensor(op.collective, op.name) + " a second time (split reduction)");
  }
  if (st.isOk() && op.split) {
    op.aux = 0;
    if (c.aux != kSplitGo) {
      st =
          internalError("the kolo agent completed split " + describeTensor(op.collective, op.name) +
                        " without kSplitGo (aux " + std::to_string(c.aux) + ")");
    } else {
      op.state = OpState::kCompleting;
      lk.unlock();
      st = reduceShare(op);  // (a kCompleting op stays in the table, in place)
      lk.lock();
      it = ops_.find(c.handle);
      if (st.isOk()) {
        it->second.state = OpState::kSplitting;
        split_ops_.push_back(c.handle);
        splitting_.store(split_ops_.size(), std::memory_order_relaxed);
        split_sleep_us_ = 0;               // (drainer) the others' shares come about now: spin
        advanceSplitLocked(lk, c.handle);  // (finishes it once every share is out)
        return;
      }
    }
  } else if (op.device) {
    // Enqueued on the caller's stream behind the agent's out_ready (no host wait).
    // A device allgather / alltoall keeps its result in the device arena
    // (library-owned, as the host path's) until release().
    const bool keep = st.isOk() && !op.released && op.gather;
    Status ds = device_->finish(op.staged, op.output, op.device_result_at, op.bytes, op.stream,
                                st.isOk() && !op.released && !op.gather, keep);
    if (st.isOk()) st = ds;
    if (keep && ds.isOk()) {
      GatherResult res;
      res.dim0 = op.gather_dim0;
      res.device = device_->address(op.staged, op.device_result_at);
      res.staged = op.staged;
      res.stream = op.stream;
      results_[c.handle] = std::move(res);
    } else if (keep) {
      device_->retire(op.staged, op.stream);
    }
  } else if (st.isOk() && !op.released && op.gather) {
    // Copy the gathered tensor out of the arena (the slot is freed below).
    op.state = OpState::kCompleting;
    GatherResult res;
    res.dim0 = op.gather_dim0;
    const char* src = op.result;
    uint64_t bytes = op.bytes;
    lk.unlock();
    res.data.assign(src, src + bytes);
    lk.lock();
    results_[c.handle] = std::move(res);
    it = ops_.find(c.handle);
  } else if (st.isOk() && !op.released && op.bytes > 0 && op.decompress >= 0) {
    // Compressed allreduce: float16/bfloat16 in the arena -> float32 output.
    op.state = OpState::kCompleting;
    auto* out = static_cast<float*>(op.output);
    const auto* src = reinterpret_cast<const uint16_t*>(op.result);
    const size_t count = op.bytes / sizeof(uint16_t);
    const bool half = op.decompress == static_cast<int>(DataType::kFloat16);
    lk.unlock();
    if (half) {
      for (size_t i = 0; i < count; ++i) out[i] = halfToFloat(src[i]);
    } else {
      for (size_t i = 0; i < count; ++i) out[i] = bf16ToFloat(src[i]);
    }
    lk.lock();
    it = ops_.find(c.handle);
  } else if (st.isOk() && !op.released && op.bytes > 0 && op.output != op.result) {
    // Copy out without holding mu_; release() waits for kCompleting to end.
    // (Streamed copy-out: the first `copied_out` bytes are there already.)
    op.state = OpState::kCompleting;
    const uint64_t from = std::min(op.copied_out, op.bytes);
    char* out = static_cast<char*>(op.output) + from;
    const char* src = op.result + from;
    uint64_t bytes = op.bytes - from;
    // In flight with this op: its bytes are still counted.
    const uint64_t node_bytes = nodeBytesInFlightLocked(0);
    lk.unlock();
    arenaCopy(out, src, bytes, node_bytes);
    lk.lock();
    it = ops_.find(c.handle);  // the table may have rehashed
  }
  finishOpLocked(it, std::move(st));
}

uint64_t Client::maxInFlight() const {
  return std::min(submit_ring_.capacity(), completion_ring_.capacity());
}

uint64_t Client::nodeBytesInFlightLocked(uint64_t more) const {
  return (bytes_in_flight_ + more) * static_cast<uint64_t>(std::max(1, world_.local_size));
}

bool Client::roomToPublishLocked(uint64_t desc_bytes) const {
  if (in_flight_ >= maxInFlight()) return false;
  return max_bytes_in_flight_ == 0 || bytes_in_flight_ == 0 ||
         (desc_bytes <= max_bytes_in_flight_ &&
          bytes_in_flight_ <= max_bytes_in_flight_ - desc_bytes);
}

void Client::finishOpLocked(std::unordered_map<uint64_t, Op>::iterator it, Status status) {
  Op& op = it->second;
  --in_flight_;
  bytes_in_flight_ -= op.desc_bytes;
  op.desc_bytes = 0;
  if (!op.copying) {  // (else copyStreamed frees it once its copy is done)
    if (op.slot && alloc_->free(*op.slot)) ++space_epoch_;
    op.slot.reset();
  }
  names_in_flight_.erase(op.name);
  op.state = OpState::kDone;
  op.status = std::move(status);
  if (op.released && !op.copying) ops_.erase(it);
  cv_.notify_all();
}

void Client::handleAgentFrame(const std::string& payload) {
  ipc::AgentFrame f;
  if (!f.ParseFromString(payload)) {
    logger()->warn("ignoring a frame from the agent that is not an AgentFrame");
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (f.has_peers()) {
    attachPeers(f);
  } else if (f.has_job_failed()) {
    Status st = wireStatus(f.job_failed().code(), f.job_failed().message(), Code::kAborted);
    logger()->debug("job failed: {}", st.toString());
    failAllLocked(st);
  } else if (f.has_notice() && f.notice().kind() == "timeline") {
    timeline_reply_ = okStatus();  // the answer to timelineControl
    ++timeline_replies_;
    cv_.notify_all();
  } else if (f.has_device_events_granted()) {
    device_events_reply_ = f.device_events_granted().handles();
    ++device_event_replies_;
    cv_.notify_all();
  } else if (f.has_refused() && f.refused().frame() == "DeviceEvents") {
    device_events_reply_ =
        wireStatus(f.refused().code(), f.refused().message(), Code::kUnavailable);
    ++device_event_replies_;
    cv_.notify_all();
  } else if (f.has_refused() && f.refused().frame() == "TimelineControl") {
    timeline_reply_ =
        wireStatus(f.refused().code(), f.refused().message(), Code::kPermissionDenied);
    ++timeline_replies_;
    cv_.notify_all();
  } else if (f.has_notice()) {
    // The agent's stall report (and anything else the user must see).
    logger()->warn("{}", f.notice().message());
    if (f.notice().kind() == "stall") stall_notice_ = f.notice().message();
  } else if (f.has_refused()) {
    // A frame the agent did not act on (a TimelineControl outside this job).
    logger()->warn("the kolo agent refused a {} frame: {}", f.refused().frame(),
                   f.refused().message());
  } else if (f.has_world()) {
    const ipc::WorldInfo& w = f.world();
    if (world_.generation != 0 && w.generation() != world_.generation) {
      // Elastic: a new generation starts the per-generation name counters
      // again, as on the ranks that join in it.
      barriers_ = 0;
      groups_ = 0;
      generation_notice_ = w.generation();
    }
    world_ = WorldView{w.generation(), w.rank(),       w.size(),      w.local_rank(),
                       w.local_size(), w.cross_rank(), w.cross_size()};
  }
}

void Client::failAllLocked(const Status& status) {
  if (failed_.isOk()) failed_ = status;
  reapSplitHoldsLocked(true);  // no rank reads them any more
  split_ops_.clear();          // (finished below)
  splitting_.store(0, std::memory_order_relaxed);
  for (auto it = ops_.begin(); it != ops_.end();) {
    auto cur = it++;  // finishOpLocked may erase a released op
    if (cur->second.state == OpState::kSubmitted || cur->second.state == OpState::kSplitting) {
      finishOpLocked(cur, failed_);
    }
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------
// Handles

Status Client::poll(uint64_t handle) {
  auto done = [&] {
    auto it = ops_.find(handle);
    return it == ops_.end() || it->second.state == OpState::kDone;
  };
  progressUntil(done, Clock::now(), milliseconds(0));  // one non-blocking pass
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(handle);
  if (it == ops_.end()) {
    return invalidArgument("unknown handle " + std::to_string(handle) +
                           ": it was already synchronized or released");
  }
  if (it->second.state != OpState::kDone || it->second.out_copying) {
    if (shutdown_) return usableLocked();
    return Status(Code::kInProgress, "in progress");
  }
  return it->second.status;
}

Status Client::wait(uint64_t handle, milliseconds timeout, int64_t* aux) {
  auto start = Clock::now();
  milliseconds limit = timeout.count() < 0 ? opts_.op_timeout : timeout;
  auto deadline = start + limit;
  auto done = [&] {
    auto it = ops_.find(handle);
    return it == ops_.end() || (it->second.state == OpState::kDone && !it->second.out_copying);
  };
  progressUntil(done, deadline, kDrainerBlockMax);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(handle);
  if (it == ops_.end()) {
    return invalidArgument("unknown handle " + std::to_string(handle) +
                           ": it was already synchronized or released");
  }
  if (it->second.state != OpState::kDone) {
    if (shutdown_) return usableLocked();
    std::string where =
        !stall_notice_.empty() ? "; the agent's last stall report:\n" + stall_notice_
        : opts_.embedded_agent
            ? " (kolorun's private agent reports the ranks it waits for on the ranks' stderr "
              "after its stall-check time; it stops with the job)"
            : " (wait again, or see `kolo job " + opts_.job_id + "` for the ranks it waits for)";
    return timedOut(describeTensor(it->second.collective, it->second.name) + " (handle " +
                    std::to_string(handle) + ") did not complete within " + fmtSeconds(limit) +
                    " s; it is still pending" + where);
  }
  Status st = std::move(it->second.status);
  if (aux != nullptr) *aux = it->second.aux;
  ops_.erase(it);
  return st;
}

void Client::release(uint64_t handle) {
  std::unique_lock<std::mutex> lk(mu_);
  if (auto r = results_.find(handle); r != results_.end()) {
    // A device result's slot is reused once its stream passed this point.
    if (r->second.device != nullptr) device_->retire(r->second.staged, r->second.stream);
    results_.erase(r);
  }
  for (;;) {
    auto it = ops_.find(handle);
    if (it == ops_.end()) return;
    if (it->second.state == OpState::kCompleting || it->second.out_copying) {
      cv_.wait(lk);  // a copy into its output is running; it is a memcpy, it ends
      continue;
    }
    if (it->second.state == OpState::kDone) {
      ops_.erase(it);
    } else {
      Op& op = it->second;
      // The caller may free its tensor now, but the other ranks still need
      // this rank's share of it: into the slot, read there at kSplitGo.
      if (op.split && op.state == OpState::kSubmitted) fillOwnShare(*op.split);
      op.released = true;
    }
    return;
  }
}

size_t Client::pendingOps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(std::count_if(ops_.begin(), ops_.end(), [](const auto& kv) {
    return kv.second.state != OpState::kDone;
  }));
}

// ---------------------------------------------------------------------------
// Zero-copy buffers

StatusOr<void*> Client::allocShared(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(usableLocked());
  auto off = alloc_->allocate(bytes);
  if (!off) {
    return invalidArgument("kolo_alloc_shared(" + std::to_string(bytes) +
                           "): the shared arena has no free block that large (" +
                           std::to_string(alloc_->capacity()) + " bytes of data, " +
                           std::to_string(alloc_->usedBytes()) + " in use, largest free block " +
                           std::to_string(alloc_->largestFreeBlock()) +
                           "). Free shared buffers or raise KOLO_ARENA_MB.");
  }
  shared_[*off] = std::max<uint64_t>(bytes, 1);
  return static_cast<void*>(arena_.data() + *off);
}

Status Client::freeShared(void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = p >= data_begin_ && p < data_end_
                ? shared_.find(static_cast<uint64_t>(p - arena_.data()))
                : shared_.end();
  if (it == shared_.end()) {
    return invalidArgument("kolo_free_shared: the pointer was not returned by kolo_alloc_shared "
                           "(or was freed already, or kolo was re-initialized since)");
  }
  const char* b = arena_.data() + it->first;
  const char* e = b + it->second;
  for (const auto& [h, op] : ops_) {
    auto inside = [&](const char* q) { return q != nullptr && q >= b && q < e; };
    if (op.state != OpState::kDone && !op.slot && (inside(op.result) || inside(op.shared_input))) {
      return invalidArgument("kolo_free_shared: the buffer is in use by the " +
                             describeTensor(op.collective, op.name) + ", still in flight");
    }
  }
  alloc_->free(it->first);
  shared_.erase(it);
  ++space_epoch_;
  cv_.notify_all();
  return okStatus();
}

// ---------------------------------------------------------------------------
// Shutdown

void Client::shutdown() {
  if (currentPid() != owner_pid_) {
    // A forked child: the socket, eventfds and rings are its parent's. Touch
    // none of them; just stop using this Client here.
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    return;
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    if (wake_efd_.valid()) {
      uint64_t one = 1;
      (void)!::write(wake_efd_.get(), &one, sizeof one);
    }
    // A drainer leaves at once: its poll includes wake_efd_ and it sees shutdown_.
    if (!cv_.wait_for(lk, kShutdownDrainerWait, [&] { return !draining_; })) {
      logger()->warn("shutdown: a thread is still draining completions after {} s",
                     fmtSeconds(kShutdownDrainerWait));
      return;  // the destructor cannot run while that thread is inside a call
    }
    failAllLocked(aborted("kolo_shutdown() was called while this collective was in flight"));
  }
  if (sock_.valid() && !sock_eof_) {
    ipc::ClientFrame bye;
    bye.mutable_goodbye();
    Status s = sendFrame(sock_.get(), bye);
    if (!s.isOk()) logger()->debug("goodbye not delivered: {}", s.toString());
  }
  sock_.reset();
}

Status Client::timelineControl(bool start, const std::string& path, bool mark_cycles) {
  const char* what = start ? "start_timeline" : "stop_timeline";
  uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    RETURN_IF_ERROR(usableLocked());
    if (start && path.empty()) return invalidArgument("start_timeline: the file name is empty");
    ipc::ClientFrame f;
    f.mutable_timeline()->set_start(start);
    f.mutable_timeline()->set_path(path);
    f.mutable_timeline()->set_mark_cycles(mark_cycles);
    f.mutable_timeline()->set_want_reply(true);
    RETURN_IF_ERROR(sendFrame(sock_.get(), f).withContext(what));
    before = timeline_replies_;
  }
  // The agent answers on its loop: the file it writes, or why not (a path
  // outside its --timeline-dir names the folder where it can write).
  constexpr auto kReplyTimeout = std::chrono::seconds(10);
  progressUntil([&] { return timeline_replies_ != before || !failed_.isOk(); },
                Clock::now() + kReplyTimeout, std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> lk(mu_);
  if (timeline_replies_ == before) {
    RETURN_IF_ERROR(usableLocked());
    return Status(Code::kTimedOut,
                  std::string(what) + ": the kolo agent did not answer within 10 s");
  }
  if (!timeline_reply_.isOk()) {
    return Status(timeline_reply_.code(), std::string(what) + ": " + timeline_reply_.message());
  }
  return okStatus();
}

}  // namespace kolo
