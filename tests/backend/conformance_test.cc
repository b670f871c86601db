// The Backend conformance suite: every collective of the interface, checked
// bit for bit against a reference computed here, for every compiled backend
// x size (2, 3, 4) x algorithm variant x shape x dtype x op. Peers run as
// threads of this process, one backend object each, over an in-memory
// KvStore. A group of peers is created once per (backend, size, variant) and
// shared by the cases of this process; a case that fails tears its group down
// before its buffers go away.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <numeric>
#include <tuple>

#include "agent/gpu/device_api.h"
#include "tests/backend/test_util.h"

namespace kolo::testing_backend {
namespace {

// Algorithm variants: the defaults, and one that forces the pipelined
// ring/chain everywhere with tiny chunks and a shallow pipeline so that small
// shapes cross chunk, segment and window boundaries. The first reduces its
// large chunks on the helper thread, the second on the progress thread,
// whatever this machine's default.
struct Variant {
  const char* name;
  size_t small_message_bytes;
  size_t chunk_bytes;
  int pipeline_depth;
  bool reduce_thread;
};
const Variant kAuto{"auto", 64 * 1024, 256 * 1024, 4, true};
const Variant kPipelined{"pipelined", 0, 256, 2, false};
const Variant* const kVariants[] = {&kAuto, &kPipelined};

// The nccl backend joins the suite over the host emulation of the device and
// of NCCL (KOLO_TEST_NCCL=host-emulated: ctest backend.conformance.nccl-emu.n*;
// docs/gpu.md "The NCCL emulation"), on these host buffers, which are what
// the emulated device's memory is. NCCL has no algorithm knobs: one variant.
std::vector<std::string> conformanceBackends() {
  std::vector<std::string> names = compiledBackends();
  const char* e = std::getenv("KOLO_TEST_NCCL");
  if (e != nullptr && std::string(e) == "host-emulated") names.push_back("nccl");
  return names;
}
std::vector<const Variant*> variantsFor(const std::string& backend) {
  if (backend == "nccl") return {&kAuto};
  return {std::begin(kVariants), std::end(kVariants)};
}

constexpr size_t kBigCount = (size_t{1} << 20) + 3;
const int kSizes[] = {2, 3, 4};
const DataType kAllTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                              DataType::kFloat64, DataType::kInt8,     DataType::kUint8,
                              DataType::kInt32,   DataType::kInt64};
const ReduceOp kAllOps[] = {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};

// --- shared groups -----------------------------------------------------------

using GroupKey = std::tuple<std::string, int, const Variant*>;

class Groups : public ::testing::Environment {
 public:
  static Groups& instance() {
    static Groups* g = new Groups();  // owned by gtest once registered
    return *g;
  }
  // The group for `key`, created on first use; null (and `*why` set) if creation failed.
  PeerGroup* get(const GroupKey& key, Status* why) {
    auto it = groups_.find(key);
    if (it != groups_.end()) return it->second.get();
    BackendOptions o;
    o.timeout = 20s;
    o.small_message_bytes = std::get<2>(key)->small_message_bytes;
    o.chunk_bytes = std::get<2>(key)->chunk_bytes;
    o.pipeline_depth = std::get<2>(key)->pipeline_depth;
    o.reduce_thread = std::get<2>(key)->reduce_thread;
    if (std::get<0>(key) == "nccl") {
      Status sel = gpu::selectDeviceApi(gpu::DeviceKind::kHostEmulated);
      if (!sel.isOk()) {
        *why = sel;
        return nullptr;
      }
    }
    auto g = PeerGroup::create(std::get<0>(key), std::get<1>(key), o);
    if (!g.isOk()) {
      *why = g.status();
      return nullptr;
    }
    return (groups_[key] = std::move(g).value()).get();
  }
  void drop(const GroupKey& key) { groups_.erase(key); }
  void TearDown() override { groups_.clear(); }

 private:
  std::map<GroupKey, std::unique_ptr<PeerGroup>> groups_;
};

const bool kGroupsRegistered = [] {
  ::testing::AddGlobalTestEnvironment(&Groups::instance());
  return true;
}();

// Runs one collective on every rank of the shared group. If any rank fails or
// does not complete, the group is destroyed before returning (which completes
// whatever is outstanding), so the caller's buffers are no longer referenced.
std::vector<Status> runOn(const GroupKey& key, const PeerGroup::Post& post) {
  Status why;
  PeerGroup* g = Groups::instance().get(key, &why);
  if (g == nullptr) return std::vector<Status>(std::get<1>(key), why);
  auto statuses = g->run(post, 60s);
  if (!allOk(statuses)) Groups::instance().drop(key);
  return statuses;
}

std::string typeName(DataType t) { return std::string(dataTypeName(t)); }
std::string opName(ReduceOp op) { return std::string(reduceOpName(op)); }

// --- allreduce ---------------------------------------------------------------

struct AllreduceCase {
  std::string backend;
  int size;
  const Variant* variant;
  size_t count;
  DataType dtype;
  ReduceOp op;
};

std::vector<AllreduceCase> allreduceCases() {
  std::vector<AllreduceCase> cases;
  for (const auto& b : conformanceBackends()) {
    for (int n : kSizes) {
      for (const Variant* v : variantsFor(b)) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          for (DataType t : kAllTypes) {
            for (ReduceOp op : kAllOps) cases.push_back({b, n, v, count, t, op});
          }
        }
      }
      // Big buffers (many chunks per segment, reductions on the helper
      // thread): every dtype once, and every op once.
      for (DataType t : kAllTypes) cases.push_back({b, n, &kAuto, kBigCount, t, ReduceOp::kSum});
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        cases.push_back({b, n, &kAuto, kBigCount, DataType::kFloat32, op});
      }
    }
  }
  return cases;
}

class AllreduceTest : public ::testing::TestWithParam<AllreduceCase> {};

TEST_P(AllreduceTest, MatchesReference) {
  const auto& c = GetParam();
  std::vector<Bytes> bufs;
  for (int r = 0; r < c.size; ++r) bufs.push_back(makeInput(c.dtype, c.op, r, c.count));
  const Bytes want = makeReference(c.dtype, c.op, c.size, c.count);
  auto statuses = runOn({c.backend, c.size, c.variant}, [&](int r, Backend& b, Backend::Done done) {
    b.allreduce(bufs[r].data(), c.count, c.dtype, c.op, std::move(done));
  });
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < c.size; ++r) {
    EXPECT_TRUE(sameBytes(bufs[r].data(), want.data(), want.size())) << "rank " << r;
  }
}

// Out of place: the result lands in a separate buffer (poisoned first) and
// the input comes back unchanged.
TEST_P(AllreduceTest, OutOfPlaceMatchesReferenceAndKeepsTheInput) {
  const auto& c = GetParam();
  std::vector<Bytes> ins, outs;
  for (int r = 0; r < c.size; ++r) {
    ins.push_back(makeInput(c.dtype, c.op, r, c.count));
    outs.push_back(Bytes(ins.back().size(), std::byte{0xa5}));
  }
  const std::vector<Bytes> originals = ins;
  const Bytes want = makeReference(c.dtype, c.op, c.size, c.count);
  auto statuses = runOn({c.backend, c.size, c.variant}, [&](int r, Backend& b, Backend::Done done) {
    b.allreduceOutOfPlace(ins[r].data(), outs[r].data(), c.count, c.dtype, c.op, std::move(done));
  });
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < c.size; ++r) {
    EXPECT_TRUE(sameBytes(outs[r].data(), want.data(), want.size())) << "rank " << r;
    EXPECT_TRUE(sameBytes(ins[r].data(), originals[r].data(), originals[r].size())) << "rank " << r << "'s input";
  }
}

std::string caseName(const AllreduceCase& c) {
  return c.backend + "_n" + std::to_string(c.size) + "_" + c.variant->name + "_c" +
         std::to_string(c.count) + "_" + typeName(c.dtype) + "_" + opName(c.op);
}
void PrintTo(const AllreduceCase& c, std::ostream* os) { *os << caseName(c); }

INSTANTIATE_TEST_SUITE_P(Conformance, AllreduceTest, ::testing::ValuesIn(allreduceCases()),
                         [](const ::testing::TestParamInfo<AllreduceCase>& i) {
                           return caseName(i.param);
                         });

// --- reducescatter -----------------------------------------------------------

struct ReducescatterCase {
  std::string backend;
  int size;
  const Variant* variant;
  std::string pattern;  // even | uneven | inplace | big
  DataType dtype;
  ReduceOp op;
};

std::vector<size_t> reducescatterCounts(const std::string& pattern, int n) {
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) {
    if (pattern == "uneven") {
      counts[i] = static_cast<size_t>((i * 5 + 2) % 7);  // 2, 0, 5, 3: one rank gets nothing
    } else if (pattern == "big") {
      counts[i] = (size_t{1} << 18) + 1 + i;
    } else {
      counts[i] = 6;
    }
  }
  return counts;
}

std::vector<ReducescatterCase> reducescatterCases() {
  std::vector<ReducescatterCase> cases;
  for (const auto& b : conformanceBackends()) {
    for (int n : kSizes) {
      for (const Variant* v : variantsFor(b)) {
        for (const char* pattern : {"even", "uneven", "inplace"}) {
          for (DataType t :
               {DataType::kFloat16, DataType::kFloat32, DataType::kInt8, DataType::kInt64}) {
            for (ReduceOp op : kAllOps) cases.push_back({b, n, v, pattern, t, op});
          }
        }
      }
      cases.push_back({b, n, &kAuto, "big", DataType::kFloat32, ReduceOp::kSum});
      cases.push_back({b, n, &kAuto, "big", DataType::kBFloat16, ReduceOp::kMax});
    }
  }
  return cases;
}

class ReducescatterTest : public ::testing::TestWithParam<ReducescatterCase> {};

TEST_P(ReducescatterTest, MatchesReference) {
  const auto& c = GetParam();
  const auto counts = reducescatterCounts(c.pattern, c.size);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t esize = dataTypeSize(c.dtype);
  const bool in_place = c.pattern == "inplace";
  std::vector<Bytes> ins, outs(c.size);
  std::vector<size_t> offsets(c.size, 0);
  for (int r = 1; r < c.size; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  for (int r = 0; r < c.size; ++r) {
    ins.push_back(makeInput(c.dtype, c.op, r, total));
    outs[r].assign(counts[r] * esize, std::byte{0x5a});
  }
  const Bytes want = makeReference(c.dtype, c.op, c.size, total);
  auto statuses = runOn({c.backend, c.size, c.variant}, [&](int r, Backend& b, Backend::Done done) {
    void* out = in_place ? ins[r].data() + offsets[r] * esize : outs[r].data();
    b.reducescatter(ins[r].data(), out, counts, c.dtype, c.op, std::move(done));
  });
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < c.size; ++r) {
    const std::byte* got = in_place ? ins[r].data() + offsets[r] * esize : outs[r].data();
    EXPECT_TRUE(sameBytes(got, want.data() + offsets[r] * esize, counts[r] * esize))
        << "rank " << r;
  }
}

std::string caseName(const ReducescatterCase& c) {
  return c.backend + "_n" + std::to_string(c.size) + "_" + c.variant->name + "_" + c.pattern + "_" +
         typeName(c.dtype) + "_" + opName(c.op);
}
void PrintTo(const ReducescatterCase& c, std::ostream* os) { *os << caseName(c); }

INSTANTIATE_TEST_SUITE_P(Conformance, ReducescatterTest, ::testing::ValuesIn(reducescatterCases()),
                         [](const ::testing::TestParamInfo<ReducescatterCase>& i) {
                           return caseName(i.param);
                         });

// --- broadcast ---------------------------------------------------------------

struct BroadcastCase {
  std::string backend;
  int size;
  const Variant* variant;
  size_t bytes;
  int root;
};

std::vector<BroadcastCase> broadcastCases() {
  std::vector<BroadcastCase> cases;
  for (const auto& b : conformanceBackends()) {
    for (int n : kSizes) {
      for (const Variant* v : variantsFor(b)) {
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, kBigCount}) {
          for (int root : {0, n - 1}) cases.push_back({b, n, v, bytes, root});
        }
      }
    }
  }
  return cases;
}

class BroadcastTest : public ::testing::TestWithParam<BroadcastCase> {};

TEST_P(BroadcastTest, EveryRankGetsTheRootsBytes) {
  const auto& c = GetParam();
  const Bytes want = patternBytes(c.root, c.bytes);
  std::vector<Bytes> bufs;
  for (int r = 0; r < c.size; ++r)
    bufs.push_back(r == c.root ? want : patternBytes(r + 100, c.bytes));
  auto statuses = runOn({c.backend, c.size, c.variant}, [&](int r, Backend& b, Backend::Done done) {
    b.broadcast(bufs[r].data(), c.bytes, c.root, std::move(done));
  });
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < c.size; ++r) {
    EXPECT_TRUE(sameBytes(bufs[r].data(), want.data(), c.bytes)) << "rank " << r;
  }
}

std::string caseName(const BroadcastCase& c) {
  return c.backend + "_n" + std::to_string(c.size) + "_" + c.variant->name + "_b" +
         std::to_string(c.bytes) + "_root" + std::to_string(c.root);
}
void PrintTo(const BroadcastCase& c, std::ostream* os) { *os << caseName(c); }

INSTANTIATE_TEST_SUITE_P(Conformance, BroadcastTest, ::testing::ValuesIn(broadcastCases()),
                         [](const ::testing::TestParamInfo<BroadcastCase>& i) {
                           return caseName(i.param);
                         });

// --- allgatherv --------------------------------------------------------------

struct AllgathervCase {
  std::string backend;
  int size;
  const Variant* variant;
  std::string pattern;  // equal | uneven | empty | inplace | big
};

std::vector<size_t> allgatherBytes(const std::string& pattern, int n) {
  static const size_t kUneven[] = {0, 13, 1, 250};
  std::vector<size_t> bytes(n);
  for (int i = 0; i < n; ++i) {
    if (pattern == "equal") bytes[i] = 100;
    if (pattern == "uneven" || pattern == "inplace") bytes[i] = kUneven[i];
    if (pattern == "empty") bytes[i] = 0;
    if (pattern == "big") bytes[i] = kBigCount + static_cast<size_t>(i);
  }
  return bytes;
}

std::vector<AllgathervCase> allgathervCases() {
  std::vector<AllgathervCase> cases;
  for (const auto& b : conformanceBackends()) {
    for (int n : kSizes) {
      for (const Variant* v : variantsFor(b)) {
        for (const char* p : {"equal", "uneven", "empty", "inplace"}) cases.push_back({b, n, v, p});
      }
      cases.push_back({b, n, &kAuto, "big"});
    }
  }
  return cases;
}

class AllgathervTest : public ::testing::TestWithParam<AllgathervCase> {};

TEST_P(AllgathervTest, EveryRankGetsEveryBlock) {
  const auto& c = GetParam();
  const auto sizes = allgatherBytes(c.pattern, c.size);
  std::vector<size_t> offsets(c.size, 0);
  for (int r = 1; r < c.size; ++r) offsets[r] = offsets[r - 1] + sizes[r - 1];
  const size_t total = offsets.back() + sizes.back();
  Bytes want;
  std::vector<Bytes> ins;
  for (int r = 0; r < c.size; ++r) {
    ins.push_back(patternBytes(r, sizes[r]));
    want.insert(want.end(), ins[r].begin(), ins[r].end());
  }
  const bool in_place = c.pattern == "inplace";
  std::vector<Bytes> outs;
  for (int r = 0; r < c.size; ++r) {
    outs.push_back(Bytes(total, std::byte{0x77}));
    if (in_place) std::copy(ins[r].begin(), ins[r].end(), outs[r].begin() + offsets[r]);
  }
  auto statuses = runOn({c.backend, c.size, c.variant}, [&](int r, Backend& b, Backend::Done done) {
    const void* in =
        in_place ? static_cast<const void*>(outs[r].data() + offsets[r]) : ins[r].data();
    b.allgatherv(in, sizes[r], outs[r].data(), sizes, std::move(done));
  });
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < c.size; ++r) {
    EXPECT_TRUE(sameBytes(outs[r].data(), want.data(), total)) << "rank " << r;
  }
}

std::string caseName(const AllgathervCase& c) {
  return c.backend + "_n" + std::to_string(c.size) + "_" + c.variant->name + "_" + c.pattern;
}
void PrintTo(const AllgathervCase& c, std::ostream* os) { *os << caseName(c); }

INSTANTIATE_TEST_SUITE_P(Conformance, AllgathervTest, ::testing::ValuesIn(allgathervCases()),
                         [](const ::testing::TestParamInfo<AllgathervCase>& i) {
                           return caseName(i.param);
                         });

// --- alltoallv ---------------------------------------------------------------

struct AlltoallvCase {
  std::string backend;
  int size;
  std::string pattern;  // equal | uneven | big
};

size_t alltoallBytes(const std::string& pattern, int from, int to) {
  if (pattern == "equal") return 64;
  if (pattern == "big") return (size_t{1} << 18) + static_cast<size_t>(from * 3 + to);
  return static_cast<size_t>((from * 7 + to * 3) % 11);  // includes empty blocks
}

std::vector<AlltoallvCase> alltoallvCases() {
  std::vector<AlltoallvCase> cases;
  for (const auto& b : conformanceBackends()) {
    for (int n : kSizes) {
      for (const char* p : {"equal", "uneven", "big"}) cases.push_back({b, n, p});
    }
  }
  return cases;
}

class AlltoallvTest : public ::testing::TestWithParam<AlltoallvCase> {};

TEST_P(AlltoallvTest, EveryBlockLandsAtItsDestination) {
  const auto& c = GetParam();
  const int n = c.size;
  std::vector<std::vector<size_t>> send(n, std::vector<size_t>(n)), recv(n, std::vector<size_t>(n));
  std::vector<Bytes> ins(n), outs(n), wants(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      send[i][j] = alltoallBytes(c.pattern, i, j);
      recv[i][j] = alltoallBytes(c.pattern, j, i);
      Bytes block = patternBytes(i, send[i][j], static_cast<uint64_t>(j) + 1);
      ins[i].insert(ins[i].end(), block.begin(), block.end());
    }
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      Bytes block = patternBytes(j, send[j][i], static_cast<uint64_t>(i) + 1);
      wants[i].insert(wants[i].end(), block.begin(), block.end());
    }
    outs[i].assign(wants[i].size(), std::byte{0x33});
  }
  auto statuses = runOn({c.backend, n, &kAuto}, [&](int r, Backend& b, Backend::Done done) {
    b.alltoallv(ins[r].data(), send[r], outs[r].data(), recv[r], std::move(done));
  });
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(sameBytes(outs[r].data(), wants[r].data(), wants[r].size())) << "rank " << r;
  }
}

std::string caseName(const AlltoallvCase& c) {
  return c.backend + "_n" + std::to_string(c.size) + "_" + c.pattern;
}
void PrintTo(const AlltoallvCase& c, std::ostream* os) { *os << caseName(c); }

INSTANTIATE_TEST_SUITE_P(Conformance, AlltoallvTest, ::testing::ValuesIn(alltoallvCases()),
                         [](const ::testing::TestParamInfo<AlltoallvCase>& i) {
                           return caseName(i.param);
                         });

// --- barrier and ordering ----------------------------------------------------

struct GroupCase {
  std::string backend;
  int size;
};

std::vector<GroupCase> groupCases() {
  std::vector<GroupCase> cases;
  for (const auto& b : conformanceBackends()) {
    for (int n : kSizes) cases.push_back({b, n});
  }
  return cases;
}

std::string caseName(const GroupCase& c) { return c.backend + "_n" + std::to_string(c.size); }
void PrintTo(const GroupCase& c, std::ostream* os) { *os << caseName(c); }

class GroupTest : public ::testing::TestWithParam<GroupCase> {};

// No rank leaves a barrier before every rank has entered it.
TEST_P(GroupTest, BarrierWaitsForEveryRank) {
  const auto& c = GetParam();
  for (int round = 0; round < 10; ++round) {
    std::vector<std::atomic<bool>> entered(c.size);
    std::atomic<int> early{0};
    auto statuses = runOn({c.backend, c.size, &kAuto}, [&](int r, Backend& b, Backend::Done done) {
      entered[r] = true;
      b.barrier([&, done = std::move(done)](Status s) {
        for (auto& e : entered) {
          if (!e) ++early;
        }
        done(std::move(s));
      });
    });
    ASSERT_TRUE(allOk(statuses));
    EXPECT_EQ(early.load(), 0) << "round " << round;
  }
}

// Many collectives of every kind posted back to back without waiting run in
// posting order and all give the right results.
TEST_P(GroupTest, BackToBackCollectivesCompleteInOrder) {
  const auto& c = GetParam();
  const int n = c.size;
  constexpr int kRounds = 3;
  const size_t small = 100, big = 300000;
  struct RankData {
    Bytes small_sum, big_max, bcast, gather_out;
    std::vector<int> order;
  };
  std::vector<RankData> d(n);
  const std::vector<size_t> gather_sizes(n, 1000);
  for (int r = 0; r < n; ++r) d[r].gather_out.resize(1000 * n);
  std::vector<Bytes> gather_in;
  for (int r = 0; r < n; ++r) gather_in.push_back(patternBytes(r, 1000, 9));

  Status why;
  PeerGroup* g = Groups::instance().get({c.backend, n, &kAuto}, &why);
  ASSERT_NE(g, nullptr) << why.toString();
  std::mutex mu;
  const int kPerRound = 4;
  auto all = std::make_shared<Completions>(n * kRounds * kPerRound);
  std::vector<std::vector<Bytes>> results(n);
  for (int round = 0; round < kRounds; ++round) {
    for (int r = 0; r < n; ++r) {
      results[r].push_back(makeInput(DataType::kInt32, ReduceOp::kSum, r + round * 10, small));
      results[r].push_back(makeInput(DataType::kFloat32, ReduceOp::kMax, r + round * 10, big));
      results[r].push_back(r == round % n ? patternBytes(round, 5000) : Bytes(5000));
    }
  }
  for (int round = 0; round < kRounds; ++round) {
    for (int r = 0; r < n; ++r) {
      Backend& b = g->at(r);
      const int base = (round * n + r) * kPerRound;
      auto track = [&, r, base](int k) {
        return [&, r, k, base, slot = all->slot(base + k, all)](Status s) {
          {
            std::lock_guard<std::mutex> lock(mu);
            d[r].order.push_back(base + k);
          }
          slot(std::move(s));
        };
      };
      b.allreduce(results[r][round * 3].data(), small, DataType::kInt32, ReduceOp::kSum, track(0));
      b.allreduce(results[r][round * 3 + 1].data(), big, DataType::kFloat32, ReduceOp::kMax,
                  track(1));
      b.broadcast(results[r][round * 3 + 2].data(), 5000, round % n, track(2));
      b.allgatherv(gather_in[r].data(), 1000, d[r].gather_out.data(), gather_sizes, track(3));
    }
  }
  auto statuses = all->wait(60s);
  if (!allOk(statuses)) Groups::instance().drop({c.backend, n, &kAuto});
  ASSERT_TRUE(allOk(statuses));
  for (int r = 0; r < n; ++r) {
    std::vector<int> sorted = d[r].order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(d[r].order, sorted) << "rank " << r << " completed out of order";
    for (int round = 0; round < kRounds; ++round) {
      // Reference for ranks shifted by round*10 (the inputs above).
      Bytes want_small(small * 4), want_big(big * 4);
      for (size_t i = 0; i < small; ++i) {
        int64_t acc = 0;
        for (int q = 0; q < n; ++q)
          acc += inputValue(ReduceOp::kSum, DataType::kInt32, q + round * 10, i);
        storeValue(DataType::kInt32, want_small.data(), i, acc);
      }
      for (size_t i = 0; i < big; ++i) {
        int64_t acc = inputValue(ReduceOp::kMax, DataType::kFloat32, round * 10, i);
        for (int q = 1; q < n; ++q)
          acc = std::max(acc, inputValue(ReduceOp::kMax, DataType::kFloat32, q + round * 10, i));
        storeValue(DataType::kFloat32, want_big.data(), i, acc);
      }
      EXPECT_TRUE(sameBytes(results[r][round * 3].data(), want_small.data(), want_small.size()));
      EXPECT_TRUE(sameBytes(results[r][round * 3 + 1].data(), want_big.data(), want_big.size()));
      Bytes want_b = patternBytes(round, 5000);
      EXPECT_TRUE(sameBytes(results[r][round * 3 + 2].data(), want_b.data(), 5000));
    }
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(sameBytes(d[r].gather_out.data() + q * 1000, gather_in[q].data(), 1000));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Conformance, GroupTest, ::testing::ValuesIn(groupCases()),
                         [](const ::testing::TestParamInfo<GroupCase>& i) {
                           return caseName(i.param);
                         });

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AllreduceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ReducescatterTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BroadcastTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AllgathervTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AlltoallvTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GroupTest);

}  // namespace
}  // namespace kolo::testing_backend
