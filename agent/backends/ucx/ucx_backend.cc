// The UCX backend: one UCP context, one worker and one endpoint per peer,
// all driven by one progress thread that runs the queued collectives in order.
//
// Progress thread loop: take new collectives and finished reductions, drive
// ucp_worker_progress until it has nothing more, hand completions to the
// running collective, check peers and deadlines; when nothing moved, arm the
// worker and sleep in epoll on the worker's event fd and our wake eventfd
// (bounded, so a missed wake-up costs at most 100 ms while a collective runs).
//
// Messages are UCX tagged messages; the 64-bit tag is
//   seq (16) | sender rank (16) | step (16) | chunk (16)
// where seq numbers the collectives (identical on every rank because all
// ranks post the same collectives in the same order).
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <unordered_map>

#include "agent/backends/ucx/collective.h"
#include "agent/backends/ucx/factory.h"
#include "common/fd.h"
#include "common/log.h"
#include "common/reduce.h"
#include "common/worker_pool.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
using ucx::Collective;
using ucx::CollectiveContext;

constexpr int kMaxRanks = 1 << 15;  // steps of the ring (2N - 2) must fit in 16 bits
// Chunks below this are reduced inline on the progress thread: handing them
// to the helper thread would cost more than the reduction.
constexpr size_t kInlineReduceBytes = 32 * 1024;
// After a failure, how long to wait for UCX to hand back the buffers of the
// failed collective (cancelled requests) before reporting it anyway.
constexpr auto kDrainGrace = std::chrono::seconds(2);
constexpr auto kMaxCloseWait = std::chrono::seconds(5);
// A peer reported gone fails the running collective only if the collective
// still waits for it this long after: what the peer delivered before it left
// (a graceful close flushes) is matched first.
constexpr auto kPeerGrace = std::chrono::milliseconds(50);

ucp_tag_t makeTag(uint64_t seq, int src, uint32_t step, uint32_t chunk) {
  return ((seq & 0xffff) << 48) | ((static_cast<uint64_t>(src) & 0xffff) << 32) |
         ((static_cast<uint64_t>(step) & 0xffff) << 16) | (chunk & 0xffff);
}
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

std::string ucsText(ucs_status_t s) { return ucs_status_string(s); }

Status notViable(const std::string& what, ucs_status_t s) {
  return unavailable("not viable: " + what + ": " + ucsText(s));
}

// Backend-owned buffers handed to collectives; reused from one collective to
// the next so that big receive buffers are not re-faulted every time.
class ScratchArena {
 public:
  std::byte* get(size_t bytes) {
    if (next_ == bufs_.size()) bufs_.push_back({nullptr, 0});
    auto& b = bufs_[next_++];
    if (b.second < bytes) {
      b.first.reset(new std::byte[std::max<size_t>(bytes, 1)]);
      b.second = bytes;
    }
    return b.first.get();
  }
  void reset() { next_ = 0; }

 private:
  std::vector<std::pair<std::unique_ptr<std::byte[]>, size_t>> bufs_;
  size_t next_ = 0;
};

class UcxBackend;

// One posted UCX request; it is the request's user_data.
struct Request {
  UcxBackend* owner = nullptr;
  uint64_t seq = 0;
  bool is_recv = false;
  int peer = 0;
  uint32_t step = 0;
  uint32_t chunk = 0;
  size_t expected = 0;
  void* ucx = nullptr;  // the UCX handle while in flight
  ucs_status_t status = UCS_INPROGRESS;
  ucp_tag_recv_info_t info{};
};

struct PeerArg {
  UcxBackend* owner;
  int rank;
};

struct ReduceDone {
  uint64_t seq;
  uint32_t step;
  uint32_t chunk;
};

class UcxBackend final : public Backend, private CollectiveContext {
 public:
  explicit UcxBackend(BackendOptions options)
      : opts_(std::move(options)),
        log_(log::get("agent.backend.ucx")),
        wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  ~UcxBackend() override {
    if (std::this_thread::get_id() == thread_.get_id()) {
      log_->critical("a UCX backend was destroyed from its own completion callback");
      std::abort();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
  }

  // Spawns the progress thread, which connects; returns its verdict.
  Status start(KvStore& kv) {
    if (!wake_fd_.valid()) return errnoStatus("eventfd", errno);
    std::promise<Status> created;
    auto result = created.get_future();
    thread_ = std::thread([this, &kv, &created] { threadMain(kv, created); });
    Status st = result.get();
    if (!st.isOk()) thread_.join();
    return st;
  }

  // --- Backend -------------------------------------------------------------

  std::string_view name() const override { return "ucx"; }
  int rank() const override { return opts_.rank; }
  void setSmallMessageBytes(size_t bytes) override { small_message_bytes_ = bytes; }
  int size() const override { return opts_.size; }

  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op, Done done) override {
    if (!isValidDataType(static_cast<int>(dtype)) || !isValidReduceOp(static_cast<int>(op))) {
      return submit(invalidArgument("allreduce: invalid dtype or op"), std::move(done));
    }
    if (count > 0 && buf == nullptr) {
      return submit(invalidArgument("allreduce: null buffer"), std::move(done));
    }
    const size_t bytes = count * dataTypeSize(dtype);
    if (opts_.size == 1 || count == 0) {
      return submit(ucx::makeLocalCollective("allreduce (local)", nullptr), std::move(done));
    }
    if (bytes < small_message_bytes_) {
      return submit(ucx::makeRecursiveDoublingAllreduce(buf, count, dtype, op), std::move(done));
    }
    submit(ucx::makeRingAllreduce(buf, count, dtype, op), std::move(done));
  }

  void broadcast(void* buf, size_t bytes, int root, Done done) override {
    if (root < 0 || root >= opts_.size) {
      return submit(invalidArgument("broadcast: root " + std::to_string(root) +
                                    " out of range [0, " + std::to_string(opts_.size) + ")"),
                    std::move(done));
    }
    if (bytes > 0 && buf == nullptr) {
      return submit(invalidArgument("broadcast: null buffer"), std::move(done));
    }
    if (opts_.size == 1 || bytes == 0) {
      return submit(ucx::makeLocalCollective("broadcast (local)", nullptr), std::move(done));
    }
    if (bytes < small_message_bytes_) {
      return submit(ucx::makeTreeBroadcast(buf, bytes, root), std::move(done));
    }
    submit(ucx::makeChainBroadcast(buf, bytes, root), std::move(done));
  }

  void allgatherv(const void* in, size_t in_bytes, void* out, std::vector<size_t> recv_bytes,
                  Done done) override {
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
      return submit(ucx::makeLocalCollective("allgatherv (local)",
                                             [in, out, in_bytes] {
                                               if (in_bytes > 0 && in != out)
                                                 std::memmove(out, in, in_bytes);
                                             }),
                    std::move(done));
    }
    submit(ucx::makeRingAllgatherv(in, out, std::move(recv_bytes)), std::move(done));
  }

  void reducescatter(const void* in, void* out, std::vector<size_t> recv_counts, DataType dtype,
                     ReduceOp op, Done done) override {
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
      return submit(ucx::makeLocalCollective("reducescatter (local)",
                                             [in_b, out_b, own_off, own_bytes, esize] {
                                               const std::byte* src = in_b + own_off * esize;
                                               if (own_bytes > 0 && src != out_b)
                                                 std::memmove(out_b, src, own_bytes);
                                             }),
                    std::move(done));
    }
    if (total * esize < small_message_bytes_) {
      return submit(ucx::makeSmallReducescatter(in, out, std::move(recv_counts), dtype, op),
                    std::move(done));
    }
    submit(ucx::makeRingReducescatter(in, out, std::move(recv_counts), dtype, op), std::move(done));
  }

  void alltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
                 std::vector<size_t> recv_bytes, Done done) override {
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
    submit(ucx::makeAlltoallv(in, std::move(send_bytes), out, std::move(recv_bytes)),
           std::move(done));
  }

  void barrier(Done done) override {
    if (opts_.size == 1) {
      return submit(ucx::makeLocalCollective("barrier (local)", nullptr), std::move(done));
    }
    submit(ucx::makeDisseminationBarrier(), std::move(done));
  }

  void abort(Status why) override {
    if (why.isOk()) why = aborted("backend aborted");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!abort_request_) abort_request_ = std::move(why);
    }
    wake();
  }

 private:
  struct Queued {
    uint64_t seq = 0;
    std::unique_ptr<Collective> coll;
    Status invalid;
    Done done;
  };

  struct Active {
    uint64_t seq = 0;
    std::unique_ptr<Collective> coll;
    Done done;
    std::string what;
    Status failed;
    Clock::time_point started;
    Clock::time_point last_progress;
    Clock::time_point drain_deadline;
    int outstanding = 0;  // UCX requests posted and not yet completed
    int reduces = 0;      // reductions not yet completed
  };

  // --- submission (any thread) ---------------------------------------------

  void submit(StatusOr<std::unique_ptr<Collective>> coll, Done done) {
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

  void wake() {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
    (void)n;  // EAGAIN means the counter is already non-zero: a wake-up is pending anyway
  }

  // --- progress thread -----------------------------------------------------

  void threadMain(KvStore& kv, std::promise<Status>& created) {
    log::setThreadName("kolo-ucx-" + std::to_string(opts_.rank));
    Status st = connect(kv);
    if (st.isOk()) {
      // One barrier proves every peer reachable both ways before creation returns.
      bool done = false;
      Status barrier_status;
      if (opts_.size > 1) {
        submit(ucx::makeDisseminationBarrier(), [&](Status s) {
          barrier_status = std::move(s);
          done = true;
        });
      } else {
        submit(ucx::makeLocalCollective("barrier (local)", nullptr),
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

  std::string prefix() const { return opts_.name.empty() ? "" : opts_.name + ": "; }
  std::string key(int rank) const { return opts_.key_prefix + "/" + std::to_string(rank); }

  Status connect(KvStore& kv) {
    const auto deadline = Clock::now() + opts_.timeout;
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return notViable("reading the UCX configuration", s);
    // TCP segment sizes (BackendOptions): a UCX_ variable the user set wins.
    // UCP keeps transport-level keys it does not know and applies them to
    // each transport's configuration (only tcp has these two); it warns
    // when no transport took them, so they are left out when UCX_TLS
    // selects transports without tcp.
    const char* tls = std::getenv("UCX_TLS");
    const std::string tls_list = tls == nullptr ? "" : tls;
    const bool tcp_possible = tls_list.empty() || tls_list == "all" || tls_list[0] == '^' ||
                              tls_list.find("tcp") != std::string::npos;
    for (auto [key, bytes] : {std::pair<const char*, size_t>{"TX_SEG_SIZE", opts_.ucx_tcp_tx_seg_bytes},
                              std::pair<const char*, size_t>{"RX_SEG_SIZE", opts_.ucx_tcp_rx_seg_bytes}}) {
      if (!tcp_possible || bytes == 0 || std::getenv((std::string("UCX_TCP_") + key).c_str()) != nullptr) continue;
      s = ucp_config_modify(config, key, std::to_string(bytes).c_str());
      if (s != UCS_OK) log_->warn("{}cannot set UCX {}={}: {}", prefix(), key, bytes, ucs_status_string(s));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.name = "kolo-agent";
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) {
      context_ = nullptr;
      return notViable("ucp_init", s);
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) {
      worker_ = nullptr;
      return notViable("ucp_worker_create", s);
    }
    s = ucp_worker_get_efd(worker_, &worker_efd_);
    if (s != UCS_OK) return notViable("ucp_worker_get_efd (no transport with wake-up support)", s);
    epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_fd_.valid()) return errnoStatus("epoll_create1", errno);
    for (int fd : {worker_efd_, wake_fd_.get()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        return errnoStatus("epoll_ctl", errno);
      }
    }

    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    s = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (s != UCS_OK) return notViable("ucp_worker_get_address", s);
    std::string blob(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);
    RETURN_IF_ERROR(kv.put(key(opts_.rank), blob).withContext("publishing the UCX address"));

    const int n = opts_.size;
    eps_.assign(n, nullptr);
    peer_status_.assign(n, okStatus());
    for (int p = 0; p < n; ++p) peer_args_.push_back(std::make_unique<PeerArg>(PeerArg{this, p}));
    for (int p = 0; p < n; ++p) {
      if (p == opts_.rank) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      auto remote = kv.get(key(p), std::max(left, std::chrono::milliseconds(1)));
      if (!remote.isOk()) {
        return peerFailure("agent rank " + std::to_string(p) + " unreachable: its UCX address '" +
                           key(p) + "' did not appear: " + remote.status().message());
      }
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(remote->data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxBackend::onEndpointError;
      ep.err_handler.arg = peer_args_[p].get();
      s = ucp_ep_create(worker_, &ep, &eps_[p]);
      if (s != UCS_OK) {
        eps_[p] = nullptr;
        return notViable("no UCX transport reaches agent rank " + std::to_string(p), s);
      }
    }
    if (opts_.reduce_thread) {
      reducer_ = std::make_unique<WorkerPool>("kolo-ucxred" + std::to_string(opts_.rank), 1);
    }
    return okStatus();
  }

  template <typename Until>
  void runLoop(Until until) {
    epoll_event evs[4];
    for (;;) {
      // A peer's failure (or a receive posted from a failed peer) is judged
      // only after more progress (see kPeerGrace).
      const bool check_peers = peer_check_needed_ || peer_grace_until_.has_value();
      peer_check_needed_ = false;
      bool moved = takeIncoming();
      moved |= startNext();
      while (ucp_worker_progress(worker_) != 0) moved = true;
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
      ucs_status_t s = ucp_worker_arm(worker_);
      if (s == UCS_ERR_BUSY) continue;
      if (s != UCS_OK) log_->warn("{}ucp_worker_arm: {}", prefix(), ucsText(s));
      int n = ::epoll_wait(epoll_fd_.get(), evs, 4, waitMs());
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.fd == wake_fd_.get()) {
          uint64_t v;
          while (::read(wake_fd_.get(), &v, sizeof v) > 0) {
          }
        }
      }
    }
  }

  int waitMs() const {
    if (!active_) return 1000;
    auto deadline =
        active_->failed.isOk() ? active_->last_progress + opts_.timeout : active_->drain_deadline;
    if (peer_grace_until_) deadline = std::min(deadline, *peer_grace_until_);
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 100));
  }

  bool takeIncoming() {
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

  bool startNext() {
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
      active_.emplace();
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

  bool processEvents() {
    bool any = false;
    while (!completed_.empty() || !reduced_local_.empty()) {
      any = true;
      std::vector<Request*> comps;
      comps.swap(completed_);
      for (Request* r : comps) handleCompletion(r);
      std::vector<ReduceDone> reds;
      reds.swap(reduced_local_);
      for (const auto& d : reds) handleReduced(d);
    }
    return any;
  }

  void handleCompletion(Request* raw) {
    auto it = requests_.find(raw);
    if (it == requests_.end()) return;
    std::unique_ptr<Request> req = std::move(it->second);
    requests_.erase(it);
    if (!active_ || active_->seq != req->seq) return;  // abandoned after a failure
    --active_->outstanding;
    active_->last_progress = Clock::now();
    if (!active_->failed.isOk()) return;
    if (req->status != UCS_OK) {
      failActive(transportError(*req));
      return;
    }
    if (req->is_recv && req->info.length != req->expected) {
      failActive(invalidArgument(
          "rank " + std::to_string(req->peer) + " sent " + std::to_string(req->info.length) +
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

  void handleReduced(const ReduceDone& d) {
    if (!active_ || active_->seq != d.seq) return;
    --active_->reduces;
    active_->last_progress = Clock::now();
    if (!active_->failed.isOk()) return;
    active_->coll->onReduced(d.step, d.chunk);
  }

  Status transportError(const Request& r) const {
    const std::string where = std::string(r.is_recv ? "receiving from" : "sending to") + " rank " +
                              std::to_string(r.peer) + " in " + active_->what;
    if (r.status == UCS_ERR_MESSAGE_TRUNCATED) {
      return invalidArgument("rank " + std::to_string(r.peer) + " sent more than the " +
                             std::to_string(r.expected) + " bytes expected while " + where +
                             ": the ranks disagree on the collective's arguments");
    }
    return peerFailure("agent rank " + std::to_string(r.peer) +
                       " unreachable: " + ucsText(r.status) + " (" + where + ")");
  }

  // A failed peer fails the running collective only if the collective still
  // waits for it: messages it delivered before it went away still count.
  void checkPeers() {
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

  void checkDeadline() {
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

  bool finishActiveIfDone() {
    if (!active_) return false;
    if (!active_->failed.isOk()) {
      if (active_->outstanding > 0 || active_->reduces > 0) {
        if (Clock::now() < active_->drain_deadline) return false;
        log_->error(
            "{}{}: {} UCX requests and {} reductions still hold its buffers {} ms after "
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

  void finishActive(Status st) {
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

  void failActive(Status st) {
    if (!active_ || !active_->failed.isOk()) return;
    log_->warn("{}{} failed: {}", prefix(), active_->what, st.toString());
    active_->failed = st;
    active_->drain_deadline = Clock::now() + kDrainGrace;
    if (broken_.isOk()) broken_ = st;
    closeTransportForcefully();
  }

  void abortAll(Status why) {
    if (broken_.isOk()) broken_ = why;
    if (active_ && active_->failed.isOk()) {
      failActive(std::move(why));
    } else {
      closeTransportForcefully();
    }
  }

  // The generation is over: cancel posted receives and drop every endpoint
  // (outstanding sends complete with UCS_ERR_CANCELED; peers see us go and
  // fail fast instead of waiting for their deadline).
  void closeTransportForcefully() {
    for (auto& [raw, req] : requests_) {
      if (req->is_recv && req->ucx != nullptr) ucp_request_cancel(worker_, req->ucx);
    }
    for (auto& ep : eps_) {
      if (ep == nullptr) continue;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
      ep = nullptr;
    }
  }

  void teardown() {
    reducer_.reset();  // joins: no reduction writes after this
    if (worker_ != nullptr) {
      std::vector<void*> closing;
      for (int p = 0; p < static_cast<int>(eps_.size()); ++p) {
        if (eps_[p] == nullptr) continue;
        ucp_request_param_t prm{};
        if (!peer_status_[p].isOk() || !broken_.isOk()) {
          prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
          prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        }
        ucs_status_ptr_t r = ucp_ep_close_nbx(eps_[p], &prm);
        if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
        eps_[p] = nullptr;
      }
      for (auto& [raw, req] : requests_) {
        if (req->is_recv && req->ucx != nullptr) ucp_request_cancel(worker_, req->ucx);
      }
      const auto deadline = Clock::now() + std::min<Clock::duration>(opts_.timeout, kMaxCloseWait);
      auto pending = [&] {
        return std::any_of(closing.begin(), closing.end(),
                           [](void* r) { return ucp_request_check_status(r) == UCS_INPROGRESS; });
      };
      epoll_event evs[4];
      while (pending() && Clock::now() < deadline) {
        if (ucp_worker_progress(worker_) != 0) continue;
        if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
        ::epoll_wait(epoll_fd_.get(), evs, 4, 10);
      }
      if (pending())
        log_->warn("{}closing the UCX endpoints timed out; destroying the worker", prefix());
      for (void* r : closing) ucp_request_free(r);
      ucp_worker_destroy(worker_);
      worker_ = nullptr;
    }
    requests_.clear();
    completed_.clear();
    if (context_ != nullptr) {
      ucp_cleanup(context_);
      context_ = nullptr;
    }
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

  // --- UCX callbacks (progress thread, inside ucp_worker_progress & co) ----

  static void onSendDone(void* request, ucs_status_t status, void* user_data) {
    auto* r = static_cast<Request*>(user_data);
    r->status = status;
    r->ucx = nullptr;
    r->owner->completed_.push_back(r);
    ucp_request_free(request);
  }

  static void onRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user_data) {
    auto* r = static_cast<Request*>(user_data);
    r->status = status;
    if (info != nullptr) r->info = *info;
    r->ucx = nullptr;
    r->owner->completed_.push_back(r);
    ucp_request_free(request);
  }

  static void onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* pa = static_cast<PeerArg*>(arg);
    pa->owner->onPeerError(pa->rank, status);
  }

  void onPeerError(int peer, ucs_status_t status) {
    if (!peer_status_[peer].isOk()) return;
    peer_status_[peer] = peerFailure(ucsText(status));
    // Peers leave at every teardown; it is news only while there is work.
    log_->log(active_ || !pending_.empty() ? spdlog::level::warn : spdlog::level::debug,
              "{}agent rank {} went away: {}", prefix(), peer, ucsText(status));
    if (broken_.isOk()) {
      broken_ =
          peerFailure("agent rank " + std::to_string(peer) + " unreachable: " + ucsText(status));
    }
    peer_check_needed_ = true;
  }

  // --- CollectiveContext (progress thread) ---------------------------------

  // (rank() and size() serve both Backend and CollectiveContext.)
  const BackendOptions& options() const override { return opts_; }

  Request* newRequest(bool is_recv, int peer, uint32_t step, uint32_t chunk, size_t bytes) {
    auto req = std::make_unique<Request>();
    req->owner = this;
    req->seq = active_->seq;
    req->is_recv = is_recv;
    req->peer = peer;
    req->step = step;
    req->chunk = chunk;
    req->expected = bytes;
    Request* raw = req.get();
    requests_.emplace(raw, std::move(req));
    ++active_->outstanding;
    return raw;
  }

  void track(Request* r, ucs_status_ptr_t sp) {
    if (sp == nullptr) {
      r->status = UCS_OK;
      completed_.push_back(r);
    } else if (UCS_PTR_IS_ERR(sp)) {
      r->status = UCS_PTR_STATUS(sp);
      completed_.push_back(r);
    } else if (r->status == UCS_INPROGRESS) {
      r->ucx = sp;
    }  // else the callback already ran (and freed the request) inside the call
  }

  bool badTag(uint32_t step, uint32_t chunk) {
    if (step <= ucx::kMaxStep && chunk <= ucx::kMaxChunk) return false;
    failActive(internalError("message step/chunk out of range in " + active_->what));
    return true;
  }

  void send(int peer, uint32_t step, uint32_t chunk, const void* buf, size_t bytes) override {
    if (!active_ || badTag(step, chunk)) return;
    Request* r = newRequest(false, peer, step, chunk, bytes);
    if (eps_[peer] == nullptr) {
      r->status = UCS_ERR_NOT_CONNECTED;
      completed_.push_back(r);
      return;
    }
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = &UcxBackend::onSendDone;
    prm.user_data = r;
    track(r, ucp_tag_send_nbx(eps_[peer], buf, bytes,
                              makeTag(active_->seq, opts_.rank, step, chunk), &prm));
  }

  void recv(int peer, uint32_t step, uint32_t chunk, void* buf, size_t bytes) override {
    if (!active_ || badTag(step, chunk)) return;
    Request* r = newRequest(true, peer, step, chunk, bytes);
    ucp_request_param_t prm{};
    // UCX 1.13 leaves recv_info unset when a receive completes at once from
    // the unexpected queue, so always take the callback: it carries the length.
    prm.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    prm.cb.recv = &UcxBackend::onRecvDone;
    prm.user_data = r;
    track(r, ucp_tag_recv_nbx(worker_, buf, bytes, makeTag(active_->seq, peer, step, chunk),
                              kFullMask, &prm));
    if (r->ucx != nullptr && !peer_status_[peer].isOk()) peer_check_needed_ = true;
  }

  void reduce(uint32_t step, uint32_t chunk, DataType dtype, ReduceOp op, const void* a,
              const void* b, void* dst, size_t count) override {
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

  std::byte* scratch(size_t bytes) override { return scratch_.get(bytes); }

  void fail(Status status) override { failActive(std::move(status)); }

  // --- state ---------------------------------------------------------------

  const BackendOptions opts_;
  // Read and written only on the posting thread (see Backend::setSmallMessageBytes).
  size_t small_message_bytes_ = opts_.small_message_bytes;
  std::shared_ptr<spdlog::logger> log_;
  UniqueFd wake_fd_;
  std::thread thread_;

  // Shared with other threads (mu_).
  std::mutex mu_;
  uint64_t next_seq_ = 0;
  std::vector<Queued> incoming_;
  std::vector<ReduceDone> reduced_remote_;
  std::optional<Status> abort_request_;
  bool stop_ = false;

  // Progress thread only.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1;
  UniqueFd epoll_fd_;
  std::vector<ucp_ep_h> eps_;
  std::vector<std::unique_ptr<PeerArg>> peer_args_;
  std::vector<Status> peer_status_;  // not ok once UCX reported the peer gone
  bool peer_check_needed_ = false;
  std::optional<Clock::time_point> peer_grace_until_;
  std::optional<Clock::time_point> spin_since_;  // polling since, before sleeping (runLoop)
  Status broken_;  // the first failure; every later collective fails with it
  bool stopping_ = false;
  std::deque<Queued> pending_;
  std::optional<Active> active_;
  std::unordered_map<Request*, std::unique_ptr<Request>> requests_;
  std::vector<Request*> completed_;
  std::vector<ReduceDone> reduced_local_;
  ScratchArena scratch_;
  std::unique_ptr<WorkerPool> reducer_;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> createUcxBackend(const BackendOptions& options, KvStore& kv) {
  RETURN_IF_ERROR(validateBackendOptions(options));
  if (options.size > kMaxRanks) {
    return invalidArgument("the ucx backend supports at most " + std::to_string(kMaxRanks) +
                           " agents, got " + std::to_string(options.size));
  }
  auto backend = std::make_unique<UcxBackend>(options);
  RETURN_IF_ERROR(backend->start(kv));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace kolo
