#include "fake_agent.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <deque>

#include "common/frame.h"
#include "common/unix_socket.h"

namespace kolo::testing {

namespace {
constexpr int kPollMs = 1000;  // the loop also wakes on stop_efd_
}

FakeAgent::FakeAgent(FakeAgentOptions opts) : opts_(std::move(opts)) {
  if (opts_.world.size() == 0) {
    opts_.world.set_generation(1);
    opts_.world.set_rank(0);
    opts_.world.set_size(1);
    opts_.world.set_local_rank(0);
    opts_.world.set_local_size(1);
    opts_.world.set_cross_rank(0);
    opts_.world.set_cross_size(1);
  }
  if (!dir_.valid()) return;
  socket_path_ = dir_.path() + "/agent.sock";
  auto fd = listenUnix(socket_path_, 0600, "");
  if (!fd.isOk()) return;
  listen_fd_ = std::move(fd).value();
  stop_efd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_efd_.valid()) return;
  listening_ = true;
  thread_ = std::thread([this] { run(); });
}

FakeAgent::~FakeAgent() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_efd_.get(), &one, sizeof one);
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  conn_.reset();
  listen_fd_.reset();
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
}

void FakeAgent::run() {
  for (;;) {
    std::vector<pollfd> fds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fds.push_back({stop_efd_.get(), POLLIN, 0});
      fds.push_back({conn_ ? -1 : listen_fd_.get(), POLLIN, 0});
      fds.push_back({conn_ ? conn_->sock.get() : -1, POLLIN, 0});
      fds.push_back({conn_ && conn_->doorbell.valid() ? conn_->doorbell.get() : -1, POLLIN, 0});
    }
    int r = ::poll(fds.data(), fds.size(), kPollMs);
    if (r <= 0) continue;
    if (fds[0].revents != 0) return;
    if (fds[1].revents != 0) acceptOne();
    if (fds[2].revents != 0) serveReadable();
    if (fds[3].revents != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (conn_ && conn_->doorbell.valid()) {
        uint64_t v;
        (void)!::read(conn_->doorbell.get(), &v, sizeof v);
        drainSubmissionsLocked();
      }
    }
  }
}

void FakeAgent::acceptOne() {
  int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  conn_ = std::make_unique<Conn>();
  conn_->sock.reset(fd);
  ++accepted_;
  cv_.notify_all();
}

void FakeAgent::serveReadable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!conn_) return;
  std::deque<UniqueFd> fds;
  Status s = readAvailable(conn_->sock.get(), &conn_->decoder, &fds);
  std::string payload;
  while (conn_->decoder.next(&payload)) {
    ipc::ClientFrame f;
    if (!f.ParseFromString(payload)) continue;
    if (f.has_goodbye()) {
      ++goodbyes_;
      cv_.notify_all();
      continue;
    }
    if (!f.has_hello()) continue;
    hello_ = f.hello();
    cv_.notify_all();

    ipc::AgentFrame reply;
    if (refused_ < opts_.refusals) {
      ++refused_;
      reply.mutable_refused()->set_code(static_cast<int>(Code::kUnavailable));
      reply.mutable_refused()->set_message(
          "the kolo agent is out of file descriptors (Too many open files); try again later");
      reply.mutable_refused()->set_frame("connection");
      reply.mutable_refused()->set_retry_after_ms(opts_.refusal_retry_after_ms);
      sendLocked(reply);
      closeConnLocked();
      return;
    }
    ipc::Welcome* w = reply.mutable_welcome();
    if (opts_.welcome_code != 0) {
      w->set_code(opts_.welcome_code);
      w->set_message(opts_.welcome_message);
      sendLocked(reply);
      continue;
    }
    uint64_t bytes = f.hello().arena_bytes() != 0 ? f.hello().arena_bytes() : opts_.default_arena_bytes;
    auto region = SharedRegion::create("kolo-fake-arena", bytes);
    if (!region.isOk()) return;
    conn_->arena = std::move(region).value();
    ArenaLayout l = ArenaLayout::compute(bytes);
    auto* h = new (conn_->arena.data()) ArenaHeader();
    h->magic = kArenaMagic;
    h->version = kIpcProtocolVersion;
    h->total_bytes = bytes;
    h->submit_ring_offset = l.submit_ring_offset;
    h->completion_ring_offset = l.completion_ring_offset;
    h->data_offset = l.data_offset;
    h->data_bytes = l.data_bytes;
    SubmitRing::format(conn_->arena.data() + l.submit_ring_offset, kSubmitRingCapacity);
    CompletionRing::format(conn_->arena.data() + l.completion_ring_offset,
                           kCompletionRingCapacity);
    conn_->submit = SubmitRing(conn_->arena.data() + l.submit_ring_offset);
    conn_->done = CompletionRing(conn_->arena.data() + l.completion_ring_offset);
    conn_->doorbell.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    conn_->completion.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    w->set_code(0);
    w->set_arena_bytes(bytes);
    w->set_agent_id("fake-agent");
    w->set_max_bytes_in_flight(opts_.max_bytes_in_flight);
    sendLocked(reply, {conn_->arena.fd(), conn_->doorbell.get(), conn_->completion.get()});
    if (opts_.job_failed_instead_of_world) {
      ipc::AgentFrame jf;
      jf.mutable_job_failed()->set_code(opts_.job_failed_instead_of_world->first);
      jf.mutable_job_failed()->set_message(opts_.job_failed_instead_of_world->second);
      sendLocked(jf);
    } else if (opts_.send_world) {
      ipc::AgentFrame wf;
      *wf.mutable_world() = opts_.world;
      sendLocked(wf);
    }
  }
  if (!s.isOk()) closeConnLocked();  // EOF or error: ready for the next client
}

void FakeAgent::drainSubmissionsLocked() {
  if (!opts_.consume_submissions) return;
  SubmitDesc d;
  while (conn_->submit.tryPop(&d)) {
    received_.push_back(d);
    if (opts_.auto_complete) {
      completeLocked(d, 0, "");
    } else {
      held_.push_back(d);
    }
  }
  cv_.notify_all();
}

void FakeAgent::completeLocked(const SubmitDesc& d, int32_t code, const std::string& message) {
  if (!conn_ || !conn_->arena.valid()) return;
  if (code == 0 && opts_.reduce && d.data_bytes > 0) {
    opts_.reduce(d, conn_->arena.data() + d.data_offset);
  }
  CompletionDesc c{};
  c.handle = d.handle;
  c.code = code;
  c.msg_len = static_cast<uint32_t>(std::min(message.size(), kMaxErrorBytes));
  std::memcpy(c.msg, message.data(), c.msg_len);
  c.out_offset = d.data_offset;
  c.out_bytes = d.data_bytes;
  // The completion ring is as large as the submission ring and the client
  // drains it; a full ring here would be a client bug.
  while (!conn_->done.tryPush(c)) {
  }
  uint64_t one = 1;
  (void)!::write(conn_->completion.get(), &one, sizeof one);
}

void FakeAgent::closeConnLocked() {
  conn_.reset();
  held_.clear();
  cv_.notify_all();
}

bool FakeAgent::waitForSubmissions(size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return received_.size() >= n; });
}

bool FakeAgent::waitForHello(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return hello_.has_value(); });
}

bool FakeAgent::waitForGoodbye(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return goodbyes_ > 0; });
}

std::vector<SubmitDesc> FakeAgent::submissions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

ipc::Hello FakeAgent::lastHello() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hello_.value_or(ipc::Hello());
}

int FakeAgent::connectionsAccepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_;
}

std::string FakeAgent::readArena(uint64_t offset, size_t len) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!conn_ || !conn_->arena.valid() || offset > conn_->arena.size() ||
      len > conn_->arena.size() - offset) {
    return {};
  }
  return std::string(conn_->arena.data() + offset, len);
}

uint64_t FakeAgent::dataOffset() const {
  std::lock_guard<std::mutex> lock(mu_);
  return conn_ && conn_->arena.valid()
             ? reinterpret_cast<const ArenaHeader*>(conn_->arena.data())->data_offset
             : 0;
}

uint64_t FakeAgent::dataBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return conn_ && conn_->arena.valid()
             ? reinterpret_cast<const ArenaHeader*>(conn_->arena.data())->data_bytes
             : 0;
}

void FakeAgent::completeAll(int32_t code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const SubmitDesc& d : held_) completeLocked(d, code, message);
  held_.clear();
}

void FakeAgent::sendLocked(const google::protobuf::MessageLite& frame,
                           const std::vector<int>& fds) {
  (void)sendFrame(conn_->sock.get(), frame, fds);
  if (conn_->arena.data() != nullptr) {
    reinterpret_cast<ArenaHeader*>(conn_->arena.data())
        ->frames_sent.fetch_add(1, std::memory_order_release);
  }
}

void FakeAgent::sendJobFailed(int32_t code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!conn_) return;
  ipc::AgentFrame f;
  f.mutable_job_failed()->set_code(code);
  f.mutable_job_failed()->set_message(message);
  sendLocked(f);
}

void FakeAgent::dropConnection() {
  std::lock_guard<std::mutex> lock(mu_);
  // The agent thread sees the hang-up and closes its end; the client sees EOF.
  if (conn_) ::shutdown(conn_->sock.get(), SHUT_RDWR);
}

}  // namespace kolo::testing
