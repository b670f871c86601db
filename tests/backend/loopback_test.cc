// The collective algorithms (collective.cc) and the point-to-point engine
// (p2p_backend.cc) over the loopback transport: ranks as backends of this
// process exchanging messages through an in-memory hub, no sockets. Exact
// references (test_util.h), so a wrong schedule or reduction shows at once.
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "agent/backends/loopback/loopback_transport.h"
#include "tests/backend/test_util.h"

namespace kolo {
namespace {

using namespace testing_backend;

class LoopbackGroup {
 public:
  explicit LoopbackGroup(int size, size_t small_message_bytes = 64 * 1024) {
    auto hub = std::make_shared<LoopbackHub>(size);
    backends_.resize(size);
    std::vector<Status> st(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        BackendOptions o;
        o.rank = r;
        o.size = size;
        o.name = "loopback/r" + std::to_string(r);
        o.timeout = std::chrono::milliseconds(20000);
        o.small_message_bytes = small_message_bytes;
        auto b = createLoopbackBackend(o, kv_, LoopbackTransportOptions{hub});
        if (b.isOk()) {
          backends_[r] = std::move(b).value();
        } else {
          st[r] = b.status();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& s : st) status_ = status_.isOk() ? s : status_;
  }
  const Status& status() const { return status_; }
  int size() const { return static_cast<int>(backends_.size()); }

  std::vector<Status> run(const std::function<void(int, Backend&, Backend::Done)>& post) {
    auto c = std::make_shared<Completions>(size());
    for (int r = 0; r < size(); ++r) post(r, *backends_[r], c->slot(r, c));
    return c->wait(std::chrono::seconds(30));
  }

 private:
  InMemoryKvStore kv_;
  std::vector<std::unique_ptr<Backend>> backends_;
  Status status_;
};

// Both allreduce algorithms (below and above the small-message switch
// point), with counts that do not divide evenly among the ranks.
TEST(Loopback, AllreduceMatchesTheReferenceOnBothAlgorithms) {
  for (int n : {2, 3, 4}) {
    LoopbackGroup g(n, /*small_message_bytes=*/4096);
    ASSERT_TRUE(g.status().isOk()) << g.status().toString();
    for (DataType t : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{70001}}) {
          std::vector<Bytes> bufs(n);
          for (int r = 0; r < n; ++r) bufs[r] = makeInput(t, op, r, count);
          auto st = g.run([&](int r, Backend& b, Backend::Done d) {
            b.allreduce(bufs[r].data(), count, t, op, std::move(d));
          });
          ASSERT_TRUE(allOk(st)) << n << " ranks, count " << count;
          const Bytes want = makeReference(t, op, n, count);
          for (int r = 0; r < n; ++r) {
            ASSERT_TRUE(sameBytes(bufs[r].data(), want.data(), want.size()))
                << n << " ranks, rank " << r << ", count " << count << ", " << dataTypeName(t);
          }
        }
      }
    }
  }
}

TEST(Loopback, AllgathervBroadcastReducescatterAndAlltoallv) {
  const int n = 3;
  LoopbackGroup g(n);
  ASSERT_TRUE(g.status().isOk()) << g.status().toString();

  // Allgatherv, uneven blocks (one empty).
  const std::vector<size_t> blocks = {5, 0, 100003};
  size_t total = 0;
  for (size_t b : blocks) total += b;
  std::vector<Bytes> in(n), out(n, Bytes(total));
  for (int r = 0; r < n; ++r) in[r] = patternBytes(r, blocks[r]);
  auto st = g.run([&](int r, Backend& b, Backend::Done d) {
    b.allgatherv(in[r].data(), in[r].size(), out[r].data(), blocks, std::move(d));
  });
  ASSERT_TRUE(allOk(st));
  for (int r = 0; r < n; ++r) {
    size_t off = 0;
    for (int a = 0; a < n; ++a) {
      ASSERT_TRUE(sameBytes(out[r].data() + off, in[a].data(), blocks[a]))
          << "rank " << r << " block " << a;
      off += blocks[a];
    }
  }

  // Broadcast from rank 1.
  const Bytes root = patternBytes(1, 300000, 7);
  std::vector<Bytes> bc(n, Bytes(root.size()));
  bc[1] = root;
  st = g.run([&](int r, Backend& b, Backend::Done d) {
    b.broadcast(bc[r].data(), bc[r].size(), 1, std::move(d));
  });
  ASSERT_TRUE(allOk(st));
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(sameBytes(bc[r].data(), root.data(), root.size())) << "rank " << r;

  // Reducescatter: rank r gets its block of the sum.
  const std::vector<size_t> counts = {10, 3, 20000};
  size_t count = 0;
  for (size_t c : counts) count += c;
  std::vector<Bytes> rs_in(n), rs_out(n);
  for (int r = 0; r < n; ++r) {
    rs_in[r] = makeInput(DataType::kFloat32, ReduceOp::kSum, r, count);
    rs_out[r] = Bytes(counts[r] * 4);
  }
  st = g.run([&](int r, Backend& b, Backend::Done d) {
    b.reducescatter(rs_in[r].data(), rs_out[r].data(), counts, DataType::kFloat32, ReduceOp::kSum,
                    std::move(d));
  });
  ASSERT_TRUE(allOk(st));
  const Bytes sum = makeReference(DataType::kFloat32, ReduceOp::kSum, n, count);
  size_t first = 0;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sameBytes(rs_out[r].data(), sum.data() + first * 4, counts[r] * 4)) << "rank " << r;
    first += counts[r];
  }

  // Alltoallv: rank s sends (s + 1) * (d + 2) bytes to rank d.
  std::vector<std::vector<size_t>> send(n, std::vector<size_t>(n)), recv(n, std::vector<size_t>(n));
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) send[s][d] = recv[d][s] = static_cast<size_t>((s + 1) * (d + 2));
  }
  std::vector<Bytes> a_in(n), a_out(n);
  for (int r = 0; r < n; ++r) {
    size_t sb = 0, rb = 0;
    for (int p = 0; p < n; ++p) {
      sb += send[r][p];
      rb += recv[r][p];
    }
    a_in[r] = patternBytes(r, sb, 3);
    a_out[r] = Bytes(rb);
  }
  st = g.run([&](int r, Backend& b, Backend::Done d) {
    b.alltoallv(a_in[r].data(), send[r], a_out[r].data(), recv[r], std::move(d));
  });
  ASSERT_TRUE(allOk(st));
  for (int d = 0; d < n; ++d) {
    size_t off = 0;
    for (int s = 0; s < n; ++s) {
      size_t src_off = 0;
      for (int p = 0; p < d; ++p) src_off += send[s][p];
      ASSERT_TRUE(sameBytes(a_out[d].data() + off, a_in[s].data() + src_off, recv[d][s]))
          << "from " << s << " to " << d;
      off += recv[d][s];
    }
  }
}

// Ranks that disagree on a broadcast's size: the engine fails the
// collective with a message naming both sides, instead of moving the wrong
// bytes (the transport reports what it really received).
TEST(Loopback, RanksThatDisagreeOnTheSizeFailWithAClearError) {
  LoopbackGroup g(2);
  ASSERT_TRUE(g.status().isOk()) << g.status().toString();
  Bytes big(64), small(32);
  auto st = g.run([&](int r, Backend& b, Backend::Done d) {
    if (r == 0) {
      b.broadcast(big.data(), big.size(), 0, std::move(d));
    } else {
      b.broadcast(small.data(), small.size(), 0, std::move(d));
    }
  });
  ASSERT_FALSE(st[1].isOk());
  EXPECT_NE(st[1].message().find("rank 0"), std::string::npos) << st[1].toString();
}

}  // namespace
}  // namespace kolo
