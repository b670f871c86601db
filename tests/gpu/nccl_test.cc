// The NCCL backend over device buffers: every collective of the Backend
// interface checked bit for bit against the references of the backend
// conformance suite (tests/backend/test_util.h), for groups of 1..4 ranks as
// threads of this process, one GPU per rank (NCCL refuses two ranks of one
// communicator on one GPU), so a group of n skips on machines with fewer
// than n GPUs. Plus the failure behaviour: abort, and a peer that never
// joins. Everything skips without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "agent/backends/nccl/factory.h"
#include "agent/gpu/device.h"
#include "tests/backend/test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kolo::gpu {
namespace {

using testing_backend::allOk;
using testing_backend::Bytes;
using testing_backend::Completions;
using testing_backend::makeInput;
using testing_backend::makeReference;
using testing_backend::patternBytes;
using namespace std::chrono_literals;

class NcclGroup {
 public:
  static StatusOr<std::unique_ptr<NcclGroup>> create(int n, std::chrono::milliseconds timeout) {
    auto g = std::unique_ptr<NcclGroup>(new NcclGroup());
    g->b_.resize(n);
    std::vector<Status> st(n);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        BackendOptions o;
        o.rank = r;
        o.size = n;
        o.timeout = timeout;
        o.key_prefix = "test/nccl";
        o.name = "nccl/r" + std::to_string(r);
        auto b = createNcclBackend(o, g->kv_, r);
        if (b.isOk()) g->b_[r] = std::move(b).value();
        else st[r] = b.status();
      });
    }
    for (auto& t : ts) t.join();
    for (auto& s : st) if (!s.isOk()) return s;
    return g;
  }
  int size() const { return static_cast<int>(b_.size()); }
  Backend& at(int r) { return *b_[r]; }
  std::vector<Status> run(const std::function<void(int, Backend&, Backend::Done)>& post) {
    auto c = std::make_shared<Completions>(size());
    for (int r = 0; r < size(); ++r) post(r, at(r), c->slot(r, c));
    return c->wait(120s);
  }

 private:
  NcclGroup() = default;
  InMemoryKvStore kv_;
  std::vector<std::unique_ptr<Backend>> b_;
};

// A device copy of `host` on device `dev` (size >= 1 byte so pointers are valid).
DeviceBuffer toDevice(int dev, const void* host, size_t bytes, size_t capacity = 0) {
  EXPECT_TRUE(setDevice(dev).isOk());
  auto b = DeviceBuffer::allocate(std::max<size_t>({bytes, capacity, 1}));
  EXPECT_TRUE(b.isOk()) << b.status().toString();
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(b->data(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  return std::move(b).value();
}

Bytes toHost(const void* dev, size_t bytes) {
  Bytes h(bytes);
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

class NcclBackendTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    KOLO_REQUIRE_GPU();
    const int n = GetParam();
    const int have = deviceCount().value();
    if (have < n) GTEST_SKIP() << "skipped: " << n << " ranks need " << n << " GPUs, have " << have;
    auto g = NcclGroup::create(n, 60s);
    ASSERT_TRUE(g.isOk()) << g.status().toString();
    group_ = std::move(g).value();
  }
  std::unique_ptr<NcclGroup> group_;
};

TEST_P(NcclBackendTest, AllreduceEveryTypeAndOp) {
  const int n = group_->size();
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 20) + 3}) {
        SCOPED_TRACE(std::string(dataTypeName(t)) + " " + std::string(reduceOpName(op)) + " count=" + std::to_string(count));
        std::vector<DeviceBuffer> bufs;
        for (int r = 0; r < n; ++r) {
          Bytes in = makeInput(t, op, r, count);
          bufs.push_back(toDevice(r, in.data(), in.size()));
        }
        auto st = group_->run([&](int r, Backend& b, Backend::Done d) {
          b.allreduce(bufs[r].data(), count, t, op, std::move(d));
        });
        ASSERT_TRUE(allOk(st));
        const Bytes want = makeReference(t, op, n, count);
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(testing_backend::sameBytes(toHost(bufs[r].data(), want.size()).data(), want.data(), want.size()))
              << "rank " << r;
        }
      }
    }
  }
}

TEST_P(NcclBackendTest, BroadcastFromEveryRoot) {
  const int n = group_->size();
  for (int root = 0; root < n; ++root) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000003}}) {
      std::vector<DeviceBuffer> bufs;
      for (int r = 0; r < n; ++r) {
        Bytes in = patternBytes(r, bytes);
        bufs.push_back(toDevice(r, in.data(), in.size()));
      }
      auto st = group_->run([&](int r, Backend& b, Backend::Done d) { b.broadcast(bufs[r].data(), bytes, root, std::move(d)); });
      ASSERT_TRUE(allOk(st));
      const Bytes want = patternBytes(root, bytes);
      for (int r = 0; r < n; ++r)
        EXPECT_TRUE(testing_backend::sameBytes(toHost(bufs[r].data(), bytes).data(), want.data(), bytes)) << "rank " << r;
    }
  }
}

TEST_P(NcclBackendTest, AllgathervEvenUnevenAndInPlace) {
  const int n = group_->size();
  for (const char* pattern : {"even", "uneven", "inplace"}) {
    SCOPED_TRACE(pattern);
    std::vector<size_t> rb(n);
    for (int i = 0; i < n; ++i) rb[i] = std::string(pattern) == "uneven" ? (i * 5 + 2) % 7 * 1000 : 4096;
    const size_t total = std::accumulate(rb.begin(), rb.end(), size_t{0});
    std::vector<size_t> off(n, 0);
    for (int i = 1; i < n; ++i) off[i] = off[i - 1] + rb[i - 1];
    std::vector<DeviceBuffer> ins, outs;
    for (int r = 0; r < n; ++r) {
      Bytes in = patternBytes(r, rb[r]);
      ins.push_back(toDevice(r, in.data(), in.size()));
      outs.push_back(toDevice(r, nullptr, 0, total));
      if (std::string(pattern) == "inplace" && rb[r] > 0) {
        ASSERT_EQ(cudaMemcpy(outs[r].as<char>() + off[r], in.data(), rb[r], cudaMemcpyHostToDevice), cudaSuccess);
      }
    }
    auto st = group_->run([&](int r, Backend& b, Backend::Done d) {
      const void* in = std::string(pattern) == "inplace" ? outs[r].as<char>() + off[r] : ins[r].data();
      b.allgatherv(in, rb[r], outs[r].data(), rb, std::move(d));
    });
    ASSERT_TRUE(allOk(st));
    Bytes want;
    for (int i = 0; i < n; ++i) {
      Bytes p = patternBytes(i, rb[i]);
      want.insert(want.end(), p.begin(), p.end());
    }
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(testing_backend::sameBytes(toHost(outs[r].data(), total).data(), want.data(), total)) << "rank " << r;
  }
}

TEST_P(NcclBackendTest, ReducescatterEvenUnevenAndInPlace) {
  const int n = group_->size();
  for (const char* pattern : {"even", "uneven", "inplace"}) {
    for (auto [t, op] : {std::pair{DataType::kFloat32, ReduceOp::kSum}, std::pair{DataType::kInt8, ReduceOp::kMax},
                         std::pair{DataType::kBFloat16, ReduceOp::kMin}, std::pair{DataType::kInt64, ReduceOp::kProduct}}) {
      SCOPED_TRACE(std::string(pattern) + " " + std::string(dataTypeName(t)) + " " + std::string(reduceOpName(op)));
      const size_t es = dataTypeSize(t);
      std::vector<size_t> rc(n);
      for (int i = 0; i < n; ++i) rc[i] = std::string(pattern) == "uneven" ? (i * 5 + 2) % 7 * 100 : 600;
      const size_t total = std::accumulate(rc.begin(), rc.end(), size_t{0});
      std::vector<size_t> off(n, 0);
      for (int i = 1; i < n; ++i) off[i] = off[i - 1] + rc[i - 1];
      std::vector<DeviceBuffer> ins, outs;
      for (int r = 0; r < n; ++r) {
        Bytes in = makeInput(t, op, r, total);
        ins.push_back(toDevice(r, in.data(), in.size()));
        outs.push_back(toDevice(r, nullptr, 0, rc[r] * es));
      }
      auto st = group_->run([&](int r, Backend& b, Backend::Done d) {
        void* out = std::string(pattern) == "inplace" ? ins[r].as<char>() + off[r] * es : outs[r].data();
        b.reducescatter(ins[r].data(), out, rc, t, op, std::move(d));
      });
      ASSERT_TRUE(allOk(st));
      for (int r = 0; r < n; ++r) {
        const Bytes want = makeReference(t, op, n, rc[r], off[r]);
        const void* got = std::string(pattern) == "inplace" ? ins[r].as<char>() + off[r] * es : outs[r].data();
        EXPECT_TRUE(testing_backend::sameBytes(toHost(got, want.size()).data(), want.data(), want.size())) << "rank " << r;
      }
    }
  }
}

TEST_P(NcclBackendTest, AlltoallvUneven) {
  const int n = group_->size();
  auto sz = [](int from, int to) { return static_cast<size_t>((from * 3 + to * 7) % 5) * 333; };
  std::vector<DeviceBuffer> ins, outs;
  std::vector<std::vector<size_t>> sb(n, std::vector<size_t>(n)), rb(n, std::vector<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Bytes in;
    for (int p = 0; p < n; ++p) {
      sb[r][p] = sz(r, p);
      rb[r][p] = sz(p, r);
      Bytes blk = patternBytes(r, sb[r][p], static_cast<uint64_t>(p) + 1);
      in.insert(in.end(), blk.begin(), blk.end());
    }
    ins.push_back(toDevice(r, in.data(), in.size()));
    outs.push_back(toDevice(r, nullptr, 0, std::accumulate(rb[r].begin(), rb[r].end(), size_t{0})));
  }
  auto st = group_->run([&](int r, Backend& b, Backend::Done d) { b.alltoallv(ins[r].data(), sb[r], outs[r].data(), rb[r], std::move(d)); });
  ASSERT_TRUE(allOk(st));
  for (int r = 0; r < n; ++r) {
    Bytes want;
    for (int p = 0; p < n; ++p) {
      Bytes blk = patternBytes(p, rb[r][p], static_cast<uint64_t>(r) + 1);
      want.insert(want.end(), blk.begin(), blk.end());
    }
    EXPECT_TRUE(testing_backend::sameBytes(toHost(outs[r].data(), want.size()).data(), want.data(), want.size())) << "rank " << r;
  }
}

TEST_P(NcclBackendTest, BarrierAndAbort) {
  ASSERT_TRUE(allOk(group_->run([](int, Backend& b, Backend::Done d) { b.barrier(std::move(d)); })));
  // After abort() every rank's later collectives fail at once with the reason.
  for (int r = 0; r < group_->size(); ++r) group_->at(r).abort(aborted("rank 9 left the job"));
  auto st = group_->run([](int, Backend& b, Backend::Done d) { b.barrier(std::move(d)); });
  for (int r = 0; r < group_->size(); ++r) {
    EXPECT_EQ(st[r].code(), Code::kAborted) << st[r].toString();
    EXPECT_NE(st[r].message().find("rank 9 left the job"), std::string::npos) << st[r].toString();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclBackendTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "n" + std::to_string(i.param); });

TEST(NcclBackendFailure, APeerThatNeverJoinsFailsCreationWithinTheTimeout) {
  KOLO_REQUIRE_GPU();
  InMemoryKvStore kv;
  BackendOptions o;
  o.rank = 0;
  o.size = 2;  // rank 1 never comes
  o.timeout = 3s;
  o.key_prefix = "test/lonely";
  const auto start = std::chrono::steady_clock::now();
  auto b = createNcclBackend(o, kv, 0);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kPeerFailure) << b.status().toString();
  EXPECT_NE(b.status().message().find("not up after 3000 ms"), std::string::npos) << b.status().toString();
  EXPECT_LT(took, 20s);
}

TEST(NcclBackendFailure, ANonRootWithoutTheUniqueIdFailsNamingRankZero) {
  KOLO_REQUIRE_GPU();
  InMemoryKvStore kv;
  BackendOptions o;
  o.rank = 1;
  o.size = 2;
  o.timeout = 500ms;
  o.key_prefix = "test/noroot";
  auto b = createNcclBackend(o, kv, 0);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kPeerFailure);
  EXPECT_EQ(b.status().message().rfind("agent rank 0 unreachable: no NCCL unique id under 'test/noroot/0'", 0), 0u)
      << b.status().toString();
}

}  // namespace
}  // namespace kolo::gpu
