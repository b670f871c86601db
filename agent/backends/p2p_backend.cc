#include "agent/backends/p2p_backend.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>

#include "agent/backends/kv_store.h"
#include "common/reduce.h"
#include "common/worker_pool.h"

namespace kolo {
namespace {

// Chunks below this are reduced inline on the progress thread: handing them
// to the helper thread would cost more than the reduction.
constexpr size_t kInlineReduceBytes = 32 * 1024;
// After a failure, how long to wait for the transport to hand back the
// buffers of the failed collective (cancelled requests) before reporting it
// anyway.
constexpr auto kDrainGrace = std::chrono::seconds(2);
constexpr auto kMaxCloseWait = std::chrono::seconds(5);
// A peer reported gone fails the running collective only if the collective
// still waits for it this long after: what the peer delivered before it left
// (a graceful close flushes) is matched first.
constexpr auto kPeerGrace = std::chrono::milliseconds(50);

}  // namespace

struct P2pBackend::Queued {
  uint64_t seq = 0;
  std::unique_ptr<coll::Collective> coll;
  Status invalid;
  Done done;
};

struct P2pBackend::Active {
  uint64_t seq = 0;
  std::unique_ptr<coll::Collective> coll;
  Done done;
  std::string what;
  Status failed;
  Clock::time_point started;
  Clock::time_point last_progress;
  Clock::time_point drain_deadline;
  int outstanding = 0;  // messages posted and not yet completed
  int reduces = 0;      // reductions not yet completed
};

// Backend-owned buffers handed to collectives; reused from one collective to
// the next so that big receive buffers are not re-faulted every time.
std::byte* P2pBackend::ScratchArena::get(size_t bytes) {
  if (next_ == bufs_.size()) bufs_.push_back({nullptr, 0});
  auto& b = bufs_[next_++];
  if (b.second < bytes) {
    b.first.reset(new std::byte[std::max<size_t>(bytes, 1)]);
    b.second = bytes;
  }
  return b.first.get();
}

P2pBackend::P2pBackend(BackendOptions options, const std::string& logger, MakeP2pTransport make)
    : opts_(std::move(options)),
      log_(log::get(logger)),
      transport_(make(*this)),
      wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

// The progress thread tears the transport down as it ends; the transport
// object goes after it (members are destroyed after this body).
P2pBackend::~P2pBackend() { stop(); }

StatusOr<std::unique_ptr<Backend>> makeP2pBackend(const BackendOptions& options, KvStore& kv,
                                                  const std::string& logger,
                                                  MakeP2pTransport make) {
  RETURN_IF_ERROR(validateBackendOptions(options));
  auto backend = std::make_unique<P2pBackend>(options, logger, std::move(make));
  if (options.size > kP2pMaxRanks) {
    return invalidArgument("the " + std::string(backend->name()) + " backend supports at most " +
                           std::to_string(kP2pMaxRanks) + " agents, got " +
                           std::to_string(options.size));
  }
  RETURN_IF_ERROR(backend->start(kv));
  return std::unique_ptr<Backend>(std::move(backend));
}

void P2pBackend::stop() {
  if (std::this_thread::get_id() == thread_.get_id()) {
    log_->critical("a {} backend was destroyed from its own completion callback", name());
    std::abort();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

Status P2pBackend::start(KvStore& kv) {
  if (!wake_fd_.valid()) return errnoStatus("eventfd", errno);
  std::promise<Status> created;
  auto result = created.get_future();
  thread_ = std::thread([this, &kv, &created] { threadMain(kv, created); });
  Status st = result.get();
  if (!st.isOk()) thread_.join();
  return st;
}

void P2pBackend::peerGone(int peer, const std::string& why) {
  if (!peer_status_[peer].isOk()) return;
  peer_status_[peer] = peerFailure(why);
  // Peers leave at every teardown; it is news only while there is work.
  log_->log(active_ || !pending_.empty() ? spdlog::level::warn : spdlog::level::debug,
            "{}agent rank {} went away: {}", prefix(), peer, why);
  // Not broken yet: a peer that has done its part of every collective may
  // leave (its ranks shut down) before this agent has received what it sent
  // last. A collective fails only while it still waits for the gone peer
  // (checkPeers, after a grace); that failure breaks the backend.
  peer_check_needed_ = true;
}

void P2pBackend::noteProgress() {
  if (active_) active_->last_progress = Clock::now();
}

void P2pBackend::forEachRequest(const std::function<void(P2pRequest&)>& fn) {
  for (auto& [raw, req] : requests_) fn(*req);
}

// --- Backend ---------------------------------------------------------------

void P2pBackend::allreduceOutOfPlace(const void* in, void* buf, size_t count, DataType dtype, ReduceOp op,
                                     Done done) {
  if (!isValidDataType(static_cast<int>(dtype)) || !isValidReduceOp(static_cast<int>(op))) {
    return submit(invalidArgument("allreduce: invalid dtype or op"), std::move(done));
  }
  if (count > 0 && (buf == nullptr || in == nullptr)) {
    return submit(invalidArgument("allreduce: null buffer"), std::move(done));
  }
  const size_t bytes = count * dataTypeSize(dtype);
  if (in != buf && bytes > 0) {
    auto* i = static_cast<const std::byte*>(in);
    auto* o = static_cast<std::byte*>(buf);
    if (i < o + bytes && o < i + bytes) {
      return submit(invalidArgument("allreduce: the output overlaps the input"), std::move(done));
    }
  }
  if (opts_.size == 1 || count == 0) {
    return submit(coll::makeLocalCollective("allreduce (local)",
                                            [in, buf, bytes] {
                                              if (bytes > 0 && in != buf) std::memcpy(buf, in, bytes);
                                            }),
                  std::move(done));
  }
  if (bytes < small_message_bytes_) {
    return submit(coll::makeRecursiveDoublingAllreduce(in, buf, count, dtype, op), std::move(done));
  }
  submit(coll::makeRingAllreduce(in, buf, count, dtype, op), std::move(done));
}

void P2pBackend::broadcast(void* buf, size_t bytes, int root, Done done) {
  if (root < 0 || root >= opts_.size) {
    return submit(invalidArgument("broadcast: root " + std::to_string(root) +
                                  " out of range [0, " + std::to_string(opts_.size) + ")"),
                  std::move(done));
  }
  if (bytes > 0 && buf == nullptr) {
    return submit(invalidArgument("broadcast: null buffer"), std::move(done));
  }
  if (opts_.size == 1 || bytes == 0) {
    return submit(coll::makeLocalCollective("broadcast (local)", nullptr), std::move(done));
  }
  if (bytes < small_message_bytes_) {
    return submit(coll::makeTreeBroadcast(buf, bytes, root), std::move(done));
  }
  submit(coll::makeChainBroadcast(buf, bytes, root), std::move(done));
}

void P2pBackend::allgatherv(const void* in, size_t in_bytes, void* out, std::vector<size_t> recv_bytes,
                Done done) {
  if (recv_bytes.size() != static_cast<size_t>(opts_.size)) {
    return submit(invalidArgument("allgatherv: " + std::to_string(recv_bytes.size()) +
                                  " block sizes for " + std::to_string(opts_.size) + " ranks"),
                  std::move(done));
  }
  if (in_bytes != recv_bytes[opts_.rank]) {
    return submit(
        invalidArgument("allgatherv: rank " + std::to_string(opts_.rank) + " contributes " +
                        std::to_string(in_bytes) + " bytes but its block is " +
                        std::to_string(recv_bytes[opts_.rank])),
        std::move(done));
  }
  const size_t total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  if ((total > 0 && out == nullptr) || (in_bytes > 0 && in == nullptr)) {
    return submit(invalidArgument("allgatherv: null buffer"), std::move(done));
  }
  if (opts_.size == 1) {
    return submit(coll::makeLocalCollective("allgatherv (local)",
                                           [in, out, in_bytes] {
                                             if (in_bytes > 0 && in != out)
                                               std::memmove(out, in, in_bytes);
                                           }),
                  std::move(done));
  }
  if (total < small_message_bytes_ && opts_.size > 2) {
    return submit(coll::makeBruckAllgatherv(in, out, std::move(recv_bytes)), std::move(done));
  }
  submit(coll::makeRingAllgatherv(in, out, std::move(recv_bytes)), std::move(done));
}

void P2pBackend::reducescatter(const void* in, void* out, std::vector<size_t> recv_counts, DataType dtype,
                   ReduceOp op, Done done) {
  if (!isValidDataType(static_cast<int>(dtype)) || !isValidReduceOp(static_cast<int>(op))) {
    return submit(invalidArgument("reducescatter: invalid dtype or op"), std::move(done));
  }
  if (recv_counts.size() != static_cast<size_t>(opts_.size)) {
    return submit(invalidArgument("reducescatter: " + std::to_string(recv_counts.size()) +
                                  " block counts for " + std::to_string(opts_.size) + " ranks"),
                  std::move(done));
  }
  const size_t esize = dataTypeSize(dtype);
  const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  size_t own_off = 0;
  for (int i = 0; i < opts_.rank; ++i) own_off += recv_counts[i];
  const size_t own_bytes = recv_counts[opts_.rank] * esize;
  if ((total > 0 && in == nullptr) || (own_bytes > 0 && out == nullptr)) {
    return submit(invalidArgument("reducescatter: null buffer"), std::move(done));
  }
  auto* in_b = static_cast<const std::byte*>(in);
  auto* out_b = static_cast<std::byte*>(out);
  const bool in_place = out_b == in_b + own_off * esize;
  const bool disjoint = out_b + own_bytes <= in_b || in_b + total * esize <= out_b;
  if (!in_place && !disjoint && own_bytes > 0) {
    return submit(invalidArgument("reducescatter: out overlaps in (only out == in + own block "
                                  "offset is allowed)"),
                  std::move(done));
  }
  if (opts_.size == 1 || total == 0) {
    return submit(coll::makeLocalCollective("reducescatter (local)",
                                           [in_b, out_b, own_off, own_bytes, esize] {
                                             const std::byte* src = in_b + own_off * esize;
                                             if (own_bytes > 0 && src != out_b)
                                               std::memmove(out_b, src, own_bytes);
                                           }),
                  std::move(done));
  }
  if (total * esize < small_message_bytes_) {
    return submit(coll::makeSmallReducescatter(in, out, std::move(recv_counts), dtype, op),
                  std::move(done));
  }
  submit(coll::makeRingReducescatter(in, out, std::move(recv_counts), dtype, op), std::move(done));
}

void P2pBackend::alltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
               std::vector<size_t> recv_bytes, Done done) {
  const size_t n = static_cast<size_t>(opts_.size);
  if (send_bytes.size() != n || recv_bytes.size() != n) {
    return submit(
        invalidArgument("alltoallv: block sizes for " + std::to_string(send_bytes.size()) + "/" +
                        std::to_string(recv_bytes.size()) + " ranks, expected " +
                        std::to_string(n)),
        std::move(done));
  }
  const size_t sin = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
  const size_t sout = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  if ((sin > 0 && in == nullptr) || (sout > 0 && out == nullptr)) {
    return submit(invalidArgument("alltoallv: null buffer"), std::move(done));
  }
  submit(coll::makeAlltoallv(in, std::move(send_bytes), out, std::move(recv_bytes)),
         std::move(done));
}

void P2pBackend::barrier(Done done) {
  if (opts_.size == 1) {
    return submit(coll::makeLocalCollective("barrier (local)", nullptr), std::move(done));
  }
  submit(coll::makeDisseminationBarrier(), std::move(done));
}

void P2pBackend::abort(Status why) {
  if (why.isOk()) why = aborted("backend aborted");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_request_) abort_request_ = std::move(why);
  }
  wake();
}


void P2pBackend::submit(StatusOr<std::unique_ptr<coll::Collective>> coll, Done done) {
  Queued q;
  q.done = std::move(done);
  if (coll.isOk()) {
    q.coll = std::move(coll).value();
  } else {
    q.invalid = coll.status();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Invalid collectives take a number too, so every rank stays in step
    // when all of them reject the same call.
    q.seq = next_seq_++;
    incoming_.push_back(std::move(q));
  }
  wake();
}

void P2pBackend::wake() {
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  (void)n;  // EAGAIN means the counter is already non-zero: a wake-up is pending anyway
}

// --- progress thread -----------------------------------------------------

void P2pBackend::threadMain(KvStore& kv, std::promise<Status>& created) {
  log::setThreadName("kolo-" + std::string(name()) + "-" + std::to_string(opts_.rank));
  Status st = connect(kv);
  if (st.isOk()) {
    // One barrier proves every peer reachable both ways before creation returns.
    bool done = false;
    Status barrier_status;
    if (opts_.size > 1) {
      submit(coll::makeDisseminationBarrier(), [&](Status s) {
        barrier_status = std::move(s);
        done = true;
      });
    } else {
      submit(coll::makeLocalCollective("barrier (local)", nullptr),
             [&](Status s) { done = true; });
    }
    runLoop([&] { return done; });
    if (!barrier_status.isOk()) st = barrier_status.withContext("connecting to the peers");
  }
  if (st.isOk()) {
    log_->debug("{}rank {}/{} connected", prefix(), opts_.rank, opts_.size);
  }
  const bool ok = st.isOk();
  created.set_value(std::move(st));  // `kv` and `created` are gone after this
  if (ok) runLoop([this] { return stopping_ && !active_ && pending_.empty(); });
  teardown();
}

Status P2pBackend::connect(KvStore& kv) {
  const auto deadline = Clock::now() + opts_.timeout;
  peer_status_.assign(opts_.size, okStatus());
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return errnoStatus("epoll_create1", errno);
  RETURN_IF_ERROR(transport_->connectTransport(kv, deadline));
  for (int fd : {transport_->transportFd(), wake_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return errnoStatus("epoll_ctl", errno);
    }
  }
  if (opts_.reduce_thread) {
    reducer_ = std::make_unique<WorkerPool>("kolo-" + std::string(name()) + "red" + std::to_string(opts_.rank), 1);
  }
  return okStatus();
}

template <typename Until>
void P2pBackend::runLoop(Until until) {
  epoll_event evs[4];
  for (;;) {
    // A peer's failure (or a receive posted from a failed peer) is judged
    // only after more progress (see kPeerGrace).
    const bool check_peers = peer_check_needed_ || peer_grace_until_.has_value();
    peer_check_needed_ = false;
    bool moved = takeIncoming();
    moved |= startNext();
    while (transport_->progressTransport()) moved = true;
    moved |= processEvents();
    if (check_peers) checkPeers();
    moved |= peer_check_needed_;
    checkDeadline();
    moved |= finishActiveIfDone();
    if (until()) return;
    if (moved || !completed_.empty() || !reduced_local_.empty()) {
      spin_since_.reset();
      continue;
    }
    // While a collective runs, poll a little longer before sleeping: the
    // next message often arrives within a wake-up's time
    // (backend-spin-us; yielding, so a peer on the same core runs).
    if (active_ && opts_.spin_us > 0) {
      const auto now = Clock::now();
      if (!spin_since_) spin_since_ = now;
      if (now - *spin_since_ < std::chrono::microseconds(opts_.spin_us)) {
        ::sched_yield();
        continue;
      }
    }
    spin_since_.reset();
    int wait_ms = waitMs();
    if (!transport_->armTransport(wait_ms)) continue;
    int n = ::epoll_wait(epoll_fd_.get(), evs, 4, wait_ms);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == wake_fd_.get()) {
        uint64_t v;
        while (::read(wake_fd_.get(), &v, sizeof v) > 0) {
        }
      }
    }
  }
}

int P2pBackend::waitMs() const {
  if (!active_) return 1000;
  auto deadline =
      active_->failed.isOk() ? active_->last_progress + opts_.timeout : active_->drain_deadline;
  if (peer_grace_until_) deadline = std::min(deadline, *peer_grace_until_);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 100));
}

bool P2pBackend::takeIncoming() {
  std::vector<Queued> in;
  std::vector<ReduceDone> red;
  std::optional<Status> abort_request;
  bool stop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in.swap(incoming_);
    red.swap(reduced_remote_);
    abort_request.swap(abort_request_);
    stop = stop_;
  }
  for (auto& q : in) pending_.push_back(std::move(q));
  reduced_local_.insert(reduced_local_.end(), red.begin(), red.end());
  if (abort_request) abortAll(*abort_request);
  if (stop && !stopping_) {
    stopping_ = true;
    if (active_ || !pending_.empty()) abortAll(aborted("the backend was shut down"));
  }
  return !in.empty() || !red.empty();
}

bool P2pBackend::startNext() {
  bool started = false;
  while (!active_ && !pending_.empty()) {
    started = true;
    Queued q = std::move(pending_.front());
    pending_.pop_front();
    Status st = !broken_.isOk() ? broken_ : q.invalid;
    if (!st.isOk()) {
      if (q.done) q.done(st);
      continue;
    }
    scratch_.reset();
    active_ = std::make_unique<Active>();
    active_->seq = q.seq;
    active_->what = q.coll->describe() + " #" + std::to_string(q.seq);
    active_->coll = std::move(q.coll);
    active_->done = std::move(q.done);
    active_->started = active_->last_progress = Clock::now();
    log_->trace("{}start {}", prefix(), active_->what);
    active_->coll->start(*this);
  }
  return started;
}

bool P2pBackend::processEvents() {
  bool any = false;
  while (!completed_.empty() || !reduced_local_.empty()) {
    any = true;
    std::vector<P2pRequest*> comps;
    comps.swap(completed_);
    for (P2pRequest* r : comps) handleCompletion(r);
    std::vector<ReduceDone> reds;
    reds.swap(reduced_local_);
    for (const auto& d : reds) handleReduced(d);
  }
  return any;
}

void P2pBackend::handleCompletion(P2pRequest* raw) {
  auto it = requests_.find(raw);
  if (it == requests_.end()) return;
  std::unique_ptr<P2pRequest> req = std::move(it->second);
  requests_.erase(it);
  if (!active_ || active_->seq != req->seq) return;  // abandoned after a failure
  --active_->outstanding;
  active_->last_progress = Clock::now();
  if (!active_->failed.isOk()) return;
  if (req->result != P2pRequest::Result::kOk) {
    failActive(transportError(*req));
    return;
  }
  if (req->is_recv && req->received != req->expected) {
    failActive(invalidArgument(
        "rank " + std::to_string(req->peer) + " sent " + std::to_string(req->received) +
        " bytes where rank " + std::to_string(opts_.rank) + " expected " +
        std::to_string(req->expected) + " (step " + std::to_string(req->step) + ", chunk " +
        std::to_string(req->chunk) + ") in " + active_->what +
        ": the ranks disagree on the collective's arguments"));
    return;
  }
  if (req->is_recv) {
    active_->coll->onReceived(req->step, req->chunk);
  } else {
    active_->coll->onSent(req->step, req->chunk);
  }
}

void P2pBackend::handleReduced(const ReduceDone& d) {
  if (!active_ || active_->seq != d.seq) return;
  --active_->reduces;
  active_->last_progress = Clock::now();
  if (!active_->failed.isOk()) return;
  active_->coll->onReduced(d.step, d.chunk);
}

Status P2pBackend::transportError(const P2pRequest& r) const {
  const std::string where = std::string(r.is_recv ? "receiving from" : "sending to") + " rank " +
                            std::to_string(r.peer) + " in " + active_->what;
  if (r.result == P2pRequest::Result::kTruncated) {
    return invalidArgument("rank " + std::to_string(r.peer) + " sent more than the " +
                           std::to_string(r.expected) + " bytes expected while " + where +
                           ": the ranks disagree on the collective's arguments");
  }
  return peerFailure("agent rank " + std::to_string(r.peer) +
                     " unreachable: " + r.error + " (" + where + ")");
}

// A failed peer fails the running collective only if the collective still
// waits for it: messages it delivered before it went away still count.
void P2pBackend::checkPeers() {
  if (!active_ || !active_->failed.isOk()) {
    peer_grace_until_.reset();
    return;
  }
  for (const auto& [raw, req] : requests_) {
    if (req->seq != active_->seq || peer_status_[req->peer].isOk()) continue;
    const auto now = Clock::now();
    if (!peer_grace_until_) peer_grace_until_ = now + kPeerGrace;
    if (now < *peer_grace_until_) return;
    peer_grace_until_.reset();
    failActive(peerFailure("agent rank " + std::to_string(req->peer) +
                           " unreachable: " + peer_status_[req->peer].message() + " (" +
                           (req->is_recv ? "receiving from" : "sending to") + " it in " +
                           active_->what + ")"));
    return;
  }
  peer_grace_until_.reset();  // nothing waits for a failed peer (any more)
}

void P2pBackend::checkDeadline() {
  if (!active_ || !active_->failed.isOk()) return;
  const auto now = Clock::now();
  if (now - active_->last_progress < opts_.timeout) return;
  std::set<int> recv_from, send_to;
  for (const auto& [raw, req] : requests_) {
    if (req->seq != active_->seq) continue;
    (req->is_recv ? recv_from : send_to).insert(req->peer);
  }
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - active_->last_progress).count();
  if (recv_from.empty() && send_to.empty()) {
    failActive(internalError("no progress for " + std::to_string(ms) + " ms in " + active_->what +
                             " and no message outstanding (local reduction stuck?)"));
    return;
  }
  const bool receiving = !recv_from.empty();
  const auto& peers = receiving ? recv_from : send_to;
  std::string others;
  for (int p : peers) {
    if (p == *peers.begin()) continue;
    others += (others.empty() ? "" : ", ") + std::to_string(p);
  }
  failActive(
      peerFailure("agent rank " + std::to_string(*peers.begin()) + " unreachable: " +
                  (receiving ? "nothing received from it" : "nothing sent to it was taken") +
                  " for " + std::to_string(ms) + " ms in " + active_->what +
                  (others.empty() ? "" : " (also waiting for ranks " + others + ")")));
}

bool P2pBackend::finishActiveIfDone() {
  if (!active_) return false;
  if (!active_->failed.isOk()) {
    if (active_->outstanding > 0 || active_->reduces > 0) {
      if (Clock::now() < active_->drain_deadline) return false;
      log_->error(
          "{}{}: {} messages and {} reductions still hold its buffers {} ms after "
          "the failure; reporting it anyway",
          prefix(), active_->what, active_->outstanding, active_->reduces,
          std::chrono::duration_cast<std::chrono::milliseconds>(kDrainGrace).count());
    }
    finishActive(active_->failed);
    return true;
  }
  if (active_->outstanding > 0 || active_->reduces > 0) return false;
  if (!active_->coll->finished()) {
    failActive(internalError(active_->what + " stalled with nothing outstanding (a bug)"));
    return false;
  }
  finishActive(okStatus());
  return true;
}

void P2pBackend::finishActive(Status st) {
  peer_grace_until_.reset();
  log_->trace(
      "{}done {} in {} us: {}", prefix(), active_->what,
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - active_->started)
          .count(),
      st.toString());
  Done done = std::move(active_->done);
  active_.reset();
  if (done) done(std::move(st));
}

void P2pBackend::failActive(Status st) {
  if (!active_ || !active_->failed.isOk()) return;
  log_->warn("{}{} failed: {}", prefix(), active_->what, st.toString());
  active_->failed = st;
  active_->drain_deadline = Clock::now() + kDrainGrace;
  if (broken_.isOk()) broken_ = st;
  transport_->closeTransportForcefully();
}

void P2pBackend::abortAll(Status why) {
  if (broken_.isOk()) broken_ = why;
  if (active_ && active_->failed.isOk()) {
    failActive(std::move(why));
  } else {
    transport_->closeTransportForcefully();
  }
}

void P2pBackend::teardown() {
  reducer_.reset();  // joins: no reduction writes after this
  bool force = !broken_.isOk();
  for (const auto& st : peer_status_) force |= !st.isOk();
  transport_->teardownTransport(
      force, Clock::now() + std::min<Clock::duration>(opts_.timeout, kMaxCloseWait));
  requests_.clear();
  completed_.clear();
  // Collectives that raced with the shutdown still get their answer.
  std::deque<Queued> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& q : incoming_) pending_.push_back(std::move(q));
    incoming_.clear();
  }
  left.swap(pending_);
  for (auto& q : left) {
    if (q.done) q.done(broken_.isOk() ? aborted("the backend was shut down") : broken_);
  }
}


P2pRequest* P2pBackend::newRequest(bool is_recv, int peer, uint32_t step, uint32_t chunk, size_t bytes) {
  auto req = std::make_unique<P2pRequest>();
  req->transport = transport_.get();
  req->seq = active_->seq;
  req->is_recv = is_recv;
  req->peer = peer;
  req->step = step;
  req->chunk = chunk;
  req->expected = bytes;
  P2pRequest* raw = req.get();
  requests_.emplace(raw, std::move(req));
  ++active_->outstanding;
  return raw;
}

bool P2pBackend::badTag(uint32_t step, uint32_t chunk) {
  if (step <= coll::kMaxStep && chunk <= coll::kMaxChunk) return false;
  failActive(internalError("message step/chunk out of range in " + active_->what));
  return true;
}

void P2pBackend::send(int peer, uint32_t step, uint32_t chunk, const void* buf, size_t bytes) {
  if (!active_ || badTag(step, chunk)) return;
  transport_->postSend(newRequest(false, peer, step, chunk, bytes), buf, bytes);
}

void P2pBackend::recv(int peer, uint32_t step, uint32_t chunk, void* buf, size_t bytes) {
  if (!active_ || badTag(step, chunk)) return;
  P2pRequest* r = newRequest(true, peer, step, chunk, bytes);
  transport_->postRecv(r, buf, bytes);
  if (r->result == P2pRequest::Result::kPending && peerFailed(peer)) peer_check_needed_ = true;
}

void P2pBackend::reduce(uint32_t step, uint32_t chunk, DataType dtype, ReduceOp op, const void* a,
            const void* b, void* dst, size_t count) {
  if (!active_) return;
  if (op == ReduceOp::kAverage) op = ReduceOp::kSum;  // the agent divides
  ++active_->reduces;
  const uint64_t seq = active_->seq;
  if (!reducer_ || count * dataTypeSize(dtype) < kInlineReduceBytes) {
    const void* srcs[2] = {a, b};
    void* dsts[1] = {dst};
    reduceBlocks(dtype, op, srcs, 2, dsts, 1, count, 1.0, 1.0);
    reduced_local_.push_back({seq, step, chunk});
    return;
  }
  reducer_->submit([this, seq, step, chunk, dtype, op, a, b, dst, count] {
    const void* srcs[2] = {a, b};
    void* dsts[1] = {dst};
    reduceBlocks(dtype, op, srcs, 2, dsts, 1, count, 1.0, 1.0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      reduced_remote_.push_back({seq, step, chunk});
    }
    wake();
  });
}

}  // namespace kolo
