// The nccl backend's call plans (agent/backends/nccl/call_plan.h), checked
// without a GPU by simulating NCCL's semantics over host buffers for n ranks:
// every rank issues the same collective calls in the same order, send/recv
// pairs match, and the simulated result is the collective's.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "agent/backends/nccl/call_plan.h"

namespace kolo::nccl {
namespace {

using Bytes = std::vector<unsigned char>;

Bytes pattern(int rank, size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(rank * 41 + i * 7 + 1);
  return b;
}

std::vector<std::vector<size_t>> sizeCases(int n) {
  std::vector<std::vector<size_t>> out;
  out.push_back(std::vector<size_t>(n, 100));                       // even
  out.push_back(std::vector<size_t>(n, 0));                         // nothing
  std::vector<size_t> uneven(n);
  for (int i = 0; i < n; ++i) uneven[i] = static_cast<size_t>((i * 5 + 2) % 7) * 10;  // one 0
  out.push_back(uneven);
  return out;
}

void expectSameCollectiveSequence(const std::vector<std::vector<Call>>& plans) {
  for (size_t r = 1; r < plans.size(); ++r) {
    ASSERT_EQ(plans[r].size(), plans[0].size()) << "rank " << r;
    for (size_t k = 0; k < plans[0].size(); ++k) {
      EXPECT_EQ(plans[r][k].kind, plans[0][k].kind) << "rank " << r << " call " << k;
      EXPECT_EQ(plans[r][k].peer, plans[0][k].peer) << "rank " << r << " call " << k;
      EXPECT_EQ(plans[r][k].count, plans[0][k].count) << "rank " << r << " call " << k;
    }
  }
}

TEST(NcclCallPlan, AllgathervGathersEveryBlockInRankOrder) {
  for (int n : {1, 2, 3, 4}) {
    for (const auto& rb : sizeCases(n)) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " b0=" + std::to_string(rb[0]) +
                     " in_place=" + std::to_string(in_place));
        const size_t total = std::accumulate(rb.begin(), rb.end(), size_t{0});
        std::vector<size_t> off(n, 0);
        for (int i = 1; i < n; ++i) off[i] = off[i - 1] + rb[i - 1];
        std::vector<Bytes> in(n), out(n, Bytes(total, 0xEE));
        std::vector<std::vector<Call>> plans;
        for (int r = 0; r < n; ++r) {
          in[r] = pattern(r, rb[r]);
          if (in_place) std::memcpy(out[r].data() + off[r], in[r].data(), rb[r]);
          plans.push_back(planAllgatherv(r, rb));
        }
        expectSameCollectiveSequence(plans);
        auto inOf = [&](int r) -> const unsigned char* {
          return in_place ? out[r].data() + off[r] : in[r].data();
        };
        for (size_t k = 0; k < plans[0].size(); ++k) {
          const Call& c = plans[0][k];
          if (c.kind == Call::kAllGather) {
            Bytes gathered;
            for (int i = 0; i < n; ++i) gathered.insert(gathered.end(), inOf(i), inOf(i) + c.count);
            for (int r = 0; r < n; ++r) out[r] = gathered;
          } else {
            ASSERT_EQ(c.kind, Call::kBroadcast);
            const Call& root_call = plans[c.peer][k];
            ASSERT_TRUE(root_call.use_in);
            Bytes src(inOf(c.peer), inOf(c.peer) + c.count);
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(plans[r][k].out_offset, c.out_offset);
              EXPECT_EQ(plans[r][k].use_in, r == c.peer);
              std::memcpy(out[r].data() + c.out_offset, src.data(), c.count);
            }
          }
        }
        Bytes want;
        for (int i = 0; i < n; ++i) {
          Bytes p = pattern(i, rb[i]);
          want.insert(want.end(), p.begin(), p.end());
        }
        for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], want) << "rank " << r;
      }
    }
  }
}

TEST(NcclCallPlan, ReducescatterReducesEachBlockToItsOwner) {
  for (int n : {1, 2, 3, 4}) {
    for (const auto& rc : sizeCases(n)) {
      SCOPED_TRACE("n=" + std::to_string(n) + " c0=" + std::to_string(rc[0]));
      const size_t total = std::accumulate(rc.begin(), rc.end(), size_t{0});
      std::vector<size_t> off(n, 0);
      for (int i = 1; i < n; ++i) off[i] = off[i - 1] + rc[i - 1];
      std::vector<std::vector<int64_t>> in(n, std::vector<int64_t>(total));
      std::vector<std::vector<int64_t>> out(n);
      std::vector<std::vector<Call>> plans;
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < total; ++i) in[r][i] = static_cast<int64_t>(r * 1000 + i);
        out[r].assign(rc[r], -1);
        plans.push_back(planReducescatter(r, rc));
      }
      expectSameCollectiveSequence(plans);
      for (const Call& c : plans[0]) {
        if (c.kind == Call::kReduceScatter) {
          for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < c.count; ++i) {
              int64_t s = 0;
              for (int j = 0; j < n; ++j) s += in[j][r * c.count + i];
              out[r][i] = s;
            }
          }
        } else {
          ASSERT_EQ(c.kind, Call::kReduce);
          ASSERT_EQ(c.count, out[c.peer].size());
          for (size_t i = 0; i < c.count; ++i) {
            int64_t s = 0;
            for (int j = 0; j < n; ++j) s += in[j][c.in_offset + i];
            out[c.peer][i] = s;
          }
        }
      }
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < rc[r]; ++i) {
          int64_t want = 0;
          for (int j = 0; j < n; ++j) want += in[j][off[r] + i];
          ASSERT_EQ(out[r][i], want) << "rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST(NcclCallPlan, AlltoallvSendsAndReceivesMatchPairwise) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto sz = [](int from, int to) { return static_cast<size_t>((from * 3 + to * 7) % 5) * 11; };
    std::vector<std::vector<size_t>> sb(n, std::vector<size_t>(n)), rb(n, std::vector<size_t>(n));
    std::vector<Bytes> in(n), out(n);
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p) {
        sb[r][p] = sz(r, p);
        rb[r][p] = sz(p, r);
        Bytes blk = pattern(r * 10 + p, sb[r][p]);
        in[r].insert(in[r].end(), blk.begin(), blk.end());
      }
      out[r].assign(std::accumulate(rb[r].begin(), rb[r].end(), size_t{0}), 0xEE);
    }
    // Pair every send with the peer's receive from this rank.
    for (int r = 0; r < n; ++r) {
      for (const Call& s : planAlltoallv(sb[r], rb[r])) {
        if (s.kind != Call::kSend) continue;
        int matches = 0;
        for (const Call& v : planAlltoallv(sb[s.peer], rb[s.peer])) {
          if (v.kind == Call::kRecv && v.peer == r) {
            ++matches;
            ASSERT_EQ(v.count, s.count);
            std::memcpy(out[s.peer].data() + v.out_offset, in[r].data() + s.in_offset, s.count);
          }
        }
        EXPECT_EQ(matches, 1) << "send " << r << "->" << s.peer;
      }
    }
    for (int r = 0; r < n; ++r) {
      Bytes want;
      for (int p = 0; p < n; ++p) {
        Bytes blk = pattern(p * 10 + r, rb[r][p]);
        want.insert(want.end(), blk.begin(), blk.end());
      }
      EXPECT_EQ(out[r], want) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace kolo::nccl
