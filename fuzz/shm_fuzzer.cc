// Fuzzes what a trainer controls in the shared arena besides the descriptors
// themselves (docs/security.md, "Shared memory the trainer can write"):
//
//   0: a SpscRing whose header (head, tail, capacity) is rewritten between
//      pushes and pops, against a model: a side's own index only moves by
//      its own operations, every peer index outside [0, capacity] entries
//      is refused and the ring stays refused, an honest peer is never
//      refused, and (ASan) no access leaves the entries;
//   1: the agent's ClientConn with its arena's ring headers rewritten: pops
//      and completions never crash, and broken() holds exactly when a peer
//      index was out of bounds (on_broken_ring runs once);
//   2: an alltoall split matrix per local rank (hostile int64s) checked by
//      checkAlltoallSplits on each rank's private copy: when every local
//      rank accepts one and the same matrix, every copy the execution
//      derives (alltoallLocalCopies) lies inside the source rank's input
//      and the destination rank's output, and is performed (ASan);
//   3: allgather first-dimension lists the same way: accepted and equal
//      lists give each local rank exactly its input's rows and every
//      output exactly the gathered rows.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "agent/core/shm_meta.h"
#include "agent/ipc/client_conn.h"
#include "common/dtype.h"
#include "common/ipc_layout.h"
#include "common/spsc_ring.h"
#include "fuzz/fuzz_util.h"

namespace {

using kolo::RingHeader;

// Reads the input front to back (so seeds are easy to write by hand); zeros
// once it is used up.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  size_t remaining_bytes() const { return n_; }
  template <typename T>
  T ConsumeIntegral() {
    T v{};
    size_t take = std::min(sizeof(T), n_);
    std::memcpy(&v, p_, take);
    p_ += take;
    n_ -= take;
    return v;
  }
  // lo + (one byte, or 8 when the range is wider than a byte) modulo the range.
  template <typename T>
  T ConsumeIntegralInRange(T lo, T hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    const uint64_t raw = span < 256 ? ConsumeIntegral<uint8_t>() : ConsumeIntegral<uint64_t>();
    return static_cast<T>(static_cast<uint64_t>(lo) +
                          (span == UINT64_MAX ? raw : raw % (span + 1)));
  }
  bool ConsumeBool() { return (ConsumeIntegral<uint8_t>() & 1) != 0; }

 private:
  const uint8_t* p_;
  size_t n_;
};
using FuzzedDataProvider = Input;

// A peer index: mostly near the truth (the interesting edges), sometimes anything.
uint64_t hostileIndex(FuzzedDataProvider& in, uint64_t near, uint64_t cap) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return near + in.ConsumeIntegralInRange<uint64_t>(0, 2 * cap + 1);
    case 1:
      return near - in.ConsumeIntegralInRange<uint64_t>(0, 2 * cap + 1);
    default:
      return in.ConsumeIntegral<uint64_t>();
  }
}

void fuzzRing(FuzzedDataProvider& in) {
  const uint64_t cap = uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 4);
  // Exactly the ring's bytes: ASan sees any access past the last entry.
  std::unique_ptr<char[]> mem(new char[kolo::SpscRing<uint64_t>::bytesFor(cap)]);
  kolo::SpscRing<uint64_t>::format(mem.get(), cap);
  auto* hdr = reinterpret_cast<RingHeader*>(mem.get());
  kolo::SpscRing<uint64_t> prod(mem.get(), cap), cons(mem.get(), cap);
  uint64_t pushed = 0, popped = 0;  // the model: each side's own index
  bool prod_bad = false, cons_bad = false, forged = false;
  while (in.remaining_bytes() > 0) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: {  // push
        const uint64_t head = hdr->head.load();
        const bool ok = prod.tryPush(pushed);
        if (!prod_bad && pushed - head > cap) prod_bad = true;
        FUZZ_CHECK(prod.corrupt() == prod_bad);
        FUZZ_CHECK(ok == (!prod_bad && pushed - head < cap));
        if (ok) {
          ++pushed;
          FUZZ_CHECK(hdr->tail.load() == pushed);
        }
        break;
      }
      case 1: {  // pop
        const uint64_t tail = hdr->tail.load();
        uint64_t v = ~uint64_t{0};
        const bool ok = cons.tryPop(&v);
        if (!cons_bad && tail - popped > cap) cons_bad = true;
        FUZZ_CHECK(cons.corrupt() == cons_bad);
        FUZZ_CHECK(ok == (!cons_bad && tail != popped));
        if (ok) {
          if (!forged) FUZZ_CHECK(v == popped);  // honest peers: the entries in order
          ++popped;
          FUZZ_CHECK(hdr->head.load() == popped);
        }
        break;
      }
      case 2:  // the consumer is hostile: its head
        hdr->head.store(hostileIndex(in, popped, cap));
        forged = true;
        break;
      case 3:  // the producer is hostile: its tail
        hdr->tail.store(hostileIndex(in, pushed, cap));
        forged = true;
        break;
      case 4:  // either: the capacity (never read back)
        hdr->capacity = in.ConsumeIntegral<uint64_t>();
        break;
      case 5:  // one side mends what it wrote (does not mend the ring)
        hdr->head.store(popped);
        hdr->tail.store(pushed);
        break;
    }
    FUZZ_CHECK(prod.capacity() == cap && cons.capacity() == cap);
    FUZZ_CHECK(cons.size() <= cap);
  }
}

void fuzzClientConn(FuzzedDataProvider& in) {
  constexpr uint64_t kBytes = 2 << 20;
  static kolo::ClientConn* conn = nullptr;
  static int broken_calls = 0;
  // A fresh connection per input (the rings' state is per connection).
  delete conn;
  conn = new kolo::ClientConn(1, kolo::UniqueFd(), 0, 0);
  broken_calls = 0;
  if (!conn->createArena(kBytes, "kolo-fuzz-shm").isOk()) std::abort();
  conn->on_broken_ring = [] { ++broken_calls; };
  kolo::ArenaLayout l = kolo::ArenaLayout::compute(kBytes);
  auto* sub = reinterpret_cast<RingHeader*>(conn->arena()->data() + l.submit_ring_offset);
  auto* done = reinterpret_cast<RingHeader*>(conn->arena()->data() + l.completion_ring_offset);
  constexpr uint64_t kSubCap = kolo::kSubmitRingCapacity, kDoneCap = kolo::kCompletionRingCapacity;
  // The model: the agent's own indices, the completions it holds back.
  uint64_t pops = 0, completions = 0, queued = 0;
  bool sub_bad = false, done_bad = false;
  while (in.remaining_bytes() > 0) {
    const bool was_broken = conn->broken();
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: {  // the doorbell: pop one submission
        const uint64_t tail = sub->tail.load();
        kolo::SubmitDesc d;
        const bool ok = conn->popSubmission(&d);
        if (!was_broken && tail - pops > kSubCap) sub_bad = true;
        FUZZ_CHECK(ok == (!was_broken && !sub_bad && tail != pops));
        if (ok) ++pops;
        break;
      }
      case 1: {  // a completion
        const uint64_t head = done->head.load();
        conn->complete(in.ConsumeIntegral<uint64_t>(), kolo::okStatus());
        if (was_broken) break;
        if (queued > 0) {
          ++queued;  // behind the ones held back; the ring is not looked at
        } else if (completions - head > kDoneCap) {
          done_bad = true;
        } else if (completions - head == kDoneCap) {
          ++queued;
        } else {
          ++completions;
        }
        break;
      }
      case 2: {  // the held-back completions
        const uint64_t head = done->head.load();
        conn->flushCompletions();
        if (was_broken || queued == 0) break;
        if (completions - head > kDoneCap) {
          done_bad = true;
        } else {
          const uint64_t n = std::min(queued, kDoneCap - (completions - head));
          completions += n;
          queued -= n;
        }
        break;
      }
      case 3:
        sub->tail.store(hostileIndex(in, pops, kSubCap));
        break;
      case 4:
        done->head.store(hostileIndex(in, completions, kDoneCap));
        break;
      case 5:
        (in.ConsumeBool() ? sub : done)->capacity = in.ConsumeIntegral<uint64_t>();
        break;
    }
    if (sub_bad || done_bad) queued = 0;  // dropped with the connection
    FUZZ_CHECK(conn->broken() == (sub_bad || done_bad));
    FUZZ_CHECK(broken_calls == (conn->broken() ? 1 : 0));
    FUZZ_CHECK(conn->broken() == !conn->ringError().empty());
    // The agent's own indices (only it writes them) move only by its pushes and pops.
    FUZZ_CHECK(done->tail.load() == completions);
    FUZZ_CHECK(sub->head.load() == pops);
  }
}

// A small split value most of the time; sometimes anything.
int64_t hostileCount(FuzzedDataProvider& in) {
  if (in.ConsumeIntegralInRange<int>(0, 7) != 0) return in.ConsumeIntegralInRange<int64_t>(0, 4);
  return in.ConsumeIntegral<int64_t>();
}

struct Node {
  int world = 1, k = 1, base = 0;
  uint64_t row = 1;
  std::vector<kolo::SubmitDesc> descs;  // per local rank
};

// `world` ranks, `k` of them local from `base`, rows of `row` bytes (uint8,
// [rows, row]); each local rank's rows and output rows from the input.
Node makeNode(FuzzedDataProvider& in, kolo::CollectiveType coll, uint64_t prefix_of(int)) {
  Node n;
  n.world = in.ConsumeIntegralInRange<int>(1, 6);
  n.k = in.ConsumeIntegralInRange<int>(1, n.world);
  n.base = in.ConsumeIntegralInRange<int>(0, n.world - n.k);
  n.row = in.ConsumeIntegralInRange<uint64_t>(0, 8);
  const uint64_t prefix = prefix_of(n.world);
  for (int i = 0; i < n.k; ++i) {
    kolo::SubmitDesc d{};
    d.collective = static_cast<uint8_t>(coll);
    d.dtype = static_cast<uint8_t>(kolo::DataType::kUint8);
    d.ndim = 2;
    d.shape[0] = in.ConsumeIntegralInRange<int64_t>(0, 16);
    d.shape[1] = static_cast<int64_t>(n.row);
    d.data_bytes = static_cast<uint64_t>(d.shape[0]) * n.row;
    d.out_bytes = prefix + in.ConsumeIntegralInRange<uint64_t>(0, 64) * n.row;
    d.name_len = 1;
    d.name[0] = 't';
    n.descs.push_back(d);
  }
  return n;
}

void fuzzAlltoall(FuzzedDataProvider& in) {
  Node n = makeNode(in, kolo::CollectiveType::kAlltoall, kolo::alltoallSplitsBytes);
  const size_t cells = static_cast<size_t>(n.world) * n.world;
  std::vector<int64_t> m(cells);
  for (auto& v : m) v = hostileCount(in);
  // Each local rank's private copy: the same matrix, or (sometimes) one
  // that differs in a cell.
  std::vector<std::vector<int64_t>> copies(n.k, m);
  for (int i = 0; i < n.k; ++i) {
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      copies[i][in.ConsumeIntegralInRange<size_t>(0, cells - 1)] = hostileCount(in);
    }
  }
  bool all_ok = true, same = true;
  for (int i = 0; i < n.k; ++i) {
    kolo::Status st = kolo::checkAlltoallSplits(n.descs[i], n.world, n.base + i, copies[i]);
    FUZZ_CHECK(st.isOk() || !st.message().empty());
    all_ok &= st.isOk();
    same &= copies[i] == copies[0];
  }
  if (!all_ok || !same) return;  // the execution refuses it (different matrices) or never sees it
  const uint64_t prefix = kolo::alltoallSplitsBytes(n.world);
  // Exactly sized buffers: ASan sees a copy that leaves them.
  std::vector<std::unique_ptr<char[]>> ins, outs;
  for (const auto& d : n.descs) {
    ins.emplace_back(new char[d.data_bytes + 1]);
    outs.emplace_back(new char[d.out_bytes - prefix + 1]);
    std::memset(ins.back().get(), 1, d.data_bytes);
  }
  for (const kolo::AlltoallCopy& c :
       kolo::alltoallLocalCopies(copies[0], n.world, n.base, n.k, n.row)) {
    FUZZ_CHECK(c.src_local >= 0 && c.src_local < n.k && c.dst_local >= 0 && c.dst_local < n.k);
    const auto& s = n.descs[c.src_local];
    const auto& d = n.descs[c.dst_local];
    FUZZ_CHECK(c.bytes > 0 && c.src_off <= s.data_bytes && c.bytes <= s.data_bytes - c.src_off);
    FUZZ_CHECK(c.dst_off <= d.out_bytes - prefix && c.bytes <= d.out_bytes - prefix - c.dst_off);
    std::memcpy(outs[c.dst_local].get() + c.dst_off, ins[c.src_local].get() + c.src_off, c.bytes);
  }
}

void fuzzAllgather(FuzzedDataProvider& in) {
  Node n = makeNode(in, kolo::CollectiveType::kAllgather, kolo::allgatherSizesBytes);
  std::vector<int64_t> dims(n.world);
  for (auto& v : dims) v = hostileCount(in);
  std::vector<std::vector<int64_t>> copies(n.k, dims);
  for (int i = 0; i < n.k; ++i) {
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      copies[i][in.ConsumeIntegralInRange<int>(0, n.world - 1)] = hostileCount(in);
    }
  }
  bool all_ok = true, same = true;
  for (int i = 0; i < n.k; ++i) {
    kolo::Status st = kolo::checkAllgatherSizes(n.descs[i], n.world, n.base + i, copies[i]);
    FUZZ_CHECK(st.isOk() || !st.message().empty());
    all_ok &= st.isOk();
    same &= copies[i] == copies[0];
  }
  if (!all_ok || !same) return;
  // What executeAllgatherOnLoop derives: rank r's rows at offsets[r].
  const uint64_t prefix = kolo::allgatherSizesBytes(n.world);
  std::vector<uint64_t> offsets(n.world + 1, 0);
  for (int r = 0; r < n.world; ++r) {
    FUZZ_CHECK(copies[0][r] >= 0);
    offsets[r + 1] = offsets[r] + static_cast<uint64_t>(copies[0][r]) * n.row;
    FUZZ_CHECK(offsets[r + 1] >= offsets[r]);  // no wrap-around
  }
  for (int i = 0; i < n.k; ++i) {
    FUZZ_CHECK(offsets[n.base + i + 1] - offsets[n.base + i] == n.descs[i].data_bytes);
    FUZZ_CHECK(offsets[n.world] == n.descs[i].out_bytes - prefix);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kolo::fuzz::quietInit();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      fuzzRing(in);
      break;
    case 1:
      fuzzClientConn(in);
      break;
    case 2:
      fuzzAlltoall(in);
      break;
    case 3:
      fuzzAllgather(in);
      break;
  }
  return 0;
}
