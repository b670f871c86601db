#include "agent/backends/loopback/loopback_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <tuple>

#include "agent/backends/p2p_backend.h"
#include "common/fd.h"

namespace kolo {

void LoopbackHub::attach(int rank, int wake_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_[rank] = wake_fd;
  if (!mail_[rank].empty()) wakeLocked(rank);
}

void LoopbackHub::detach(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_[rank] = -1;
  mail_[rank].clear();
}

void LoopbackHub::deliver(int dst, Message m) {
  std::lock_guard<std::mutex> lock(mu_);
  mail_[dst].push_back(std::move(m));
  wakeLocked(dst);
}

std::deque<LoopbackHub::Message> LoopbackHub::take(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(mail_[rank], {});
}

bool LoopbackHub::hasMail(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return !mail_[rank].empty();
}

void LoopbackHub::wakeLocked(int rank) const {
  if (wake_[rank] < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[rank], &one, sizeof one);
}

namespace {

class LoopbackTransport final : public P2pTransport {
 public:
  LoopbackTransport(P2pHost& host, LoopbackTransportOptions options)
      : P2pTransport(host),
        hub_(std::move(options.hub)),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  std::string_view name() const override { return "loopback"; }

  Status connectTransport(KvStore&, Clock::time_point) override {
    if (!wake_.valid()) return errnoStatus("eventfd", errno);
    if (!hub_ || hub_->size() != opts().size) {
      return invalidArgument("loopback transport: the hub must have one mailbox per rank (" +
                             std::to_string(opts().size) + ")");
    }
    hub_->attach(opts().rank, wake_.get());
    attached_ = true;
    return okStatus();
  }

  int transportFd() const override { return wake_.get(); }

  bool progressTransport() override {
    bool moved = false;
    for (P2pRequest* r : std::exchange(sent_, {})) {
      completed(r);
      moved = true;
    }
    if (!attached_) return moved;
    for (LoopbackHub::Message& m : hub_->take(opts().rank)) {
      arrived_[Key{m.seq, m.src, m.step, m.chunk}].push_back(std::move(m.data));
      moved = true;
    }
    for (auto it = posted_.begin(); it != posted_.end();) {
      auto a = arrived_.find(it->first);
      if (a == arrived_.end()) {
        ++it;
        continue;
      }
      std::vector<std::byte> data = std::move(a->second.front());
      a->second.pop_front();
      if (a->second.empty()) arrived_.erase(a);
      const Posted p = it->second;
      it = posted_.erase(it);
      p.req->received = data.size();
      if (data.size() > p.cap) {
        p.req->result = P2pRequest::Result::kTruncated;
      } else {
        if (!data.empty()) std::memcpy(p.buf, data.data(), data.size());
        p.req->result = P2pRequest::Result::kOk;
      }
      completed(p.req);
      moved = true;
    }
    return moved;
  }

  bool armTransport(int&) override {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &v, sizeof v);
    return sent_.empty() && !(attached_ && hub_->hasMail(opts().rank));
  }

  // The bytes are copied at once: the buffer is done with when this returns.
  void postSend(P2pRequest* r, const void* buf, size_t bytes) override {
    LoopbackHub::Message m{r->seq, opts().rank, r->step, r->chunk, {}};
    m.data.resize(bytes);
    if (bytes > 0) std::memcpy(m.data.data(), buf, bytes);
    hub_->deliver(r->peer, std::move(m));
    r->result = P2pRequest::Result::kOk;
    sent_.push_back(r);
  }

  void postRecv(P2pRequest* r, void* buf, size_t bytes) override {
    posted_.emplace(Key{r->seq, r->peer, r->step, r->chunk}, Posted{r, buf, bytes});
  }

  void closeTransportForcefully() override {
    for (auto& [key, p] : posted_) {
      p.req->result = P2pRequest::Result::kError;
      p.req->error = "loopback transport closed";
      completed(p.req);
    }
    posted_.clear();
    detach();
  }

  void teardownTransport(bool, Clock::time_point) override {
    posted_.clear();
    sent_.clear();
    arrived_.clear();
    detach();
  }

 private:
  using Key = std::tuple<uint64_t, int, uint32_t, uint32_t>;  // seq, source rank, step, chunk
  struct Posted {
    P2pRequest* req;
    void* buf;
    size_t cap;
  };

  void detach() {
    if (attached_) hub_->detach(opts().rank);
    attached_ = false;
  }

  std::shared_ptr<LoopbackHub> hub_;
  UniqueFd wake_;
  bool attached_ = false;
  std::vector<P2pRequest*> sent_;
  std::multimap<Key, Posted> posted_;
  std::map<Key, std::deque<std::vector<std::byte>>> arrived_;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> createLoopbackBackend(const BackendOptions& options, KvStore& kv,
                                                         LoopbackTransportOptions transport) {
  return makeP2pBackend(options, kv, "agent.backend.loopback", [transport](P2pHost& host) {
    return std::make_unique<LoopbackTransport>(host, transport);
  });
}

}  // namespace kolo
