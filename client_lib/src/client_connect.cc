// libkolo's connection to its node's agent: the socket (retried until
// KOLO_START_TIMEOUT), the handshake (Hello, Welcome or a refusal), the shared
// arena and its rings, and the job's World. The rest of Client: client.cc
// (progress, completions, handles, shutdown), client_submit.cc and
// client_collectives.cc (submission), client_device.cc (device memory).
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "client.h"
#include "client_text.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/unix_socket.h"
#include "current_pid.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kConnectRetry{100};

std::shared_ptr<spdlog::logger> logger() {
  static auto l = log::get("client");
  return l;
}

using client_text::fmtSeconds;
using client_text::wireStatus;

bool isPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

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
      return Status(refused.code(),
                    refused.message() + " (refused until KOLO_START_TIMEOUT ran out)");
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
    int ms = static_cast<int>(std::chrono::duration_cast<milliseconds>(deadline - now).count()) + 1;
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
  if (::getrandom(direct_probe_, sizeof direct_probe_, 0) !=
      static_cast<ssize_t>(sizeof direct_probe_))
    return;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
    std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
    int level = 0;
    if (scope >> level && level == 1)
      (void)::prctl(PR_SET_PTRACER, static_cast<unsigned long>(cred.pid), 0, 0, 0);
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
    return isPowerOfTwo(cap) && cap <= total / entry &&
           within(off + sizeof(RingHeader), cap * entry);
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
    logger()->debug("job '{}' generation {}: rank {} of {}", opts_.job_id, w.generation(), w.rank(),
                    w.size());
    return okStatus();
  }
}

WorldView Client::world() const {
  std::lock_guard<std::mutex> lock(mu_);
  return world_;
}

}  // namespace kolo
