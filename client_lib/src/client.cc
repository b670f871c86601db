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

constexpr milliseconds kConnectRetry{100};
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

// A status code received from the agent. 0 and values outside the enum become
// `fallback` (the agent is another program: do not trust it blindly).
Status wireStatus(int32_t code, std::string message, Code fallback) {
  Code c = (code >= 2 && code <= 9) ? static_cast<Code>(code) : fallback;
  if (message.empty()) message = std::string("the kolo agent reported ") + codeName(c);
  return Status(c, std::move(message));
}

bool isPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

Client::Client(ClientOptions opts) : opts_(std::move(opts)) {}

Client::~Client() { shutdown(); }

StatusOr<std::unique_ptr<Client>> Client::connect(const ClientOptions& opts) {
  std::unique_ptr<Client> c(new Client(opts));
  c->owner_pid_ = currentPid();
  c->wake_efd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!c->wake_efd_.valid()) return errnoStatus("eventfd", errno);
  c->start_deadline_ = Clock::now() + opts.start_timeout;
  Status refused;  // the last momentary refusal, if any
  for (bool told = false;;) {
    Status s = c->connectSocket();
    if (s.isOk()) s = c->handshake();
    if (s.isOk()) return c;
    if (!refused.isOk() && s.code() == Code::kTimedOut) {
      // The start timeout ran out during a retry: the refusals are the news.
      return Status(refused.code(), refused.message() + " (refused until KOLO_START_TIMEOUT ran out)");
    }
    // A momentary refusal (the agent is out of descriptors or at its
    // connection limit) is retried until KOLO_START_TIMEOUT, as a user would.
    auto wait = std::chrono::milliseconds(c->retry_after_ms_);
    if (c->retry_after_ms_ <= 0 || Clock::now() + wait >= c->start_deadline_) return s;
    refused = s;
    if (!told) {
      logger()->warn("{}; connecting again until KOLO_START_TIMEOUT", s.message());
      told = true;
    }
    c->sock_.reset();
    c->decoder_ = FrameDecoder();
    c->stray_fds_.clear();
    c->retry_after_ms_ = 0;
    std::this_thread::sleep_for(wait);
  }
}

// ---------------------------------------------------------------------------
// Connection and handshake

Status Client::connectSocket() {
  const std::string& path = opts_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return invalidArgument("KOLO_AGENT_SOCKET is too long (" + std::to_string(path.size()) +
                           " bytes, limit " + std::to_string(sizeof(addr.sun_path) - 1) +
                           "): " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());

  auto start = Clock::now();
  auto deadline = start_deadline_;
  int err = 0;
  for (;;) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errnoStatus("socket", errno);
    // connect() blocks while the agent's listen backlog is full: bound it by
    // the start deadline (SO_SNDTIMEO applies to a Unix socket's connect).
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(std::max<int64_t>(left.count(), 1000) / 1000000);
    tv.tv_usec = static_cast<suseconds_t>(std::max<int64_t>(left.count(), 1000) % 1000000);
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      timeval none{};
      (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
      sock_ = std::move(fd);
      logger()->debug("connected to the agent at {}", path);
      return okStatus();
    }
    err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EINPROGRESS) {
      return unavailable("the kolo agent at " + path + " accepted no connection within " +
                         fmtSeconds(Clock::now() - start) +
                         " s (KOLO_START_TIMEOUT): its listen queue is full; the agent is "
                         "overloaded or has stopped accepting");
    }
    // Only "nothing there yet" is worth waiting for (kolorun may be starting
    // the agent right now); anything else will not change by retrying.
    if (err != ENOENT && err != ECONNREFUSED) break;
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(kConnectRetry, deadline - now));
  }
  Code code = (err == EACCES || err == EPERM) ? Code::kPermissionDenied : Code::kUnavailable;
  if (code == Code::kPermissionDenied) {
    return Status(
        code, "cannot open the kolo agent socket " + path + ": " + explainSocketError(path, err));
  }
  return Status(code, "cannot reach the kolo agent at " + path + " (" + std::strerror(err) + "; " +
                          explainSocketError(path, err) + ") after " +
                          fmtSeconds(Clock::now() - start) +
                          " s. Start one with `kolo-agent --socket " + path +
                          "`, run the program under `kolorun`, which starts one, or set "
                          "KOLO_AGENT_SOCKET.");
}

Status Client::recvAgentFrame(Clock::time_point deadline, ipc::AgentFrame* frame) {
  bool eof = false;
  for (;;) {
    std::string payload;
    if (decoder_.next(&payload)) {
      if (!frame->ParseFromString(payload)) {
        return internalError("the kolo agent at " + opts_.socket_path +
                             " sent a frame that is not an AgentFrame");
      }
      return okStatus();
    }
    if (eof) {
      return unavailable("the kolo agent at " + opts_.socket_path +
                         " closed the connection during the handshake");
    }
    auto now = Clock::now();
    if (now >= deadline) return timedOut("deadline");
    int ms = static_cast<int>(
                 std::chrono::duration_cast<milliseconds>(deadline - now).count()) + 1;
    pollfd p{sock_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) return errnoStatus("poll", errno);
    if (r <= 0) continue;
    Status s = readAvailable(sock_.get(), &decoder_, &stray_fds_);
    if (s.code() == Code::kUnavailable) {
      eof = true;  // deliver what arrived before the close first
    } else if (!s.isOk()) {
      return s.withContext("reading from the kolo agent at " + opts_.socket_path);
    }
  }
}

// The direct path's probe: 16 random bytes whose address goes in the
// Hello; the agent reads them from this process with process_vm_readv.
// Under Yama's ptrace_scope 1 (Ubuntu's default) only a declared process
// may read another's memory, so this process names the agent (its pid from
// the connection) first; without Yama the call is refused and harmless.
void Client::prepareDirectProbe(ipc::Hello* hello) {
  if (::getrandom(direct_probe_, sizeof direct_probe_, 0) != static_cast<ssize_t>(sizeof direct_probe_)) return;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
    std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
    int level = 0;
    if (scope >> level && level == 1) (void)::prctl(PR_SET_PTRACER, static_cast<unsigned long>(cred.pid), 0, 0, 0);
  }
  hello->set_direct_probe_addr(reinterpret_cast<uint64_t>(direct_probe_));
  hello->set_direct_probe(std::string(direct_probe_, sizeof direct_probe_));
}

Status Client::handshake() {
  auto deadline = start_deadline_;
  ipc::ClientFrame hello_frame;
  ipc::Hello* hello = hello_frame.mutable_hello();
  hello->set_protocol_version(kIpcProtocolVersion);
  hello->set_job_id(opts_.job_id);
  hello->set_token(opts_.token);
  hello->set_local_rank(opts_.local_rank);
  hello->set_local_size(opts_.local_size);
  hello->set_world_size(opts_.world_size);
  hello->set_min_size(opts_.min_np);
  hello->set_max_size(opts_.max_np);
  hello->set_elastic_timeout_ms(opts_.elastic_timeout.count());
  hello->set_pid(static_cast<int32_t>(currentPid()));
  hello->set_arena_bytes(opts_.arena_bytes);
  device_ = DeviceClient::create();
  device_->prepareHello(hello);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) hello->set_hostname(host);
  if (opts_.direct != ClientOptions::Direct::kOff) prepareDirectProbe(hello);
  // This job's tuning, as the trainer's environment sets it (Horovod's
  // variables included); the agent applies it to this job only.
  for (const std::string& name : jobSettingVariables()) {
    const char* v = std::getenv(name.c_str());
    if (v != nullptr && *v != '\0') (*hello->mutable_job_settings())[name] = v;
  }
  RETURN_IF_ERROR(sendFrame(sock_.get(), hello_frame)
                      .withContext("sending Hello to the kolo agent at " + opts_.socket_path));

  ipc::AgentFrame f;
  Status s = recvAgentFrame(deadline, &f);
  if (s.code() == Code::kTimedOut) {
    return timedOut("the kolo agent at " + opts_.socket_path + " did not answer within " +
                    fmtSeconds(opts_.start_timeout) + " s (KOLO_START_TIMEOUT)");
  }
  RETURN_IF_ERROR(s);
  if (f.has_job_failed()) {
    return wireStatus(f.job_failed().code(), f.job_failed().message(), Code::kAborted);
  }
  if (f.has_refused()) {  // over one of the agent's limits (docs/security.md)
    retry_after_ms_ = f.refused().retry_after_ms();
    return wireStatus(f.refused().code(),
                      "the kolo agent refused the connection: " + f.refused().message(),
                      Code::kUnavailable);
  }
  if (!f.has_welcome()) {
    return internalError("the kolo agent at " + opts_.socket_path +
                         " did not answer Hello with Welcome");
  }
  const ipc::Welcome& w = f.welcome();
  if (w.code() != 0) return wireStatus(w.code(), w.message(), Code::kInternal);
  if (stray_fds_.size() < 3) {
    return internalError("the kolo agent's Welcome came with " + std::to_string(stray_fds_.size()) +
                         " descriptors, expected 3 (arena, doorbell, completion)");
  }
  direct_min_bytes_ = opts_.direct != ClientOptions::Direct::kOff ? w.direct_min_bytes() : 0;
  direct_alone_min_bytes_ = direct_min_bytes_ > 0 ? w.direct_alone_min_bytes() : 0;
  streamed_min_bytes_ = w.streamed_min_bytes();
  split_min_bytes_ = w.split_min_bytes();
  direct_error_ = w.direct_error();
  max_bytes_in_flight_ = w.max_bytes_in_flight();
  if (opts_.direct != ClientOptions::Direct::kOff && direct_min_bytes_ == 0 &&
      !direct_error_.empty()) {
    logger()->debug("direct user-memory path off: {}", direct_error_);
  }
  UniqueFd arena = std::move(stray_fds_[0]);
  UniqueFd doorbell = std::move(stray_fds_[1]);
  UniqueFd completion = std::move(stray_fds_[2]);
  const bool device_fd = stray_fds_.size() > 3 && w.device_arena_bytes() > 0;
  device_->attach(w, device_fd ? std::move(stray_fds_[3]) : UniqueFd());
  // Only the Welcome's: a PeerArenas frame read in the same recvmsg (the
  // last rank to join gets Welcome, World and PeerArenas back to back)
  // owns the ones after them.
  stray_fds_.erase(stray_fds_.begin(), stray_fds_.begin() + (device_fd ? 4 : 3));
  RETURN_IF_ERROR(attachArena(std::move(arena), std::move(doorbell), std::move(completion)));
  logger()->debug("admitted by agent '{}': arena {} bytes, data region {} bytes", w.agent_id(),
                  arena_.size(), alloc_->capacity());
  RETURN_IF_ERROR(waitForWorld(deadline));
  // From here on the socket is only read by the drainer, without blocking,
  // and Goodbye must not block shutdown.
  return setNonBlocking(sock_.get());
}

Status Client::attachArena(UniqueFd arena, UniqueFd doorbell, UniqueFd completion) {
  auto region = SharedRegion::attach(std::move(arena), sizeof(ArenaHeader));
  if (!region.isOk()) return region.status().withContext("mapping the shared arena");
  arena_ = std::move(region).value();
  header_ = reinterpret_cast<ArenaHeader*>(arena_.data());
  const uint64_t total = arena_.size();
  auto bad = [&](const std::string& what) {
    return internalError("the shared arena from the kolo agent is malformed: " + what);
  };
  if (header_->magic != kArenaMagic) return bad("bad magic");
  if (header_->version != kIpcProtocolVersion) {
    return internalError("the kolo agent speaks IPC protocol version " +
                         std::to_string(header_->version) + ", this libkolo speaks " +
                         std::to_string(kIpcProtocolVersion) +
                         ": use a libkolo and a kolo-agent from the same release");
  }
  auto within = [&](uint64_t off, uint64_t len) { return off <= total && len <= total - off; };
  auto ringOk = [&](uint64_t off, size_t entry) {
    if (!within(off, sizeof(RingHeader)) || off % alignof(RingHeader) != 0) return false;
    uint64_t cap = reinterpret_cast<RingHeader*>(arena_.data() + off)->capacity;
    return isPowerOfTwo(cap) && cap <= total / entry && within(off + sizeof(RingHeader), cap * entry);
  };
  if (!ringOk(header_->submit_ring_offset, sizeof(SubmitDesc))) return bad("submission ring");
  if (!ringOk(header_->completion_ring_offset, sizeof(CompletionDesc))) {
    return bad("completion ring");
  }
  if (!within(header_->data_offset, header_->data_bytes) ||
      header_->data_offset % kDataAlignment != 0) {
    return bad("data region");
  }
  submit_ring_ = SubmitRing(arena_.data() + header_->submit_ring_offset);
  completion_ring_ = CompletionRing(arena_.data() + header_->completion_ring_offset);
  data_begin_ = arena_.data() + header_->data_offset;
  data_end_ = data_begin_ + header_->data_bytes;
  alloc_ = std::make_unique<ArenaAllocator>(header_->data_offset, header_->data_bytes);
  RETURN_IF_ERROR(setNonBlocking(doorbell.get()));
  RETURN_IF_ERROR(setNonBlocking(completion.get()));
  doorbell_ = std::move(doorbell);
  completion_efd_ = std::move(completion);
  return okStatus();
}

Status Client::waitForWorld(Clock::time_point deadline) {
  for (;;) {
    ipc::AgentFrame f;
    Status s = recvAgentFrame(deadline, &f);
    if (s.code() == Code::kTimedOut) {
      return timedOut("the job's " + std::to_string(opts_.world_size) +
                      " ranks did not all join within " + fmtSeconds(opts_.start_timeout) +
                      " s (KOLO_START_TIMEOUT): this process is local rank " +
                      std::to_string(opts_.local_rank) + " of job '" + opts_.job_id +
                      "'; check that every rank was started");
    }
    RETURN_IF_ERROR(s);
    if (f.has_job_failed()) {
      return wireStatus(f.job_failed().code(), f.job_failed().message(), Code::kAborted);
    }
    if (!f.has_world()) continue;
    const ipc::WorldInfo& w = f.world();
    if (w.size() < 1 || w.rank() < 0 || w.rank() >= w.size() || w.local_size() < 1 ||
        w.local_rank() < 0 || w.local_rank() >= w.local_size() || w.cross_size() < 1 ||
        w.cross_rank() < 0 || w.cross_rank() >= w.cross_size()) {
      return internalError("the kolo agent sent an inconsistent world (rank " +
                           std::to_string(w.rank()) + " of " + std::to_string(w.size()) + ")");
    }
    std::lock_guard<std::mutex> lock(mu_);
    world_ = WorldView{w.generation(), w.rank(),       w.size(),      w.local_rank(),
                       w.local_size(), w.cross_rank(), w.cross_size()};
    logger()->debug("job '{}' generation {}: rank {} of {}", opts_.job_id, w.generation(),
                    w.rank(), w.size());
    return okStatus();
  }
}

WorldView Client::world() const {
  std::lock_guard<std::mutex> lock(mu_);
  return world_;
}

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
