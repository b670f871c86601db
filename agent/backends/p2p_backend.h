// P2pBackend: a Backend built from tagged point-to-point messages. It holds
// everything the ucx and tcp backends share: argument checks, the queue of
// collectives (run one at a time in posting order), the progress thread and
// its loop, reductions (inline or on a helper thread), deadlines, peer
// failures and shutdown. The algorithms are in collective.h. It owns a
// P2pTransport (tcp/, ucx/; gloo's transport::Pair, tensorpipe's
// connection), which only moves messages: it connects to the peers, posts
// sends and receives, drives its I/O when asked and reports completions to
// its P2pHost (the backend).
//
// Progress thread loop: take new collectives and finished reductions, drive
// the transport until it has nothing more, hand completions to the running
// collective, check peers and deadlines; when nothing moved (after
// backend-spin-us of polling while a collective runs), arm the transport and
// sleep in epoll on the transport's fd and our wake eventfd (bounded, so a
// missed wake-up costs at most 100 ms while a collective runs).
//
// A message is named by (seq, sender rank, step, chunk), 16 bits each, where
// seq numbers the collectives (identical on every rank because all ranks post
// the same collectives in the same order).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "agent/backends/backend.h"
#include "agent/backends/collective.h"
#include "common/fd.h"
#include "common/log.h"

namespace kolo {

class KvStore;
class WorkerPool;

// Ranks, steps and chunks travel in 16 bits (the ring has 2N - 2 steps).
constexpr int kP2pMaxRanks = 1 << 15;

class P2pTransport;

// One posted message. The backend owns it; the transport fills the result.
struct P2pRequest {
  enum class Result { kPending, kOk, kTruncated, kError };
  uint64_t seq = 0;
  bool is_recv = false;
  int peer = 0;
  uint32_t step = 0;
  uint32_t chunk = 0;
  size_t expected = 0;  // bytes to send, or the bytes a receive must get
  Result result = Result::kPending;
  size_t received = 0;  // a completed receive: the bytes the peer sent
  std::string error;    // kError: the transport's words ("Connection reset by peer")
  void* handle = nullptr;  // the transport's own, while in flight
  P2pTransport* transport = nullptr;  // the transport it was posted on
};

// What a transport may ask of the backend that owns it (progress thread).
class P2pHost {
 public:
  // The request is done with (sent, received, or failed).
  virtual void completed(P2pRequest* r) = 0;
  // A peer went away (the transport saw its connection end).
  virtual void peerGone(int peer, const std::string& why) = 0;
  // Bytes of a message moved without the message completing yet: counts as
  // progress for the running collective's deadline (a large message on a
  // slow link is not a silent peer).
  virtual void noteProgress() = 0;
  virtual bool peerFailed(int peer) const = 0;
  virtual void forEachRequest(const std::function<void(P2pRequest&)>& fn) = 0;
  // The job's rank, size, key prefix and timeout (BackendOptions).
  virtual const BackendOptions& opts() const = 0;
  virtual const std::shared_ptr<spdlog::logger>& log() const = 0;

 protected:
  ~P2pHost() = default;
};

// A transport: moves tagged messages between the ranks, on the owning
// backend's progress thread only. Each transport has its own options
// struct, given at construction with the host.
class P2pTransport {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~P2pTransport() = default;
  virtual std::string_view name() const = 0;

  // Publishes this rank's address in `kv`, reads the peers' and connects, by
  // `deadline`: PeerFailure naming a peer that does not show up, Unavailable
  // "not viable: ..." when the transport cannot run here.
  virtual Status connectTransport(KvStore& kv, Clock::time_point deadline) = 0;
  // Readable when the transport has something to do; polled with the wake fd.
  virtual int transportFd() const = 0;
  // Moves whatever can move without blocking; true when anything did.
  virtual bool progressTransport() = 0;
  // Called before sleeping on transportFd(): false when the transport has
  // work after all (sleep would miss it). It may shorten the sleep
  // (`wait_ms`) when it must act by a time of its own.
  virtual bool armTransport(int& wait_ms) = 0;
  // Posts a message; the transport calls completed(r) when the buffer is
  // done with (sent, or received with r->received set), or failed.
  virtual void postSend(P2pRequest* r, const void* buf, size_t bytes) = 0;
  virtual void postRecv(P2pRequest* r, void* buf, size_t bytes) = 0;
  // The generation is over: stop touching every posted buffer (complete or
  // cancel their requests) and drop the connections, so that peers see us
  // go and fail fast instead of waiting for their deadline.
  virtual void closeTransportForcefully() = 0;
  // The backend is being destroyed: close the connections (forcefully when
  // `force`: a peer failed or the backend broke), within `deadline`, and
  // release everything; no request is completed afterwards.
  virtual void teardownTransport(bool force, Clock::time_point deadline) = 0;

 protected:
  explicit P2pTransport(P2pHost& host) : host_(host) {}
  void completed(P2pRequest* r) { host_.completed(r); }
  void peerGone(int peer, const std::string& why) { host_.peerGone(peer, why); }
  void noteProgress() { host_.noteProgress(); }
  bool peerFailed(int peer) const { return host_.peerFailed(peer); }
  void forEachRequest(const std::function<void(P2pRequest&)>& fn) { host_.forEachRequest(fn); }
  const BackendOptions& opts() const { return host_.opts(); }
  const std::shared_ptr<spdlog::logger>& log() const { return host_.log(); }
  std::string prefix() const { return opts().name.empty() ? "" : opts().name + ": "; }
  std::string key(int rank) const { return opts().key_prefix + "/" + std::to_string(rank); }

 private:
  P2pHost& host_;
};

using MakeP2pTransport = std::function<std::unique_ptr<P2pTransport>(P2pHost& host)>;

// Checks the options (and the rank limit), makes a P2pBackend over the
// transport `make` builds and starts it: the factories' common body.
StatusOr<std::unique_ptr<Backend>> makeP2pBackend(const BackendOptions& options, KvStore& kv,
                                                  const std::string& logger, MakeP2pTransport make);

class P2pBackend final : public Backend, private coll::CollectiveContext, private P2pHost {
 public:
  using Clock = std::chrono::steady_clock;

  P2pBackend(BackendOptions options, const std::string& logger, MakeP2pTransport make);
  // Stops the progress thread, which tears the transport down, then drops it.
  ~P2pBackend() override;

  // Spawns the progress thread, which connects the transport and runs one
  // barrier; returns its verdict.
  Status start(KvStore& kv);

  std::string_view name() const override { return transport_->name(); }

  // --- Backend (thread-safe) -----------------------------------------------
  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  void setSmallMessageBytes(size_t bytes) override { small_message_bytes_ = bytes; }
  void allreduceOutOfPlace(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                           Done done) override;
  void broadcast(void* buf, size_t bytes, int root, Done done) override;
  void allgatherv(const void* in, size_t in_bytes, void* out, std::vector<size_t> recv_bytes,
                  Done done) override;
  void reducescatter(const void* in, void* out, std::vector<size_t> recv_counts, DataType dtype,
                     ReduceOp op, Done done) override;
  void alltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
                 std::vector<size_t> recv_bytes, Done done) override;
  void barrier(Done done) override;
  void abort(Status why) override;

 private:
  void stop();

  // --- P2pHost (progress thread) -------------------------------------------
  void completed(P2pRequest* r) override { completed_.push_back(r); }
  void peerGone(int peer, const std::string& why) override;
  void noteProgress() override;
  bool peerFailed(int peer) const override { return !peer_status_[peer].isOk(); }
  void forEachRequest(const std::function<void(P2pRequest&)>& fn) override;
  const BackendOptions& opts() const override { return opts_; }
  const std::shared_ptr<spdlog::logger>& log() const override { return log_; }
  std::string prefix() const { return opts_.name.empty() ? "" : opts_.name + ": "; }

  struct Queued;
  struct Active;
  struct ReduceDone {
    uint64_t seq;
    uint32_t step;
    uint32_t chunk;
  };
  class ScratchArena {
   public:
    std::byte* get(size_t bytes);
    void reset() { next_ = 0; }

   private:
    std::vector<std::pair<std::unique_ptr<std::byte[]>, size_t>> bufs_;
    size_t next_ = 0;
  };

  void submit(StatusOr<std::unique_ptr<coll::Collective>> coll, Done done);
  void wake();
  void threadMain(KvStore& kv, std::promise<Status>& created);
  Status connect(KvStore& kv);
  template <typename Until>
  void runLoop(Until until);
  int waitMs() const;
  bool takeIncoming();
  bool startNext();
  bool processEvents();
  void handleCompletion(P2pRequest* raw);
  void handleReduced(const ReduceDone& d);
  Status transportError(const P2pRequest& r) const;
  void checkPeers();
  void checkDeadline();
  bool finishActiveIfDone();
  void finishActive(Status st);
  void failActive(Status st);
  void abortAll(Status why);
  void teardown();

  // --- CollectiveContext ----------------------------------------------------
  const BackendOptions& options() const override { return opts_; }
  P2pRequest* newRequest(bool is_recv, int peer, uint32_t step, uint32_t chunk, size_t bytes);
  bool badTag(uint32_t step, uint32_t chunk);
  void send(int peer, uint32_t step, uint32_t chunk, const void* buf, size_t bytes) override;
  void recv(int peer, uint32_t step, uint32_t chunk, void* buf, size_t bytes) override;
  void reduce(uint32_t step, uint32_t chunk, DataType dtype, ReduceOp op, const void* a,
              const void* b, void* dst, size_t count) override;
  std::byte* scratch(size_t bytes) override { return scratch_.get(bytes); }
  void fail(Status status) override { failActive(std::move(status)); }

  // --- state ----------------------------------------------------------------
  const BackendOptions opts_;
  // Read and written only on the posting thread (see Backend::setSmallMessageBytes).
  size_t small_message_bytes_ = opts_.small_message_bytes;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<P2pTransport> transport_;
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
  UniqueFd epoll_fd_;
  std::vector<Status> peer_status_;  // not ok once the transport reported the peer gone
  bool peer_check_needed_ = false;
  std::optional<Clock::time_point> peer_grace_until_;
  std::optional<Clock::time_point> spin_since_;  // polling since, before sleeping (runLoop)
  Status broken_;  // the first failure; every later collective fails with it
  bool stopping_ = false;
  std::deque<Queued> pending_;
  std::unique_ptr<Active> active_;
  std::unordered_map<P2pRequest*, std::unique_ptr<P2pRequest>> requests_;
  std::vector<P2pRequest*> completed_;
  std::vector<ReduceDone> reduced_local_;
  ScratchArena scratch_;
  std::unique_ptr<WorkerPool> reducer_;
};

}  // namespace kolo
