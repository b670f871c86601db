#include "agent/backends/collective.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <utility>

namespace kolo::coll {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// memmove for a block that may be empty: an empty block's pointer may be
// null (the caller passes no buffer for zero bytes), which memmove forbids.
void moveBytes(std::byte* dst, const std::byte* src, size_t n) {
  if (n > 0) std::memmove(dst, src, n);
}

std::string shapeText(size_t count, DataType dtype, ReduceOp op) {
  return std::to_string(count) + " x " + std::string(dataTypeName(dtype)) + " " +
         std::string(reduceOpName(op));
}

// ---------------------------------------------------------------------------

class LocalCollective final : public Collective {
 public:
  LocalCollective(std::string what, std::function<void()> fn)
      : what_(std::move(what)), fn_(std::move(fn)) {}
  void start(CollectiveContext&) override {
    if (fn_) fn_();
  }
  bool finished() const override { return true; }
  const std::string& describe() const override { return what_; }

 private:
  std::string what_;
  std::function<void()> fn_;
};

// ---------------------------------------------------------------------------
// Recursive doubling over a buffer `buf` with a same-sized receive buffer
// `tmp`. For a size that is not a power of two, the first 2*rem ranks pair
// up: the even one hands its data to the odd one before the exchange rounds
// and gets the result back after them. Every rank reduces a OP b with its own
// data first and the partner's second; the ops are commutative, so both sides
// of an exchange compute the same bits and every rank ends bit-identical.

class RecursiveDoubling {
 public:
  static constexpr uint32_t kPreStep = 0;
  static constexpr uint32_t kPostStep = kMaxStep;

  RecursiveDoubling(std::byte* buf, size_t count, DataType dtype, ReduceOp op)
      : buf_(buf), count_(count), dtype_(dtype), op_(op), bytes_(count * dataTypeSize(dtype)) {}

  // `tmp` must hold bytes_ bytes.
  void start(CollectiveContext& ctx, std::byte* tmp) {
    ctx_ = &ctx;
    tmp_ = tmp;
    const int n = ctx.size();
    const int r = ctx.rank();
    pof2_ = 1;
    while (pof2_ * 2 <= n) pof2_ *= 2;
    rem_ = n - pof2_;
    if (r < 2 * rem_) {
      if (r % 2 == 0) {
        // Hands its data over and waits for the result.
        vrank_ = -1;
        ++pending_;
        ctx.send(r + 1, kPreStep, 0, buf_, bytes_);
        ++pending_;
        ctx.recv(r + 1, kPostStep, 0, buf_, bytes_);
        done_posting_ = true;
        return;
      }
      vrank_ = r / 2;
      ++pending_;
      ctx.recv(r - 1, kPreStep, 0, tmp_, bytes_);
      return;
    }
    vrank_ = r - rem_;
    beginRound();
  }

  void onSent(uint32_t step, uint32_t) {
    --pending_;
    if (step != kPreStep && step != kPostStep) roundMessageDone();
  }
  void onReceived(uint32_t step, uint32_t) {
    --pending_;
    if (step == kPreStep) {
      ++pending_;
      ctx_->reduce(kPreStep, 0, dtype_, op_, buf_, tmp_, buf_, count_);
    } else if (step != kPostStep) {
      roundMessageDone();
    }
  }
  void onReduced(uint32_t step, uint32_t) {
    --pending_;
    if (step != kPreStep) ++round_;
    beginRound();
  }
  bool finished() const { return done_posting_ && pending_ == 0; }

 private:
  int realRank(int vrank) const { return vrank < rem_ ? vrank * 2 + 1 : vrank + rem_; }

  void beginRound() {
    const int mask = 1 << round_;
    if (mask >= pof2_) {
      const int r = ctx_->rank();
      if (r < 2 * rem_) {  // odd member of a pair: give the result back
        ++pending_;
        ctx_->send(r - 1, kPostStep, 0, buf_, bytes_);
      }
      done_posting_ = true;
      return;
    }
    const int peer = realRank(vrank_ ^ mask);
    const uint32_t step = 1 + static_cast<uint32_t>(round_);
    round_left_ = 2;
    pending_ += 2;
    ctx_->send(peer, step, 0, buf_, bytes_);
    ctx_->recv(peer, step, 0, tmp_, bytes_);
  }

  void roundMessageDone() {
    if (--round_left_ > 0) return;
    // Both the send (buf no longer read) and the receive are done.
    ++pending_;
    ctx_->reduce(1 + static_cast<uint32_t>(round_), 0, dtype_, op_, buf_, tmp_, buf_, count_);
  }

  std::byte* buf_;
  size_t count_;
  DataType dtype_;
  ReduceOp op_;
  size_t bytes_;
  CollectiveContext* ctx_ = nullptr;
  std::byte* tmp_ = nullptr;
  int pof2_ = 1;
  int rem_ = 0;
  int vrank_ = 0;
  int round_ = 0;
  int round_left_ = 0;
  int pending_ = 0;
  bool done_posting_ = false;
};

class RecursiveDoublingAllreduce final : public Collective {
 public:
  RecursiveDoublingAllreduce(const void* in, void* buf, size_t count, DataType dtype, ReduceOp op)
      : rd_(static_cast<std::byte*>(buf), count, dtype, op),
        in_(in),
        buf_(buf),
        bytes_(count * dataTypeSize(dtype)),
        what_("allreduce " + shapeText(count, dtype, op) + " (recursive doubling)") {}
  void start(CollectiveContext& ctx) override {
    if (in_ != buf_ && bytes_ > 0) std::memcpy(buf_, in_, bytes_);
    rd_.start(ctx, ctx.scratch(bytes_));
  }
  void onSent(uint32_t s, uint32_t c) override { rd_.onSent(s, c); }
  void onReceived(uint32_t s, uint32_t c) override { rd_.onReceived(s, c); }
  void onReduced(uint32_t s, uint32_t c) override { rd_.onReduced(s, c); }
  bool finished() const override { return rd_.finished(); }
  const std::string& describe() const override { return what_; }

 private:
  RecursiveDoubling rd_;
  const void* in_;
  void* buf_;
  size_t bytes_;
  std::string what_;
};

// Reduce-scatter of a small buffer: allreduce a scratch copy, keep our block.
class SmallReducescatter final : public Collective {
 public:
  SmallReducescatter(const void* in, void* out, std::vector<size_t> counts, DataType dtype,
                     ReduceOp op)
      : in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        counts_(std::move(counts)),
        dtype_(dtype),
        op_(op),
        total_(std::accumulate(counts_.begin(), counts_.end(), size_t{0})),
        what_("reducescatter " + shapeText(total_, dtype, op) + " (recursive doubling)") {}

  void start(CollectiveContext& ctx) override {
    const size_t esize = dataTypeSize(dtype_);
    std::byte* work = ctx.scratch(total_ * esize);
    std::byte* tmp = ctx.scratch(total_ * esize);
    std::memcpy(work, in_, total_ * esize);
    size_t off = 0;
    for (int i = 0; i < ctx.rank(); ++i) off += counts_[i];
    own_ = work + off * esize;
    own_bytes_ = counts_[ctx.rank()] * esize;
    rd_ = std::make_unique<RecursiveDoubling>(work, total_, dtype_, op_);
    rd_->start(ctx, tmp);
    copyOutIfDone();
  }
  void onSent(uint32_t s, uint32_t c) override {
    rd_->onSent(s, c);
    copyOutIfDone();
  }
  void onReceived(uint32_t s, uint32_t c) override {
    rd_->onReceived(s, c);
    copyOutIfDone();
  }
  void onReduced(uint32_t s, uint32_t c) override {
    rd_->onReduced(s, c);
    copyOutIfDone();
  }
  bool finished() const override { return copied_; }
  const std::string& describe() const override { return what_; }

 private:
  void copyOutIfDone() {
    if (copied_ || !rd_->finished()) return;
    moveBytes(out_, own_, own_bytes_);  // a rank's block may be empty, its output null
    copied_ = true;
  }

  const std::byte* in_;
  std::byte* out_;
  std::vector<size_t> counts_;
  DataType dtype_;
  ReduceOp op_;
  size_t total_;
  std::string what_;
  std::unique_ptr<RecursiveDoubling> rd_;
  std::byte* own_ = nullptr;
  size_t own_bytes_ = 0;
  bool copied_ = false;
};

// ---------------------------------------------------------------------------
// The pipelined ring. Segment k of the buffer (seg_count[k] elements) is
// split into chunks. Over steps t in [begin, end) this rank sends segment
// (r - t - 1) mod N to its right neighbour and receives segment
// (r - t - 2) mod N from its left one; the segment received at step t is the
// one sent at step t + 1. Steps t < N - 1 form the reduce-scatter (the
// received chunk lands in a receive buffer and is reduced into the working
// copy), steps t >= N - 1 the allgather (received in place). After the
// reduce-scatter rank r holds the reduced segment r.
//
// Dataflow, per chunk: chunk c of step t + 1 is sent as soon as chunk c of
// step t has landed and been reduced, so with several chunks per segment the
// link, the reduction and the next send overlap. Receives are posted in
// (step, chunk) order, at most `pipeline_depth` at a time, each
// reduce-scatter receive with its own receive buffer. A message is only ever
// waited for after every earlier (step, chunk) has arrived, and it depends
// only on earlier ones, so the window never deadlocks.

struct RingPlan {
  std::string what;
  DataType dtype = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  std::vector<size_t> seg_count;     // elements per segment
  std::vector<const std::byte*> in;  // segment sources for step-0 sends and reductions
  std::vector<std::byte*> work;      // where each segment is reduced into / lands / is sent from
  int begin = 0;
  int end = 0;
};

class RingCollective final : public Collective {
 public:
  explicit RingCollective(RingPlan plan) : p_(std::move(plan)) {}

  void start(CollectiveContext& ctx) override {
    ctx_ = &ctx;
    n_ = ctx.size();
    r_ = ctx.rank();
    esize_ = dataTypeSize(p_.dtype);
    reduce_end_ = n_ - 1;
    size_t max_count = 0;
    for (size_t c : p_.seg_count) max_count = std::max(max_count, c);
    chunk_elems_ = std::max<size_t>(1, ctx.options().chunk_bytes / esize_);
    chunk_elems_ = std::max(chunk_elems_, (max_count + kMaxChunk - 1) / kMaxChunk);
    depth_ = std::max(1, ctx.options().pipeline_depth);

    // Receive buffers for the reduce-scatter steps.
    if (p_.begin < reduce_end_) {
      std::byte* slots = ctx.scratch(static_cast<size_t>(depth_) * chunk_elems_ * esize_);
      for (int i = 0; i < depth_; ++i) free_slots_.push_back(slots + i * chunk_elems_ * esize_);
    }
    for (int t = p_.begin; t < p_.end; ++t) {
      size_t rc = chunks(recvSeg(t));
      recvs_left_ += rc;
      sends_left_ += chunks(sendSeg(t));
      if (t < reduce_end_) reduces_left_ += rc;
    }
    next_t_ = p_.begin;
    next_c_ = 0;
    for (size_t c = 0; c < chunks(sendSeg(p_.begin)); ++c) postSend(p_.begin, c);
    pumpRecvs();
  }

  void onSent(uint32_t, uint32_t) override { --sends_left_; }

  void onReceived(uint32_t step, uint32_t chunk) override {
    --recvs_left_;
    --inflight_;
    const int t = static_cast<int>(step);
    if (t < reduce_end_) {
      const int k = recvSeg(t);
      const size_t off = chunk * chunk_elems_ * esize_;
      auto it = slot_of_.find(key(step, chunk));
      std::byte* slot = it->second;
      ctx_->reduce(step, chunk, p_.dtype, p_.op, p_.in[k] + off, slot, p_.work[k] + off,
                   chunkCount(k, chunk));
    } else {
      forward(t, chunk);
    }
    pumpRecvs();
  }

  void onReduced(uint32_t step, uint32_t chunk) override {
    --reduces_left_;
    auto it = slot_of_.find(key(step, chunk));
    free_slots_.push_back(it->second);
    slot_of_.erase(it);
    forward(static_cast<int>(step), chunk);
    pumpRecvs();
  }

  bool finished() const override {
    return sends_left_ == 0 && recvs_left_ == 0 && reduces_left_ == 0;
  }
  const std::string& describe() const override { return p_.what; }

 private:
  static uint64_t key(uint32_t step, uint32_t chunk) { return (uint64_t{step} << 32) | chunk; }
  int sendSeg(int t) const { return mod(r_ - t - 1, n_); }
  int recvSeg(int t) const { return mod(r_ - t - 2, n_); }
  size_t chunks(int seg) const { return (p_.seg_count[seg] + chunk_elems_ - 1) / chunk_elems_; }
  size_t chunkCount(int seg, size_t c) const {
    return std::min(chunk_elems_, p_.seg_count[seg] - c * chunk_elems_);
  }

  void postSend(int t, size_t c) {
    const int k = sendSeg(t);
    const std::byte* base = (t == 0) ? p_.in[k] : p_.work[k];
    ctx_->send(mod(r_ + 1, n_), static_cast<uint32_t>(t), static_cast<uint32_t>(c),
               base + c * chunk_elems_ * esize_, chunkCount(k, c) * esize_);
  }

  void forward(int t, size_t c) {
    if (t + 1 < p_.end) postSend(t + 1, c);
  }

  void pumpRecvs() {
    while (inflight_ < depth_ && next_t_ < p_.end) {
      const int k = recvSeg(next_t_);
      if (next_c_ >= chunks(k)) {
        ++next_t_;
        next_c_ = 0;
        continue;
      }
      const size_t bytes = chunkCount(k, next_c_) * esize_;
      const uint32_t step = static_cast<uint32_t>(next_t_);
      const uint32_t chunk = static_cast<uint32_t>(next_c_);
      void* dst;
      if (next_t_ < reduce_end_) {
        if (free_slots_.empty()) return;
        std::byte* slot = free_slots_.back();
        free_slots_.pop_back();
        slot_of_[key(step, chunk)] = slot;
        dst = slot;
      } else {
        dst = p_.work[k] + next_c_ * chunk_elems_ * esize_;
      }
      ++inflight_;
      ++next_c_;
      ctx_->recv(mod(r_ - 1, n_), step, chunk, dst, bytes);
    }
  }

  RingPlan p_;
  CollectiveContext* ctx_ = nullptr;
  int n_ = 1;
  int r_ = 0;
  size_t esize_ = 1;
  int reduce_end_ = 0;
  size_t chunk_elems_ = 1;
  int depth_ = 1;
  std::vector<std::byte*> free_slots_;
  std::map<uint64_t, std::byte*> slot_of_;
  size_t sends_left_ = 0;
  size_t recvs_left_ = 0;
  size_t reduces_left_ = 0;
  int inflight_ = 0;
  int next_t_ = 0;
  size_t next_c_ = 0;
};

std::vector<size_t> splitEvenly(size_t count, int n) {
  std::vector<size_t> seg(n);
  for (int k = 0; k < n; ++k) seg[k] = count / n + (static_cast<size_t>(k) < count % n ? 1 : 0);
  return seg;
}

// A ring plan whose segment k starts at displacement(k) elements of `in`/`work`.
void fillSegments(RingPlan& plan, const std::byte* in, std::byte* work) {
  const size_t esize = dataTypeSize(plan.dtype);
  size_t off = 0;
  for (size_t c : plan.seg_count) {
    plan.in.push_back(in + off * esize);
    plan.work.push_back(work + off * esize);
    off += c;
  }
}

// A collective that is one section of the ring, planned at start (when the
// size is known): subclasses fill plan_ and call launch.
class RingSection : public Collective {
 public:
  void onSent(uint32_t s, uint32_t c) override { ring_->onSent(s, c); }
  void onReceived(uint32_t s, uint32_t c) override { ring_->onReceived(s, c); }
  void onReduced(uint32_t s, uint32_t c) override { ring_->onReduced(s, c); }
  bool finished() const override { return ring_ && ring_->finished(); }
  const std::string& describe() const override { return ring_ ? ring_->describe() : plan_.what; }

 protected:
  // Runs steps [begin, end) of the ring over plan_.
  void launch(CollectiveContext& ctx, int begin, int end) {
    plan_.begin = begin;
    plan_.end = end;
    ring_ = std::make_unique<RingCollective>(std::move(plan_));
    ring_->start(ctx);
  }

  RingPlan plan_;

 private:
  std::unique_ptr<RingCollective> ring_;
};

// Ring reduce-scatter into a scratch working copy whose own block is `out`.
class RingReducescatter final : public RingSection {
 public:
  RingReducescatter(const void* in, void* out, std::vector<size_t> counts, DataType dtype,
                    ReduceOp op)
      : in_(static_cast<const std::byte*>(in)), out_(static_cast<std::byte*>(out)) {
    plan_.dtype = dtype;
    plan_.op = op;
    plan_.seg_count = std::move(counts);
    size_t total = std::accumulate(plan_.seg_count.begin(), plan_.seg_count.end(), size_t{0});
    plan_.what = "reducescatter " + shapeText(total, dtype, op) + " (ring)";
  }
  void start(CollectiveContext& ctx) override {
    const size_t esize = dataTypeSize(plan_.dtype);
    size_t total = std::accumulate(plan_.seg_count.begin(), plan_.seg_count.end(), size_t{0});
    std::byte* work = ctx.scratch(total * esize);
    fillSegments(plan_, in_, work);
    plan_.work[ctx.rank()] = out_;
    launch(ctx, 0, ctx.size() - 1);
  }

 private:
  const std::byte* in_;
  std::byte* out_;
};

// ---------------------------------------------------------------------------
// Broadcast. Ranks are renumbered v = (r - root) mod N so the root is 0.

class TreeBroadcast final : public Collective {
 public:
  TreeBroadcast(void* buf, size_t bytes, int root)
      : buf_(static_cast<std::byte*>(buf)),
        bytes_(bytes),
        root_(root),
        what_("broadcast " + std::to_string(bytes) + " bytes from rank " + std::to_string(root) +
              " (binomial tree)") {}

  void start(CollectiveContext& ctx) override {
    ctx_ = &ctx;
    const int n = ctx.size();
    const int v = mod(ctx.rank() - root_, n);
    int mask = 1;
    while (mask < n) {
      if (v & mask) {
        ++pending_;
        ctx.recv(mod(v - mask + root_, n), 0, 0, buf_, bytes_);
        child_mask_ = mask >> 1;
        return;
      }
      mask <<= 1;
    }
    child_mask_ = mask >> 1;
    sendToChildren();
  }
  void onSent(uint32_t, uint32_t) override { --pending_; }
  void onReceived(uint32_t, uint32_t) override {
    --pending_;
    sendToChildren();
  }
  bool finished() const override { return posted_all_ && pending_ == 0; }
  const std::string& describe() const override { return what_; }

 private:
  void sendToChildren() {
    const int n = ctx_->size();
    const int v = mod(ctx_->rank() - root_, n);
    for (int mask = child_mask_; mask > 0; mask >>= 1) {
      if (v + mask < n) {
        ++pending_;
        ctx_->send(mod(v + mask + root_, n), 0, 0, buf_, bytes_);
      }
    }
    posted_all_ = true;
  }

  std::byte* buf_;
  size_t bytes_;
  int root_;
  std::string what_;
  CollectiveContext* ctx_ = nullptr;
  int child_mask_ = 0;
  int pending_ = 0;
  bool posted_all_ = false;
};

// Chunk index i travels as (step, chunk) = (i >> 16, i & 0xffff).
class ChainBroadcast final : public Collective {
 public:
  ChainBroadcast(void* buf, size_t bytes, int root)
      : buf_(static_cast<std::byte*>(buf)),
        bytes_(bytes),
        root_(root),
        what_("broadcast " + std::to_string(bytes) + " bytes from rank " + std::to_string(root) +
              " (pipelined chain)") {}

  void start(CollectiveContext& ctx) override {
    ctx_ = &ctx;
    const int n = ctx.size();
    v_ = mod(ctx.rank() - root_, n);
    chunk_ = std::max<size_t>(1, ctx.options().chunk_bytes);
    nchunks_ = (bytes_ + chunk_ - 1) / chunk_;
    depth_ = std::max(1, ctx.options().pipeline_depth);
    if (v_ == 0) {
      for (size_t i = 0; i < nchunks_; ++i) sendChunk(i);
    } else {
      recvs_left_ = nchunks_;
      pumpRecvs();
    }
  }
  void onSent(uint32_t, uint32_t) override { --sends_left_; }
  void onReceived(uint32_t step, uint32_t chunk) override {
    --recvs_left_;
    --inflight_;
    if (v_ + 1 < ctx_->size()) sendChunk((size_t{step} << 16) | chunk);
    pumpRecvs();
  }
  bool finished() const override {
    return recvs_left_ == 0 && sends_left_ == 0 && next_ >= wanted();
  }
  const std::string& describe() const override { return what_; }

 private:
  size_t wanted() const { return v_ == 0 ? 0 : nchunks_; }
  size_t len(size_t i) const { return std::min(chunk_, bytes_ - i * chunk_); }
  void sendChunk(size_t i) {
    ++sends_left_;
    const int n = ctx_->size();
    ctx_->send(mod(v_ + 1 + root_, n), static_cast<uint32_t>(i >> 16),
               static_cast<uint32_t>(i & 0xffff), buf_ + i * chunk_, len(i));
  }
  void pumpRecvs() {
    const int n = ctx_->size();
    while (inflight_ < depth_ && next_ < wanted()) {
      ++inflight_;
      ctx_->recv(mod(v_ - 1 + root_, n), static_cast<uint32_t>(next_ >> 16),
                 static_cast<uint32_t>(next_ & 0xffff), buf_ + next_ * chunk_, len(next_));
      ++next_;
    }
  }

  std::byte* buf_;
  size_t bytes_;
  int root_;
  std::string what_;
  CollectiveContext* ctx_ = nullptr;
  int v_ = 0;
  size_t chunk_ = 1;
  size_t nchunks_ = 0;
  int depth_ = 1;
  size_t sends_left_ = 0;
  size_t recvs_left_ = 0;
  int inflight_ = 0;
  size_t next_ = 0;
};

// ---------------------------------------------------------------------------

class Alltoallv final : public Collective {
 public:
  Alltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
            std::vector<size_t> recv_bytes)
      : in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        send_(std::move(send_bytes)),
        recv_(std::move(recv_bytes)) {
    what_ = "alltoallv " + std::to_string(std::accumulate(send_.begin(), send_.end(), size_t{0})) +
            " bytes out, " +
            std::to_string(std::accumulate(recv_.begin(), recv_.end(), size_t{0})) + " bytes in";
  }
  void start(CollectiveContext& ctx) override {
    const int n = ctx.size();
    const int r = ctx.rank();
    if (send_[r] != recv_[r]) {
      ctx.fail(invalidArgument("alltoallv: rank " + std::to_string(r) + " sends itself " +
                               std::to_string(send_[r]) + " bytes but expects " +
                               std::to_string(recv_[r])));
      return;
    }
    std::vector<size_t> soff(n, 0), roff(n, 0);
    for (int i = 1; i < n; ++i) {
      soff[i] = soff[i - 1] + send_[i - 1];
      roff[i] = roff[i - 1] + recv_[i - 1];
    }
    // Every peer message is sent, even an empty one, so a size disagreement
    // shows up as an error instead of a wait.
    for (int d = 1; d < n; ++d) {
      const int from = mod(r - d, n);
      ++pending_;
      ctx.recv(from, 0, 0, out_ + roff[from], recv_[from]);
    }
    for (int d = 1; d < n; ++d) {
      const int to = mod(r + d, n);
      ++pending_;
      ctx.send(to, 0, 0, in_ + soff[to], send_[to]);
    }
    moveBytes(out_ + roff[r], in_ + soff[r], send_[r]);
  }
  void onSent(uint32_t, uint32_t) override { --pending_; }
  void onReceived(uint32_t, uint32_t) override { --pending_; }
  bool finished() const override { return pending_ == 0; }
  const std::string& describe() const override { return what_; }

 private:
  const std::byte* in_;
  std::byte* out_;
  std::vector<size_t> send_;
  std::vector<size_t> recv_;
  std::string what_;
  int pending_ = 0;
};

class DisseminationBarrier final : public Collective {
 public:
  void start(CollectiveContext& ctx) override {
    ctx_ = &ctx;
    beginRound();
  }
  void onSent(uint32_t, uint32_t) override { --pending_; }
  void onReceived(uint32_t, uint32_t) override {
    --pending_;
    ++round_;
    beginRound();
  }
  bool finished() const override { return done_posting_ && pending_ == 0; }
  const std::string& describe() const override { return what_; }

 private:
  void beginRound() {
    const int n = ctx_->size();
    const int dist = 1 << round_;
    if (dist >= n) {
      done_posting_ = true;
      return;
    }
    pending_ += 2;
    ctx_->recv(mod(ctx_->rank() - dist, n), static_cast<uint32_t>(round_), 0, &sink_, 0);
    ctx_->send(mod(ctx_->rank() + dist, n), static_cast<uint32_t>(round_), 0, &token_, 0);
  }

  std::string what_ = "barrier (dissemination)";
  CollectiveContext* ctx_ = nullptr;
  int round_ = 0;
  int pending_ = 0;
  bool done_posting_ = false;
  std::byte token_{};
  std::byte sink_{};
};

// Bruck's allgather, for small totals: ceil(log2 n) rounds instead of the
// ring's n - 1, each a message to rank - 2^k and one from rank + 2^k (the
// negotiation cycle's allgather at K = 8: 3 wake-ups per agent, not 7).
// Rank r keeps the blocks it holds in a scratch buffer in rotated order
// (position j = block (r + j) mod n), so what it sends, its first
// min(2^k, n - 2^k) blocks, and what it receives, appended after the 2^k it
// holds, are contiguous; the last step rotates them into `out`.
class BruckAllgatherv final : public Collective {
 public:
  BruckAllgatherv(const void* in, void* out, std::vector<size_t> recv_bytes)
      : in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        bytes_(std::move(recv_bytes)) {
    what_ = "allgatherv " +
            std::to_string(std::accumulate(bytes_.begin(), bytes_.end(), size_t{0})) +
            " bytes (bruck)";
  }
  void start(CollectiveContext& ctx) override {
    ctx_ = &ctx;
    const int n = ctx.size();
    const int r = ctx.rank();
    // pos_[j]: where position j (block (r + j) mod n) starts in the scratch.
    pos_.assign(n + 1, 0);
    for (int j = 0; j < n; ++j) pos_[j + 1] = pos_[j] + bytes_[mod(r + j, n)];
    work_ = ctx.scratch(std::max<size_t>(pos_[n], 1));
    if (bytes_[r] > 0) std::memmove(work_, in_, bytes_[r]);
    have_ = 1;
    beginRound();
  }
  void onSent(uint32_t, uint32_t) override { --pending_; }
  void onReceived(uint32_t, uint32_t) override {
    --pending_;
    // What was sent is never written again: the next round may start now.
    have_ += count_;
    ++round_;
    beginRound();
  }
  bool finished() const override { return done_posting_ && pending_ == 0; }
  const std::string& describe() const override { return what_; }

 private:
  void beginRound() {
    const int n = ctx_->size();
    const int r = ctx_->rank();
    if (have_ >= n) {
      std::vector<size_t> off(n + 1, 0);
      for (int i = 0; i < n; ++i) off[i + 1] = off[i] + bytes_[i];
      for (int j = 0; j < n; ++j) {
        const int b = mod(r + j, n);
        if (bytes_[b] > 0) std::memmove(out_ + off[b], work_ + pos_[j], bytes_[b]);
      }
      done_posting_ = true;
      return;
    }
    const int dist = have_;
    count_ = std::min(dist, n - have_);
    // Our positions [0, count) go to r - dist, whose positions [have, have +
    // count) they are; r + dist's positions [0, count) are our [have, ...).
    size_t recv_bytes = 0;
    for (int j = 0; j < count_; ++j) recv_bytes += bytes_[mod(r + dist + j, n)];
    pending_ += 2;
    const auto step = static_cast<uint32_t>(round_);
    ctx_->recv(mod(r + dist, n), step, 0, work_ + pos_[have_], recv_bytes);
    ctx_->send(mod(r - dist, n), step, 0, work_, pos_[count_]);
  }

  const std::byte* in_;
  std::byte* out_;
  std::vector<size_t> bytes_;
  std::string what_;
  CollectiveContext* ctx_ = nullptr;
  std::vector<size_t> pos_;
  std::byte* work_ = nullptr;
  int have_ = 0;
  int count_ = 0;
  int round_ = 0;
  int pending_ = 0;
  bool done_posting_ = false;
};

// Ring allgather: the allgather half of the ring over blocks of bytes.
class RingAllgatherv final : public RingSection {
 public:
  RingAllgatherv(const void* in, void* out, std::vector<size_t> recv_bytes)
      : in_(static_cast<const std::byte*>(in)), out_(static_cast<std::byte*>(out)) {
    plan_.dtype = DataType::kUint8;
    plan_.seg_count = std::move(recv_bytes);
    plan_.what =
        "allgatherv " +
        std::to_string(std::accumulate(plan_.seg_count.begin(), plan_.seg_count.end(), size_t{0})) +
        " bytes (ring)";
  }
  void start(CollectiveContext& ctx) override {
    fillSegments(plan_, out_, out_);
    const int r = ctx.rank();
    if (plan_.work[r] != in_) moveBytes(plan_.work[r], in_, plan_.seg_count[r]);
    launch(ctx, ctx.size() - 1, 2 * ctx.size() - 2);
  }

 private:
  const std::byte* in_;
  std::byte* out_;
};

// Ring allreduce: segments are known only once the size is (at start).
class RingAllreduce final : public RingSection {
 public:
  RingAllreduce(const void* in, void* buf, size_t count, DataType dtype, ReduceOp op)
      : in_(static_cast<const std::byte*>(in)), buf_(static_cast<std::byte*>(buf)), count_(count) {
    plan_.dtype = dtype;
    plan_.op = op;
    plan_.what = "allreduce " + shapeText(count, dtype, op) + " (ring)";
  }
  void start(CollectiveContext& ctx) override {
    plan_.seg_count = splitEvenly(count_, ctx.size());
    // Out of place, every segment of buf_ is still written: all but this
    // rank's left neighbour's by the reduce-scatter, that one by the
    // allgather's first step.
    fillSegments(plan_, in_, buf_);
    launch(ctx, 0, 2 * ctx.size() - 2);
  }

 private:
  const std::byte* in_;
  std::byte* buf_;
  size_t count_;
};

}  // namespace

std::unique_ptr<Collective> makeLocalCollective(std::string what, std::function<void()> fn) {
  return std::make_unique<LocalCollective>(std::move(what), std::move(fn));
}
std::unique_ptr<Collective> makeRecursiveDoublingAllreduce(const void* in, void* buf, size_t count,
                                                           DataType dtype, ReduceOp op) {
  return std::make_unique<RecursiveDoublingAllreduce>(in, buf, count, dtype, op);
}
std::unique_ptr<Collective> makeRingAllreduce(const void* in, void* buf, size_t count, DataType dtype,
                                              ReduceOp op) {
  return std::make_unique<RingAllreduce>(in, buf, count, dtype, op);
}
std::unique_ptr<Collective> makeTreeBroadcast(void* buf, size_t bytes, int root) {
  return std::make_unique<TreeBroadcast>(buf, bytes, root);
}
std::unique_ptr<Collective> makeChainBroadcast(void* buf, size_t bytes, int root) {
  return std::make_unique<ChainBroadcast>(buf, bytes, root);
}
std::unique_ptr<Collective> makeBruckAllgatherv(const void* in, void* out,
                                                std::vector<size_t> recv_bytes) {
  return std::make_unique<BruckAllgatherv>(in, out, std::move(recv_bytes));
}

std::unique_ptr<Collective> makeRingAllgatherv(const void* in, void* out,
                                               std::vector<size_t> recv_bytes) {
  return std::make_unique<RingAllgatherv>(in, out, std::move(recv_bytes));
}
std::unique_ptr<Collective> makeRingReducescatter(const void* in, void* out,
                                                  std::vector<size_t> recv_counts, DataType dtype,
                                                  ReduceOp op) {
  return std::make_unique<RingReducescatter>(in, out, std::move(recv_counts), dtype, op);
}
std::unique_ptr<Collective> makeSmallReducescatter(const void* in, void* out,
                                                   std::vector<size_t> recv_counts, DataType dtype,
                                                   ReduceOp op) {
  return std::make_unique<SmallReducescatter>(in, out, std::move(recv_counts), dtype, op);
}
std::unique_ptr<Collective> makeAlltoallv(const void* in, std::vector<size_t> send_bytes, void* out,
                                          std::vector<size_t> recv_bytes) {
  return std::make_unique<Alltoallv>(in, std::move(send_bytes), out, std::move(recv_bytes));
}
std::unique_ptr<Collective> makeDisseminationBarrier() {
  return std::make_unique<DisseminationBarrier>();
}

}  // namespace kolo::coll
