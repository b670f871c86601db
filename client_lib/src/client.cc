#include "client.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/half.h"
#include "common/log.h"
#include "common/stream_copy.h"
#include "common/unix_socket.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kConnectRetry{100};
constexpr milliseconds kWaiterRecheck{20};   // a non-draining waiter re-checks this often
constexpr milliseconds kDrainerBlockMax{1000};
constexpr milliseconds kShutdownDrainerWait{10'000};

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

std::string fmtSeconds(Client::Clock::duration d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f",
                std::chrono::duration_cast<std::chrono::duration<double>>(d).count());
  return b;
}

std::string fmtSeconds(milliseconds d) { return fmtSeconds(Client::Clock::duration(d)); }

// A status code received from the agent. 0 and values outside the enum become
// `fallback` (the agent is another program: do not trust it blindly).
Status wireStatus(int32_t code, std::string message, Code fallback) {
  Code c = (code >= 2 && code <= 9) ? static_cast<Code>(code) : fallback;
  if (message.empty()) message = std::string("the kolo agent reported ") + codeName(c);
  return Status(c, std::move(message));
}

std::string quoteName(std::string_view name) {
  constexpr size_t kShown = 64;
  std::string q = "'";
  q.append(name.substr(0, kShown));
  q.append(name.size() > kShown ? "...'" : "'");
  return q;
}

bool isPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The KOLO_ARENA_MB whose data region holds a tensor of `bytes`: the rings
// and the header come first.
uint64_t arenaMbFor(uint64_t bytes) {
  uint64_t overhead = ArenaLayout::compute(0).data_offset;
  return (bytes + overhead + (1u << 20) - 1) >> 20;
}

}  // namespace

Client::Client(ClientOptions opts) : opts_(std::move(opts)) {}

Client::~Client() { shutdown(); }

StatusOr<std::unique_ptr<Client>> Client::connect(const ClientOptions& opts) {
  std::unique_ptr<Client> c(new Client(opts));
  c->owner_pid_ = ::getpid();
  c->wake_efd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!c->wake_efd_.valid()) return errnoStatus("eventfd", errno);
  c->start_deadline_ = Clock::now() + opts.start_timeout;
  for (bool told = false;;) {
    RETURN_IF_ERROR(c->connectSocket());
    Status s = c->handshake();
    if (s.isOk()) return c;
    // A momentary refusal (the agent is out of descriptors or at its
    // connection limit) is retried until KOLO_START_TIMEOUT, as a user would.
    auto wait = std::chrono::milliseconds(c->retry_after_ms_);
    if (c->retry_after_ms_ <= 0 || Clock::now() + wait >= c->start_deadline_) return s;
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
  hello->set_pid(static_cast<int32_t>(::getpid()));
  hello->set_arena_bytes(opts_.arena_bytes);
  device_ = DeviceClient::create();
  device_->prepareHello(hello);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) hello->set_hostname(host);
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
  UniqueFd arena = std::move(stray_fds_[0]);
  UniqueFd doorbell = std::move(stray_fds_[1]);
  UniqueFd completion = std::move(stray_fds_[2]);
  device_->attach(w, stray_fds_.size() > 3 && w.device_arena_bytes() > 0 ? std::move(stray_fds_[3]) : UniqueFd());
  stray_fds_.clear();
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
// Submission

Status Client::validate(const AllreduceArgs& a, uint64_t* bytes) const {
  if (a.name == nullptr || a.name[0] == '\0') {
    return invalidArgument(std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
                           ": the tensor name is empty; every collective needs a name "
                           "that is the same on all ranks");
  }
  size_t name_len = std::strlen(a.name);
  std::string_view name(a.name, name_len);
  if (name_len > kMaxNameBytes) {
    return invalidArgument(std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
                           ": tensor name " + quoteName(name) + " is " +
                           std::to_string(name_len) + " bytes; the limit is " +
                           std::to_string(kMaxNameBytes));
  }
  const std::string tensor =
      std::string(collectiveName(static_cast<CollectiveType>(a.collective))) + " of tensor " + quoteName(name) + ": ";
  if (a.collective != static_cast<int>(CollectiveType::kAllreduce) &&
      a.collective != static_cast<int>(CollectiveType::kBroadcast) &&
      a.collective != static_cast<int>(CollectiveType::kAllgather) &&
      a.collective != static_cast<int>(CollectiveType::kReducescatter) &&
      a.collective != static_cast<int>(CollectiveType::kAlltoall) &&
      a.collective != static_cast<int>(CollectiveType::kJoin)) {
    return invalidArgument(tensor + "this collective cannot be submitted this way");
  }
  if ((a.collective == static_cast<int>(CollectiveType::kAllgather) ||
       a.collective == static_cast<int>(CollectiveType::kAlltoall) ||
       a.collective == static_cast<int>(CollectiveType::kReducescatter)) &&
      a.ndim < 1) {
    return invalidArgument(tensor + "ndim is " + std::to_string(a.ndim) +
                           "; it works along the first dimension, so it needs at least one");
  }
  if (a.collective == static_cast<int>(CollectiveType::kBroadcast)) {
    int size = world().size;
    if (a.root < 0 || a.root >= size) {
      return invalidArgument(tensor + "root rank " + std::to_string(a.root) + " is not a rank of this job (size " +
                             std::to_string(size) + ")");
    }
  }
  if (a.ndim < 0 || a.ndim > kMaxDims) {
    return invalidArgument(tensor + "ndim is " + std::to_string(a.ndim) + "; it must be 0 (scalar) to " +
                           std::to_string(kMaxDims));
  }
  if (a.ndim > 0 && a.shape == nullptr) return invalidArgument(tensor + "shape is NULL");
  if (!isValidDataType(a.dtype)) {
    return invalidArgument(tensor + "unknown dtype " + std::to_string(a.dtype));
  }
  if (!isValidReduceOp(a.op)) {
    return invalidArgument(tensor + "unknown reduce op " + std::to_string(a.op) +
                           (a.op == 2 ? " (Adasum is not supported)" : ""));
  }
  if (!std::isfinite(a.prescale) || !std::isfinite(a.postscale)) {
    return invalidArgument(tensor + "prescale and postscale must be finite");
  }
  uint64_t elems = 1;
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] < 0) {
      return invalidArgument(tensor + "dimension " + std::to_string(i) + " is " +
                             std::to_string(a.shape[i]));
    }
    if (__builtin_mul_overflow(elems, static_cast<uint64_t>(a.shape[i]), &elems)) {
      return invalidArgument(tensor + "the shape's element count overflows");
    }
  }
  uint64_t n = 0;
  if (__builtin_mul_overflow(elems, dataTypeSize(static_cast<DataType>(a.dtype)), &n)) {
    return invalidArgument(tensor + "the tensor's byte size overflows");
  }
  const bool needs_output = a.collective != static_cast<int>(CollectiveType::kReducescatter);  // checked later
  if (n > 0 && (a.input == nullptr || (needs_output && a.output == nullptr))) {
    return invalidArgument(tensor + (a.input == nullptr ? "input" : "output") + " is NULL");
  }
  const char* in = static_cast<const char*>(a.input);
  bool in_arena = in >= data_begin_ && in < data_end_;
  if (!in_arena && n > alloc_->capacity() && a.device != 1 && !wantsDevice(a)) {  // (device: its own arena)
    return invalidArgument(tensor + "it is " + std::to_string(n) +
                           " bytes, larger than this process's whole shared arena (" +
                           std::to_string(alloc_->capacity()) +
                           " bytes of data). Raise KOLO_ARENA_MB (now " +
                           (opts_.arena_bytes == 0 ? std::string("unset: the agent's default")
                                                   : std::to_string(opts_.arena_bytes >> 20)) +
                           ") to at least " + std::to_string(arenaMbFor(n)) + ".");
  }
  *bytes = n;
  return okStatus();
}

uint64_t Client::freshHandle() { return nextHandle(); }

Status Client::usableLocked() const {
  if (::getpid() != owner_pid_) {
    return invalidArgument("kolo was initialized by process " + std::to_string(owner_pid_) +
                           "; a forked child cannot use its connection (call kolo_init() in "
                           "the child to connect on its own)");
  }
  if (!failed_.isOk()) return failed_;
  if (shutdown_) return aborted("kolo was shut down (kolo_shutdown)");
  return okStatus();
}

StatusOr<uint64_t> Client::allocateSlot(uint64_t bytes, const std::string& name,
                                        Clock::time_point deadline) {
  auto start = Clock::now();
  for (;;) {
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
      if (auto off = alloc_->allocate(bytes)) {
        ++unpublished_slots_;
        return *off;
      }
      // Space comes back when an op in flight completes; a slot another
      // thread has taken but not yet published becomes such an op.
      bool in_flight = unpublished_slots_ > 0 || std::any_of(ops_.begin(), ops_.end(), [](const auto& kv) {
                         return kv.second.state != OpState::kDone && kv.second.slot.has_value();
                       });
      if (!in_flight) {
        uint64_t shared = 0;
        for (const auto& [off, n] : shared_) shared += ArenaAllocator::roundUp(n);
        return invalidArgument(
            "allreduce of tensor " + quoteName(name) + ": its " + std::to_string(bytes) +
            " bytes do not fit in the shared arena (" + std::to_string(alloc_->capacity()) +
            " bytes of data, " + std::to_string(shared) +
            " held by kolo_alloc_shared buffers) and nothing is in flight to free space. "
            "Free some shared buffers or raise KOLO_ARENA_MB.");
      }
      epoch = space_epoch_;
    }
    // The arena is temporarily full: let completions free slots.
    bool more = progressUntil(
        [&] { return space_epoch_ != epoch || !failed_.isOk(); }, deadline, kDrainerBlockMax);
    if (!more) {
      std::lock_guard<std::mutex> lock(mu_);
      RETURN_IF_ERROR(usableLocked());
      if (Clock::now() >= deadline) {
        return timedOut("allreduce of tensor " + quoteName(name) + ": waited " +
                        fmtSeconds(Clock::now() - start) + " s for " + std::to_string(bytes) +
                        " bytes of the shared arena (" + std::to_string(alloc_->usedBytes()) +
                        " of " + std::to_string(alloc_->capacity()) +
                        " in use) but the collectives in flight did not complete "
                        "(KOLO_OP_TIMEOUT). Raise KOLO_ARENA_MB or wait on handles sooner.");
      }
    }
  }
}

StatusOr<uint64_t> Client::allreduceAsync(const AllreduceArgs& a) {
  if (wantsDevice(a)) return deviceAllreduceAsync(a);
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  std::string name(a.name);
  auto deadline = Clock::now() + opts_.op_timeout;

  {
    std::unique_lock<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usableLocked());
    if (names_in_flight_.count(name) != 0) {
      // Its completion may be waiting in the ring: one non-blocking pass.
      lock.unlock();
      progressUntil([&] { return names_in_flight_.count(name) == 0; }, Clock::now(),
                    milliseconds(0));
      lock.lock();
      RETURN_IF_ERROR(usableLocked());
    }
    if (names_in_flight_.count(name) != 0) {
      return invalidArgument(
          "Requested to " + std::string(collectiveName(static_cast<CollectiveType>(a.collective))) +
          " a tensor with the same name as another tensor that is "
          "currently being processed: " + quoteName(name) +
          ". If you want to request another tensor, use a different tensor name.");
    }
    names_in_flight_.insert(name);
  }

  const char* in = static_cast<const char*>(a.input);
  std::optional<uint64_t> slot;
  uint64_t data_offset = 0;
  const char* result = nullptr;
  Status st;
  // Allgather: one slot holds [first dims | output | input]; see ipc_layout.h.
  const bool gather = a.collective == static_cast<int>(CollectiveType::kAllgather) ||
                      a.collective == static_cast<int>(CollectiveType::kAlltoall);
  uint64_t out_offset = 0, out_bytes = 0, result_bytes = bytes;
  const char* shared_input = nullptr;
  int64_t gather_dim0 = 0;
  if (gather) {
    const WorldView wv = world();
    const int world_size = wv.size;
    uint64_t row = dataTypeSize(static_cast<DataType>(a.dtype));
    for (int i = 1; i < a.ndim; ++i) row *= static_cast<uint64_t>(a.shape[i]);
    const bool a2a = a.splits_matrix != nullptr;
    const int64_t* header = a2a ? a.splits_matrix : a.gather_dims;
    const size_t header_elems = a2a ? static_cast<size_t>(world_size) * world_size : static_cast<size_t>(world_size);
    for (int r = 0; r < world_size; ++r) {
      gather_dim0 += a2a ? a.splits_matrix[static_cast<size_t>(r) * world_size + wv.rank] : a.gather_dims[r];
    }
    const uint64_t prefix = a2a ? alltoallSplitsBytes(world_size) : allgatherSizesBytes(world_size);
    const uint64_t total = static_cast<uint64_t>(gather_dim0) * row;
    const uint64_t out_padded = (total + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
    auto s = allocateSlot(prefix + out_padded + bytes, name, deadline);
    if (s.isOk()) {
      slot = *s;
      out_offset = *s;
      out_bytes = prefix + total;
      data_offset = *s + prefix + out_padded;
      result = arena_.data() + *s + prefix;
      result_bytes = total;
      std::memcpy(arena_.data() + *s, header, sizeof(int64_t) * header_elems);
      if (bytes > 0) streamCopy(arena_.data() + data_offset, in, bytes);
    } else {
      st = s.status();
    }
  } else if (a.collective == static_cast<int>(CollectiveType::kReducescatter)) {
    // One slot holds [input, padded | this rank's block of the output].
    WorldView w = world();
    uint64_t row = dataTypeSize(static_cast<DataType>(a.dtype));
    for (int i = 1; i < a.ndim; ++i) row *= static_cast<uint64_t>(a.shape[i]);
    out_bytes = static_cast<uint64_t>(reducescatterRows(a.shape[0], w.size, w.rank)) * row;
    const uint64_t in_padded = (bytes + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
    if (out_bytes > 0 && a.output == nullptr) {
      st = invalidArgument("reducescatter of tensor " + quoteName(name) + ": output is NULL");
    } else if (bytes > 0 || out_bytes > 0) {
      auto s = allocateSlot(in_padded + out_bytes, name, deadline);
      if (s.isOk()) {
        slot = *s;
        data_offset = *s;
        out_offset = *s + in_padded;
        result = arena_.data() + out_offset;
        result_bytes = out_bytes;
        if (bytes > 0) streamCopy(arena_.data() + *s, in, bytes);
      } else {
        st = s.status();
      }
    }
  } else if (a.compressed && bytes > 0) {
    // float32 in the caller's buffer -> float16/bfloat16 in a slot.
    auto s = allocateSlot(bytes, name, deadline);
    if (s.isOk()) {
      slot = *s;
      data_offset = *s;
      result = arena_.data() + *s;
      const auto* src = static_cast<const float*>(a.input);
      auto* dst = reinterpret_cast<uint16_t*>(arena_.data() + *s);
      const size_t count = bytes / sizeof(uint16_t);
      if (a.dtype == static_cast<int>(DataType::kFloat16)) {
        for (size_t i = 0; i < count; ++i) dst[i] = floatToHalf(src[i]);
      } else {
        for (size_t i = 0; i < count; ++i) dst[i] = floatToBf16(src[i]);
      }
    } else {
      st = s.status();
    }
  } else if (bytes > 0 && in >= data_begin_ && in < data_end_ && !a.out_of_place) {
    // Zero copy: the tensor already lives in a shared buffer.
    uint64_t off = static_cast<uint64_t>(in - arena_.data());
    std::lock_guard<std::mutex> lock(mu_);
    auto within_one = [&](uint64_t o) {
      auto it = shared_.upper_bound(o);
      return it != shared_.begin() && (--it, o + bytes <= it->first + it->second);
    };
    if (!within_one(off)) {
      st = invalidArgument(std::string(collectiveName(static_cast<CollectiveType>(a.collective))) + " of tensor " +
                           quoteName(name) + ": its " +
                           std::to_string(bytes) +
                           " bytes start inside the shared arena but do not lie within one "
                           "buffer from kolo_alloc_shared");
    }
    data_offset = off;
    result = in;
    // Out of place into another shared region: the agent writes the result
    // there and leaves the input as it was (no copy in the caller).
    const char* outp = static_cast<const char*>(a.output);
    if (st.isOk() && a.collective == static_cast<int>(CollectiveType::kAllreduce) && outp != nullptr &&
        outp != in && outp >= data_begin_ && outp < data_end_) {
      const uint64_t out_off = static_cast<uint64_t>(outp - arena_.data());
      if (!within_one(out_off)) {
        st = invalidArgument("allreduce of tensor " + quoteName(name) + ": its output's " + std::to_string(bytes) +
                             " bytes start inside the shared arena but do not lie within one buffer from "
                             "kolo_alloc_shared");
      } else if (outp < in + bytes && in < outp + bytes) {
        st = invalidArgument("allreduce of tensor " + quoteName(name) +
                             ": the output overlaps the input without being the same buffer");
      } else {
        out_offset = out_off;
        out_bytes = bytes;
        result = outp;
        shared_input = in;
      }
    }
  } else if (bytes > 0) {
    auto s = allocateSlot(bytes, name, deadline);
    if (s.isOk()) {
      slot = *s;
      data_offset = *s;
      result = arena_.data() + *s;
      streamCopy(arena_.data() + *s, in, bytes);
    } else {
      st = s.status();
    }
  }

  SubmitDesc d{};
  uint64_t handle = nextHandle();
  if (st.isOk()) {
    d.handle = handle;
    d.collective = static_cast<uint8_t>(a.collective);
    d.dtype = static_cast<uint8_t>(a.dtype);
    d.reduce_op = static_cast<uint8_t>(a.op);
    d.ndim = static_cast<uint8_t>(a.ndim);
    d.root = a.collective == static_cast<int>(CollectiveType::kBroadcast) ? a.root : -1;
    d.name_len = static_cast<uint32_t>(name.size());
    d.prescale = a.prescale;
    d.postscale = a.postscale;
    d.data_offset = data_offset;
    d.data_bytes = bytes;
    d.out_offset = out_offset;
    d.out_bytes = out_bytes;
    for (int i = 0; i < a.ndim; ++i) d.shape[i] = a.shape[i];
    std::memcpy(d.name, name.data(), name.size());
    d.group_id = a.group_id;
    d.group_hash = a.group_hash;
    d.group_size = a.group_size;
  }

  // Publish: the op enters the table and the ring in one critical section,
  // so its completion always finds it. At most maxInFlight() ops are in
  // flight, so neither ring can ever be full: the agent never has to wait
  // for this client to make room for a completion.
  while (st.isOk()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      st = usableLocked();
      if (!st.isOk()) break;
      if (generation_notice_ != 0) {
        st = Status(Code::kMembershipChanged,
                    "the job's membership changed: generation " + std::to_string(generation_notice_) + " (" +
                        std::to_string(world_.size) + " ranks, this one rank " + std::to_string(world_.rank) +
                        ") replaced the one this process used; reset and sync the training state before "
                        "the next collective (kolo.torch.elastic does it)");
        generation_notice_ = 0;
        break;
      }
      if (in_flight_ < maxInFlight()) {
        Op op;
        op.name = name;
        op.output = a.output;
        op.result = result;
        op.shared_input = shared_input;
        op.bytes = result_bytes;
        op.slot = slot;
        op.gather = gather;
        op.gather_dim0 = gather_dim0;
        if (a.compressed) op.decompress = a.dtype;
        ops_.emplace(handle, std::move(op));
        if (slot) --unpublished_slots_;
        ++in_flight_;
        d.generation = world_.generation;
        bool pushed = submit_ring_.tryPush(d);  // we are the only producer
        assert(pushed);
        (void)pushed;
        break;
      }
    }
    bool room = progressUntil([&] { return in_flight_ < maxInFlight() || !failed_.isOk(); },
                              deadline, kDrainerBlockMax);
    if (!room && Clock::now() >= deadline) {
      st = timedOut("allreduce of tensor " + quoteName(name) + ": none of the " +
                    std::to_string(maxInFlight()) +
                    " collectives this process has in flight completed within " +
                    fmtSeconds(opts_.op_timeout) + " s (KOLO_OP_TIMEOUT)");
    }
  }
  if (!st.isOk()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot) {
      --unpublished_slots_;
      if (alloc_->free(*slot)) ++space_epoch_;
    }
    names_in_flight_.erase(name);
    cv_.notify_all();
    return st;
  }
  ringDoorbell();
  return handle;
}

StatusOr<uint64_t> Client::broadcastAsync(const char* name, void* buf, int ndim, const int64_t* shape,
                                          int dtype, int root) {
  AllreduceArgs a;
  a.name = name;
  a.input = buf;
  a.output = buf;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);  // unused; the same on every rank
  a.collective = static_cast<int>(CollectiveType::kBroadcast);
  a.root = root;
  return allreduceAsync(a);
}

StatusOr<uint64_t> Client::broadcastOopAsync(const char* name, const void* input, void* output, int ndim,
                                             const int64_t* shape, int dtype, int root) {
  AllreduceArgs a;
  a.name = name;
  // The other ranks' input is not read: without one, the output's memory
  // stands in (its bytes are overwritten by the root's anyway).
  a.input = input != nullptr || world().rank == root ? input : output;
  a.output = output;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);  // unused; the same on every rank
  a.collective = static_cast<int>(CollectiveType::kBroadcast);
  a.root = root;
  a.out_of_place = true;
  return allreduceAsync(a);
}

StatusOr<uint64_t> Client::compressedAllreduceAsync(AllreduceArgs a, DataType wire) {
  const std::string what = "compressed allreduce of tensor " + quoteName(a.name != nullptr ? a.name : "");
  if (wire != DataType::kFloat16 && wire != DataType::kBFloat16) {
    return invalidArgument(what + ": compression must be KOLO_COMPRESS_FP16 or KOLO_COMPRESS_BF16");
  }
  if (a.dtype != static_cast<int>(DataType::kFloat32)) {
    return invalidArgument(what + ": the tensor must be float32 (it is " +
                           (isValidDataType(a.dtype) ? std::string(dataTypeName(static_cast<DataType>(a.dtype)))
                                                     : std::to_string(a.dtype)) +
                           ")");
  }
  a.dtype = static_cast<int>(wire);
  a.compressed = true;
  a.collective = static_cast<int>(CollectiveType::kAllreduce);
  return allreduceAsync(a);
}

Status Client::barrier(milliseconds timeout) {
  std::string name = "__kolo.barrier." + std::to_string(barriers_.fetch_add(1) + 1);
  int64_t shape[1] = {0};
  AllreduceArgs a;
  a.name = name.c_str();
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kUint8);
  a.op = static_cast<int>(ReduceOp::kSum);
  ASSIGN_OR_RETURN(uint64_t h, allreduceAsync(a));
  Status st = wait(h, timeout);
  if (st.code() == Code::kTimedOut) {
    release(h);
    return timedOut("kolo_barrier: not every rank reached barrier " + name.substr(15) + " within " +
                    fmtSeconds(timeout.count() < 0 ? opts_.op_timeout : timeout) + " s");
  }
  return st;
}

StatusOr<std::vector<uint64_t>> Client::groupedAllreduceAsync(std::vector<AllreduceArgs> members) {
  return groupedAsync(std::move(members), "grouped allreduce");
}

StatusOr<std::vector<uint64_t>> Client::groupedAsync(std::vector<AllreduceArgs> members, const char* what) {
  const std::string kind(what);
  if (members.empty()) return invalidArgument(kind + ": the group has no tensors");
  if (members.size() > 1024) {
    return invalidArgument(kind + ": " + std::to_string(members.size()) +
                           " tensors; a group holds at most 1024 (the in-flight limit)");
  }
  // Check every member first: a group that is half submitted would leave
  // the other ranks waiting for the rest.
  std::set<std::string, std::less<>> seen;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the names, in order
  for (const AllreduceArgs& a : members) {
    uint64_t bytes = 0;
    RETURN_IF_ERROR(validate(a, &bytes).withContext(kind));
    if (a.collective != members[0].collective) {
      return internalError(kind + ": the members are not all the same collective");
    }
    if (!seen.insert(a.name).second) {
      return invalidArgument(kind + ": tensor " + quoteName(a.name) + " appears twice in the group");
    }
    for (const char* p = a.name; *p != '\0'; ++p) hash = (hash ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
    hash = (hash ^ 0xffu) * 1099511628211ull;  // separator
  }
  hash = (hash ^ static_cast<uint64_t>(members[0].collective)) * 1099511628211ull;
  {
    // A member already in flight would be refused after the others went out.
    progressUntil([] { return false; }, Clock::now(), milliseconds(0));  // collect finished completions
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usableLocked());
    for (const AllreduceArgs& a : members) {
      if (names_in_flight_.count(std::string_view(a.name)) != 0) {
        return invalidArgument(kind + ": tensor " + quoteName(a.name) +
                               " is still in flight from an earlier call; wait for it first (nothing of this group "
                               "was submitted)");
      }
    }
  }
  const uint64_t gid = groups_.fetch_add(1) + 1;
  std::vector<uint64_t> handles;
  handles.reserve(members.size());
  for (AllreduceArgs& a : members) {
    a.group_id = gid;
    a.group_hash = hash;
    a.group_size = static_cast<uint32_t>(members.size());
    auto h = allreduceAsync(a);
    if (!h.isOk()) {
      for (uint64_t done : handles) release(done);
      return Status(h.status().code(), kind + " #" + std::to_string(gid) + ": submitting tensor " +
                                           quoteName(a.name) + " failed after " + std::to_string(handles.size()) +
                                           " of its " + std::to_string(members.size()) +
                                           " tensors were submitted (the others will wait for it): " +
                                           h.status().message());
    }
    handles.push_back(*h);
  }
  return handles;
}

StatusOr<std::vector<uint64_t>> Client::groupedReducescatterAsync(std::vector<AllreduceArgs> members) {
  for (AllreduceArgs& a : members) a.collective = static_cast<int>(CollectiveType::kReducescatter);
  return groupedAsync(std::move(members), "grouped reducescatter");
}

StatusOr<std::vector<uint64_t>> Client::groupedAllgatherAsync(std::vector<AllreduceArgs> members) {
  const WorldView w = world();
  for (AllreduceArgs& a : members) {
    a.output = const_cast<void*>(a.input);  // unused: the result is library-owned
    a.op = static_cast<int>(ReduceOp::kSum);
    a.collective = static_cast<int>(CollectiveType::kAllgather);
    uint64_t bytes = 0;
    RETURN_IF_ERROR(validate(a, &bytes).withContext("grouped allgather"));
    if (std::strlen(a.name) + kAllgatherSizesSuffix.size() > kMaxNameBytes) {
      return invalidArgument("grouped allgather: tensor name " + quoteName(a.name) + " is longer than " +
                             std::to_string(kMaxNameBytes - kAllgatherSizesSuffix.size()) + " bytes");
    }
  }
  if (members.empty()) return invalidArgument("grouped allgather: the group has no tensors");
  // Phase 1, one grouped allreduce: every member's first dimension on every
  // rank (Sum of vectors that are zero but for one's own slot).
  const size_t n = static_cast<size_t>(w.size);
  std::vector<std::vector<int64_t>> dims(members.size(), std::vector<int64_t>(n, 0));
  std::vector<std::string> sizes_names(members.size());
  int64_t dims_shape[1] = {w.size};
  std::vector<AllreduceArgs> sizes(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    dims[i][static_cast<size_t>(w.rank)] = members[i].shape[0];
    sizes_names[i] = std::string(members[i].name) + std::string(kAllgatherSizesSuffix);
    AllreduceArgs& s = sizes[i];
    s.name = sizes_names[i].c_str();
    s.input = dims[i].data();
    s.output = dims[i].data();
    s.ndim = 1;
    s.shape = dims_shape;
    s.dtype = static_cast<int>(DataType::kInt64);
    s.op = static_cast<int>(ReduceOp::kSum);
  }
  ASSIGN_OR_RETURN(std::vector<uint64_t> hs, groupedAsync(std::move(sizes), "grouped allgather"));
  Status first;
  for (uint64_t h : hs) {
    Status st = wait(h, milliseconds(-1));
    if (st.code() == Code::kTimedOut) release(h);
    if (first.isOk() && !st.isOk()) first = st;
  }
  if (!first.isOk()) {
    return Status(first.code(), "grouped allgather of " + std::to_string(members.size()) + " tensors (first " +
                                    quoteName(members[0].name) +
                                    "): exchanging the ranks' first dimensions failed: " + first.message());
  }
  // Phase 2: the gathers, as one group.
  for (size_t i = 0; i < members.size(); ++i) members[i].gather_dims = dims[i].data();
  return groupedAsync(std::move(members), "grouped allgather");
}

StatusOr<int> Client::join(milliseconds timeout) {
  int64_t shape[1] = {0};
  AllreduceArgs a;
  a.name = "__kolo.join";
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kUint8);
  a.op = static_cast<int>(ReduceOp::kSum);
  a.collective = static_cast<int>(CollectiveType::kJoin);
  ASSIGN_OR_RETURN(uint64_t h, allreduceAsync(a));
  int64_t last = -1;
  Status st = wait(h, timeout, &last);
  if (st.code() == Code::kTimedOut) {
    release(h);
    return timedOut("kolo_join: not every rank joined within " +
                    fmtSeconds(timeout.count() < 0 ? opts_.op_timeout : timeout) +
                    " s; this rank stays joined, so treat the job as broken");
  }
  RETURN_IF_ERROR(st);
  return static_cast<int>(last);
}

StatusOr<uint64_t> Client::allgatherAsync(const char* name, const void* input, int ndim, const int64_t* shape,
                                          int dtype) {
  AllreduceArgs a;
  a.name = name;
  a.input = input;
  a.output = const_cast<void*>(input);  // unused: the result is library-owned
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);
  a.collective = static_cast<int>(CollectiveType::kAllgather);
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  std::string sizes_name = std::string(name) + std::string(kAllgatherSizesSuffix);
  if (sizes_name.size() > kMaxNameBytes) {
    return invalidArgument("allgather: tensor name " + quoteName(name) + " is longer than " +
                           std::to_string(kMaxNameBytes - kAllgatherSizesSuffix.size()) + " bytes");
  }
  WorldView w = world();
  // Phase 1: every rank's first dimension (Sum of vectors that are zero but
  // for one's own slot).
  std::vector<int64_t> dims(static_cast<size_t>(w.size), 0);
  dims[static_cast<size_t>(w.rank)] = shape[0];
  int64_t dims_shape[1] = {w.size};
  AllreduceArgs s;
  s.name = sizes_name.c_str();
  s.input = dims.data();
  s.output = dims.data();
  s.ndim = 1;
  s.shape = dims_shape;
  s.dtype = static_cast<int>(DataType::kInt64);
  s.op = static_cast<int>(ReduceOp::kSum);
  ASSIGN_OR_RETURN(uint64_t h, allreduceAsync(s));
  Status st = wait(h, milliseconds(-1));
  if (st.code() == Code::kTimedOut) release(h);
  if (!st.isOk()) {
    return Status(st.code(), "allgather of tensor " + quoteName(name) +
                                 ": exchanging the ranks' first dimensions failed: " + st.message());
  }
  for (int64_t d : dims) {
    if (d < 0) return internalError("allgather of tensor " + quoteName(name) + ": a rank reported first dimension " + std::to_string(d));
  }
  // Phase 2: the gather itself.
  a.gather_dims = dims.data();
  return allreduceAsync(a);
}

StatusOr<uint64_t> Client::reducescatterAsync(const char* name, const void* input, void* output, int ndim,
                                              const int64_t* shape, int dtype, int op) {
  AllreduceArgs a;
  a.name = name;
  a.input = input;
  a.output = output;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = op;
  a.collective = static_cast<int>(CollectiveType::kReducescatter);
  return allreduceAsync(a);
}

StatusOr<uint64_t> Client::alltoallAsync(const char* name, const void* input, int ndim, const int64_t* shape,
                                         int dtype, const int64_t* splits) {
  AllreduceArgs a;
  a.name = name;
  a.input = input;
  a.output = const_cast<void*>(input);  // unused: the result is library-owned
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);
  a.collective = static_cast<int>(CollectiveType::kAlltoall);
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  static constexpr std::string_view kSuffix = ".__splits";
  std::string splits_name = std::string(name) + std::string(kSuffix);
  if (splits_name.size() > kMaxNameBytes) {
    return invalidArgument("alltoall: tensor name " + quoteName(name) + " is longer than " +
                           std::to_string(kMaxNameBytes - kSuffix.size()) + " bytes");
  }
  const WorldView w = world();
  const size_t n = static_cast<size_t>(w.size);
  std::vector<int64_t> m(n * n, 0);
  int64_t sum = 0;
  for (size_t d = 0; d < n; ++d) {
    int64_t v = splits != nullptr ? splits[d] : shape[0] / w.size;
    if (v < 0) return invalidArgument("alltoall of tensor " + quoteName(name) + ": splits[" + std::to_string(d) + "] is negative");
    m[static_cast<size_t>(w.rank) * n + d] = v;
    sum += v;
  }
  if (sum != shape[0]) {
    return invalidArgument("alltoall of tensor " + quoteName(name) + ": " +
                           (splits != nullptr ? "the splits add up to " + std::to_string(sum) + " rows"
                                              : "without splits the first dimension must divide by the job size " +
                                                    std::to_string(w.size)) +
                           ", but the first dimension is " + std::to_string(shape[0]));
  }
  int64_t m_shape[1] = {static_cast<int64_t>(n * n)};
  AllreduceArgs s;
  s.name = splits_name.c_str();
  s.input = m.data();
  s.output = m.data();
  s.ndim = 1;
  s.shape = m_shape;
  s.dtype = static_cast<int>(DataType::kInt64);
  s.op = static_cast<int>(ReduceOp::kSum);
  ASSIGN_OR_RETURN(uint64_t h, allreduceAsync(s));
  Status st = wait(h, milliseconds(-1));
  if (st.code() == Code::kTimedOut) release(h);
  if (!st.isOk()) {
    return Status(st.code(), "alltoall of tensor " + quoteName(name) +
                                 ": exchanging the ranks' splits failed: " + st.message());
  }
  a.splits_matrix = m.data();
  return allreduceAsync(a);
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
  if (!sock_eof_) {
    std::string payload;
    Status s = readAvailable(sock_.get(), &decoder_, &stray_fds_);
    stray_fds_.clear();  // nothing after the handshake carries descriptors
    while (decoder_.next(&payload)) {
      handleAgentFrame(payload);
      any = true;
    }
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
  // A small collective completes in tens of microseconds: poll the ring for
  // that long first, so the common case needs no sleep and no wake-up.
  if (opts_.spin.count() > 0) {
    auto spin_end = std::min<Clock::time_point>(Clock::now() + opts_.spin, deadline);
    for (int i = 0; !sock_eof_; ++i) {
      if (!completion_ring_.empty()) return;
      if (Clock::now() >= spin_end) break;
      ::sched_yield();  // on oversubscribed cores, let the agent run
    }
  }
  // Tell the agent we are about to sleep, then look at the ring once more:
  // a completion pushed before it saw the flag is caught here, one pushed
  // after it rings the eventfd.
  header_->client_waiting.store(1, std::memory_order_seq_cst);
  if (!completion_ring_.empty()) {
    header_->client_waiting.store(0, std::memory_order_relaxed);
    return;
  }
  auto now = Clock::now();
  auto wait = std::min<Clock::duration>(deadline - now, max_block);
  int ms = static_cast<int>(std::chrono::ceil<milliseconds>(wait).count());
  pollfd fds[3] = {{completion_efd_.get(), POLLIN, 0},
                   {sock_eof_ ? -1 : sock_.get(), POLLIN, 0},
                   {wake_efd_.get(), POLLIN, 0}};
  int r = ::poll(fds, 3, std::max(ms, 0));
  header_->client_waiting.store(0, std::memory_order_relaxed);
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
  if (op.device) {
    // Enqueued on the caller's stream behind the agent's out_ready (no host wait).
    Status ds = device_->finish(op.staged, op.output, op.bytes, op.stream, st.isOk() && !op.released);
    if (st.isOk()) st = ds;
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
    op.state = OpState::kCompleting;
    void* out = op.output;
    const char* src = op.result;
    uint64_t bytes = op.bytes;
    lk.unlock();
    streamCopy(out, src, bytes);
    lk.lock();
    it = ops_.find(c.handle);  // the table may have rehashed
  }
  finishOpLocked(it, std::move(st));
}

uint64_t Client::maxInFlight() const {
  return std::min(submit_ring_.capacity(), completion_ring_.capacity());
}

void Client::finishOpLocked(std::unordered_map<uint64_t, Op>::iterator it, Status status) {
  Op& op = it->second;
  --in_flight_;
  if (op.slot && alloc_->free(*op.slot)) ++space_epoch_;
  op.slot.reset();
  names_in_flight_.erase(op.name);
  op.state = OpState::kDone;
  op.status = std::move(status);
  if (op.released) ops_.erase(it);
  cv_.notify_all();
}

void Client::handleAgentFrame(const std::string& payload) {
  ipc::AgentFrame f;
  if (!f.ParseFromString(payload)) {
    logger()->warn("ignoring a frame from the agent that is not an AgentFrame");
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (f.has_job_failed()) {
    Status st = wireStatus(f.job_failed().code(), f.job_failed().message(), Code::kAborted);
    logger()->debug("job failed: {}", st.toString());
    failAllLocked(st);
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
  for (auto it = ops_.begin(); it != ops_.end();) {
    auto cur = it++;  // finishOpLocked may erase a released op
    if (cur->second.state == OpState::kSubmitted) finishOpLocked(cur, failed_);
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
  if (it->second.state != OpState::kDone) {
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
    return it == ops_.end() || it->second.state == OpState::kDone;
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
    return timedOut("allreduce of tensor " + quoteName(it->second.name) + " (handle " +
                    std::to_string(handle) + ") did not complete within " + fmtSeconds(limit) +
                    " s; it is still pending (wait again, or see `kolo job " + opts_.job_id +
                    "` for the ranks it waits for)");
  }
  Status st = std::move(it->second.status);
  if (aux != nullptr) *aux = it->second.aux;
  ops_.erase(it);
  return st;
}

void Client::release(uint64_t handle) {
  std::unique_lock<std::mutex> lk(mu_);
  results_.erase(handle);
  for (;;) {
    auto it = ops_.find(handle);
    if (it == ops_.end()) return;
    if (it->second.state == OpState::kCompleting) {
      cv_.wait(lk);  // a copy into its output is running; it is a memcpy, it ends
      continue;
    }
    if (it->second.state == OpState::kDone) {
      ops_.erase(it);
    } else {
      it->second.released = true;
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
      return invalidArgument("kolo_free_shared: the buffer is in use by the allreduce of tensor " +
                             quoteName(op.name) + ", still in flight");
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
  if (::getpid() != owner_pid_) {
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
  std::lock_guard<std::mutex> lk(mu_);
  RETURN_IF_ERROR(usableLocked());
  if (start && path.empty()) return invalidArgument("start_timeline: the file name is empty");
  ipc::ClientFrame f;
  f.mutable_timeline()->set_start(start);
  f.mutable_timeline()->set_path(path);
  f.mutable_timeline()->set_mark_cycles(mark_cycles);
  return sendFrame(sock_.get(), f).withContext(start ? "start_timeline" : "stop_timeline");
}

}  // namespace kolo
