// A rank program for the integration tests of process sets and of grouped
// allgather / reducescatter. It drives libkolo through the C ABI and checks
// every result against a reference computed here from the members' global
// ranks.
//
//   kolo_check_sets sets      even and odd ranks (and {0, last}) as process
//                             sets: every collective on each set, the same
//                             names in flight on several sets at once, one
//                             set progressing while another has an op held
//                             back, and the process-set errors
//   kolo_check_sets grouped   grouped allgather and reducescatter on the
//                             global set, and a grouped membership mismatch
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/kolo.hpp"
#include "kolo/kolo_c.h"
#include "check_fail.h"

namespace {

int g_rank = -1, g_size = 0;

bool contains(const char* hay, const std::string& needle) { return std::string(hay).find(needle) != std::string::npos; }

// Element i of global rank r's tensors.
double value(int r, size_t i) { return (r + 1) * 10.0 + static_cast<double>(i % 7); }

int indexOf(const std::vector<int>& members, int r) {
  auto it = std::find(members.begin(), members.end(), r);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

// Rows of set rank k in a reducescatter of `rows` rows over n ranks.
int64_t blockRows(int64_t rows, int n, int k) { return rows / n + (k < rows % n ? 1 : 0); }
int64_t blockStart(int64_t rows, int n, int k) { return k * (rows / n) + std::min<int64_t>(k, rows % n); }

// Rows global rank r contributes to an allgather (0 included).
int64_t gatherRows(int r, int salt) { return (r + salt) % 3; }

// Every collective on set `ps` whose members are `m` (global, ascending);
// `tag` keeps names apart between calls. Returns 1 on failure (FAIL).
int runSuite(int32_t ps, const std::vector<int>& m, const std::string& tag, int* checks) {
  const int n = static_cast<int>(m.size());
  const int me = indexOf(m, g_rank);
  if (kolo_process_set_rank(ps) != me || kolo_process_set_size(ps) != n) {
    FAIL("%s: kolo_process_set_rank/size = %d/%d, want %d/%d", tag.c_str(), kolo_process_set_rank(ps),
         kolo_process_set_size(ps), me, n);
  }
  // allreduce: Sum, Average, Min, Max in float64, Sum in int32 (an empty one too).
  for (kolo_op_t op : {KOLO_SUM, KOLO_AVERAGE, KOLO_MIN, KOLO_MAX}) {
    const size_t len = 1001;
    std::vector<double> x(len), want(len);
    for (size_t i = 0; i < len; ++i) {
      x[i] = value(g_rank, i);
      double acc = op == KOLO_MIN ? 1e300 : op == KOLO_MAX ? -1e300 : 0;
      for (int r : m) {
        double v = value(r, i);
        acc = op == KOLO_MIN ? std::min(acc, v) : op == KOLO_MAX ? std::max(acc, v) : acc + v;
      }
      want[i] = op == KOLO_AVERAGE ? acc / n : acc;
    }
    int64_t shape[1] = {static_cast<int64_t>(len)};
    std::string name = "ar." + std::to_string(op);  // the same names on every set
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_allreduce_async(ps, name.c_str(), x.data(), x.data(), 1, shape, KOLO_FLOAT64, op,
                                               1.0, 1.0, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (st != KOLO_OK) FAIL("%s %s: %s: %s", tag.c_str(), name.c_str(), kolo_status_string(st), kolo_last_error());
    for (size_t i = 0; i < len; ++i) {
      if (x[i] != want[i]) FAIL("%s %s[%zu] = %.17g, want %.17g", tag.c_str(), name.c_str(), i, x[i], want[i]);
    }
    ++*checks;
  }
  for (int64_t len : {int64_t{0}, int64_t{4099}}) {
    std::vector<int32_t> x(static_cast<size_t>(len) + 1);
    for (int64_t i = 0; i < len; ++i) x[i] = static_cast<int32_t>(value(g_rank, i));
    int64_t shape[1] = {len};
    std::string name = "ar.i32." + std::to_string(len);
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_allreduce_async(ps, name.c_str(), x.data(), x.data(), 1, shape, KOLO_INT32, KOLO_SUM,
                                               1.0, 1.0, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (st != KOLO_OK) FAIL("%s %s: %s", tag.c_str(), name.c_str(), kolo_last_error());
    for (int64_t i = 0; i < len; ++i) {
      int32_t want = 0;
      for (int r : m) want += static_cast<int32_t>(value(r, i));
      if (x[i] != want) FAIL("%s %s[%lld] = %d, want %d", tag.c_str(), name.c_str(), (long long)i, x[i], want);
    }
    ++*checks;
  }
  // allgather with uneven first dimensions (0 rows included), in set order.
  {
    const int64_t cols = 3;
    const int64_t rows = gatherRows(g_rank, 0);
    std::vector<int32_t> x(static_cast<size_t>(rows * cols) + 1);
    for (int64_t i = 0; i < rows * cols; ++i) x[i] = g_rank * 100 + static_cast<int32_t>(i);
    int64_t shape[2] = {rows, cols};
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_allgather_async(ps, "ag", x.data(), 2, shape, KOLO_INT32, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (st != KOLO_OK) FAIL("%s ag: %s", tag.c_str(), kolo_last_error());
    void* data = nullptr;
    int64_t dim0 = 0;
    if (kolo_result(h, &data, &dim0) != KOLO_OK) FAIL("%s ag result: %s", tag.c_str(), kolo_last_error());
    std::vector<int32_t> want;
    for (int r : m) {
      for (int64_t i = 0; i < gatherRows(r, 0) * cols; ++i) want.push_back(r * 100 + static_cast<int32_t>(i));
    }
    if (dim0 * cols != static_cast<int64_t>(want.size()) ||
        (!want.empty() && std::memcmp(data, want.data(), want.size() * sizeof(int32_t)) != 0)) {
      FAIL("%s ag: %lld rows, want %zu, or wrong values", tag.c_str(), (long long)dim0, want.size() / cols);
    }
    kolo_release(h);
    ++*checks;
  }
  // broadcast in place and out of place from every member (a global rank).
  for (int root : m) {
    const size_t len = 777;
    std::vector<float> x(len), y(len, -1.0f), in_before;
    for (size_t i = 0; i < len; ++i) x[i] = static_cast<float>(value(g_rank, i));
    in_before = x;
    int64_t shape[1] = {static_cast<int64_t>(len)};
    std::string name = "bc." + std::to_string(root);
    kolo_handle_t h1 = 0, h2 = 0;
    kolo_status_t st =
        kolo_ps_broadcast_oop_async(ps, (name + ".oop").c_str(), x.data(), y.data(), 1, shape, KOLO_FLOAT32, root, &h1);
    if (st == KOLO_OK) st = kolo_synchronize(h1, 60000);
    if (st != KOLO_OK) FAIL("%s %s.oop: %s", tag.c_str(), name.c_str(), kolo_last_error());
    if (x != in_before) FAIL("%s %s.oop: the input was written", tag.c_str(), name.c_str());
    st = kolo_ps_broadcast_async(ps, name.c_str(), x.data(), 1, shape, KOLO_FLOAT32, root, &h2);
    if (st == KOLO_OK) st = kolo_synchronize(h2, 60000);
    if (st != KOLO_OK) FAIL("%s %s: %s", tag.c_str(), name.c_str(), kolo_last_error());
    for (size_t i = 0; i < len; ++i) {
      float want = static_cast<float>(value(root, i));
      if (x[i] != want || y[i] != want) FAIL("%s %s[%zu] = %g / %g, want %g", tag.c_str(), name.c_str(), i, x[i], y[i], want);
    }
    ++*checks;
  }
  // reducescatter (Sum) with an uneven first dimension.
  {
    const int64_t rows = 2 * n + 1, cols = 5;
    std::vector<double> x(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = value(g_rank, i);
    const int64_t my_rows = blockRows(rows, n, me), start = blockStart(rows, n, me);
    std::vector<double> out(static_cast<size_t>(my_rows * cols) + 1, -1);
    int64_t shape[2] = {rows, cols};
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_reducescatter_async(ps, "rs", x.data(), out.data(), 2, shape, KOLO_FLOAT64, KOLO_SUM, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (st != KOLO_OK) FAIL("%s rs: %s", tag.c_str(), kolo_last_error());
    for (int64_t i = 0; i < my_rows * cols; ++i) {
      double want = 0;
      for (int r : m) want += value(r, static_cast<size_t>(start * cols + i));
      if (out[i] != want) FAIL("%s rs[%lld] = %g, want %g", tag.c_str(), (long long)i, out[i], want);
    }
    ++*checks;
  }
  // alltoall: set rank k sends (k + d) % 3 rows to set rank d.
  {
    std::vector<int64_t> splits(static_cast<size_t>(n));
    int64_t rows = 0;
    for (int d = 0; d < n; ++d) rows += splits[d] = (me + d) % 3;
    std::vector<int64_t> x(static_cast<size_t>(rows) + 1);
    {
      int64_t row = 0;
      for (int d = 0; d < n; ++d) {
        for (int64_t j = 0; j < splits[d]; ++j) x[row++] = g_rank * 1000 + d * 10 + j;
      }
    }
    int64_t shape[1] = {rows};
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_alltoall_async(ps, "a2a", x.data(), 1, shape, KOLO_INT64, splits.data(), &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (st != KOLO_OK) FAIL("%s a2a: %s", tag.c_str(), kolo_last_error());
    void* data = nullptr;
    int64_t dim0 = 0;
    if (kolo_result(h, &data, &dim0) != KOLO_OK) FAIL("%s a2a result: %s", tag.c_str(), kolo_last_error());
    std::vector<int64_t> want;
    for (int k = 0; k < n; ++k) {
      for (int64_t j = 0; j < (k + me) % 3; ++j) want.push_back(m[k] * 1000 + me * 10 + j);
    }
    if (dim0 != static_cast<int64_t>(want.size()) ||
        (!want.empty() && std::memcmp(data, want.data(), want.size() * sizeof(int64_t)) != 0)) {
      FAIL("%s a2a: %lld rows received, want %zu, or wrong values", tag.c_str(), (long long)dim0, want.size());
    }
    kolo_release(h);
    ++*checks;
  }
  // grouped allreduce (Average divides by the set's size).
  {
    std::vector<std::vector<double>> bufs(3);
    std::vector<std::string> names;
    std::vector<const char*> cn;
    std::vector<const void*> ins;
    std::vector<void*> outs;
    std::vector<int> nd(3, 1);
    std::vector<int64_t> lens = {5, 0, 300};
    std::vector<const int64_t*> sh;
    std::vector<kolo_dtype_t> dt(3, KOLO_FLOAT64);
    for (int k = 0; k < 3; ++k) {
      bufs[k].resize(static_cast<size_t>(lens[k]) + 1);
      for (int64_t i = 0; i < lens[k]; ++i) bufs[k][i] = value(g_rank, i + k);
      names.push_back("gar." + std::to_string(k));
    }
    for (int k = 0; k < 3; ++k) {
      cn.push_back(names[k].c_str());
      ins.push_back(bufs[k].data());
      outs.push_back(bufs[k].data());
      sh.push_back(&lens[k]);
    }
    kolo_handle_t hs[3] = {};
    kolo_status_t st = kolo_ps_grouped_allreduce_async(ps, 3, cn.data(), ins.data(), outs.data(), nd.data(), sh.data(),
                                                       dt.data(), KOLO_AVERAGE, 1.0, 1.0, hs);
    if (st != KOLO_OK) FAIL("%s gar: %s", tag.c_str(), kolo_last_error());
    for (kolo_handle_t h : hs) {
      if (kolo_synchronize(h, 60000) != KOLO_OK) FAIL("%s gar wait: %s", tag.c_str(), kolo_last_error());
    }
    for (int k = 0; k < 3; ++k) {
      for (int64_t i = 0; i < lens[k]; ++i) {
        double want = 0;
        for (int r : m) want += value(r, i + k);
        want /= n;
        if (bufs[k][i] != want) FAIL("%s gar.%d[%lld] = %g, want %g", tag.c_str(), k, (long long)i, bufs[k][i], want);
      }
    }
    ++*checks;
  }
  // grouped allgather (uneven, one member empty everywhere) and grouped reducescatter.
  {
    std::vector<std::vector<int32_t>> bufs(3);
    std::vector<std::string> names;
    std::vector<const char*> cn;
    std::vector<const void*> ins;
    std::vector<int> nd(3, 2);
    std::vector<std::vector<int64_t>> shapes(3);
    std::vector<const int64_t*> sh;
    std::vector<kolo_dtype_t> dt(3, KOLO_INT32);
    for (int k = 0; k < 3; ++k) {
      int64_t rows = k == 1 ? 0 : gatherRows(g_rank, k);
      shapes[k] = {rows, 2};
      bufs[k].resize(static_cast<size_t>(rows * 2) + 1);
      for (int64_t i = 0; i < rows * 2; ++i) bufs[k][i] = g_rank * 100 + k * 10 + static_cast<int32_t>(i);
      names.push_back("gag." + std::to_string(k));
    }
    for (int k = 0; k < 3; ++k) {
      cn.push_back(names[k].c_str());
      ins.push_back(bufs[k].data());
      sh.push_back(shapes[k].data());
    }
    kolo_handle_t hs[3] = {};
    kolo_status_t st = kolo_ps_grouped_allgather_async(ps, 3, cn.data(), ins.data(), nd.data(), sh.data(), dt.data(), hs);
    if (st != KOLO_OK) FAIL("%s gag: %s", tag.c_str(), kolo_last_error());
    for (int k = 0; k < 3; ++k) {
      if (kolo_synchronize(hs[k], 60000) != KOLO_OK) FAIL("%s gag wait: %s", tag.c_str(), kolo_last_error());
      void* data = nullptr;
      int64_t dim0 = 0;
      if (kolo_result(hs[k], &data, &dim0) != KOLO_OK) FAIL("%s gag result: %s", tag.c_str(), kolo_last_error());
      std::vector<int32_t> want;
      for (int r : m) {
        int64_t rows = k == 1 ? 0 : gatherRows(r, k);
        for (int64_t i = 0; i < rows * 2; ++i) want.push_back(r * 100 + k * 10 + static_cast<int32_t>(i));
      }
      if (dim0 * 2 != static_cast<int64_t>(want.size()) ||
          (!want.empty() && std::memcmp(data, want.data(), want.size() * sizeof(int32_t)) != 0)) {
        FAIL("%s gag.%d: %lld rows, want %zu, or wrong values", tag.c_str(), k, (long long)dim0, want.size() / 2);
      }
      kolo_release(hs[k]);
    }
    ++*checks;

    const int64_t rows[2] = {static_cast<int64_t>(n) + 2, 1};
    std::vector<std::vector<float>> x(2), out(2);
    std::vector<const void*> rin;
    std::vector<void*> rout;
    std::vector<int> rnd = {1, 1};
    std::vector<const int64_t*> rsh = {&rows[0], &rows[1]};
    std::vector<kolo_dtype_t> rdt(2, KOLO_FLOAT32);
    std::vector<std::string> rnames = {"grs.0", "grs.1"};
    std::vector<const char*> rcn = {rnames[0].c_str(), rnames[1].c_str()};
    for (int k = 0; k < 2; ++k) {
      x[k].resize(static_cast<size_t>(rows[k]));
      for (int64_t i = 0; i < rows[k]; ++i) x[k][i] = static_cast<float>(value(g_rank, i));
      out[k].assign(static_cast<size_t>(blockRows(rows[k], n, me)) + 1, -1.0f);
      rin.push_back(x[k].data());
      rout.push_back(out[k].data());
    }
    st = kolo_ps_grouped_reducescatter_async(ps, 2, rcn.data(), rin.data(), rout.data(), rnd.data(), rsh.data(),
                                             rdt.data(), KOLO_SUM, hs);
    if (st != KOLO_OK) FAIL("%s grs: %s", tag.c_str(), kolo_last_error());
    for (int k = 0; k < 2; ++k) {
      if (kolo_synchronize(hs[k], 60000) != KOLO_OK) FAIL("%s grs wait: %s", tag.c_str(), kolo_last_error());
      const int64_t start = blockStart(rows[k], n, me);
      for (int64_t i = 0; i < blockRows(rows[k], n, me); ++i) {
        float want = 0;
        for (int r : m) want += static_cast<float>(value(r, static_cast<size_t>(start + i)));
        if (out[k][i] != want) FAIL("%s grs.%d[%lld] = %g, want %g", tag.c_str(), k, (long long)i, out[k][i], want);
      }
    }
    ++*checks;
  }
  // compressed (fp16) allreduce: small integers stay exact.
  {
    std::vector<float> x(64);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((g_rank + 1) + static_cast<int>(i % 5));
    int64_t shape[1] = {64};
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_allreduce_compressed_async(ps, "cmp", x.data(), x.data(), 1, shape, KOLO_SUM, 1.0, 1.0,
                                                          KOLO_COMPRESS_FP16, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (st != KOLO_OK) FAIL("%s cmp: %s", tag.c_str(), kolo_last_error());
    for (size_t i = 0; i < x.size(); ++i) {
      float want = 0;
      for (int r : m) want += static_cast<float>((r + 1) + static_cast<int>(i % 5));
      if (x[i] != want) FAIL("%s cmp[%zu] = %g, want %g", tag.c_str(), i, x[i], want);
    }
    ++*checks;
  }
  if (kolo_ps_barrier(ps, 60000) != KOLO_OK) FAIL("%s barrier: %s", tag.c_str(), kolo_last_error());
  ++*checks;
  return 0;
}

int expectError(kolo_status_t st, kolo_status_t want, const std::string& needle, const std::string& what) {
  if (st != want || !contains(kolo_last_error(), needle)) {
    FAIL("%s: got %s \"%s\", want %s containing \"%s\"", what.c_str(), kolo_status_string(st), kolo_last_error(),
         kolo_status_string(want), needle.c_str());
  }
  return 0;
}

int runSets() {
  if (g_size < 3) FAIL("the sets check needs at least 3 ranks, got %d", g_size);
  int checks = 0;
  std::vector<int> even, odd;
  for (int r = 0; r < g_size; ++r) (r % 2 == 0 ? even : odd).push_back(r);
  // {0, last}, or {0, 1} where that would be the even set.
  const std::vector<int> edge = g_size == 3 ? std::vector<int>{0, 1} : std::vector<int>{0, g_size - 1};
  int32_t even_id = -1, odd_id = -1, edge_id = -1;
  // Odd ranks list theirs in reverse: the order does not matter.
  std::vector<int> odd_rev(odd.rbegin(), odd.rend());
  if (kolo_add_process_set(even.data(), static_cast<int>(even.size()), &even_id) != KOLO_OK ||
      kolo_add_process_set(odd_rev.data(), static_cast<int>(odd_rev.size()), &odd_id) != KOLO_OK ||
      kolo_add_process_set(edge.data(), 2, &edge_id) != KOLO_OK) {
    FAIL("kolo_add_process_set: %s", kolo_last_error());
  }
  if (even_id <= 0 || odd_id <= 0 || edge_id <= 0 || even_id == odd_id || odd_id == edge_id) {
    FAIL("set ids %d %d %d", even_id, odd_id, edge_id);
  }
  {
    int got[64] = {}, count = 0;
    if (kolo_process_set_ranks(odd_id, got, 64, &count) != KOLO_OK || count != static_cast<int>(odd.size()) ||
        !std::equal(odd.begin(), odd.end(), got)) {
      FAIL("kolo_process_set_ranks(odd) = %d ranks", count);
    }
    ++checks;
  }
  const bool is_even = g_rank % 2 == 0;
  const int32_t mine = is_even ? even_id : odd_id, other = is_even ? odd_id : even_id;
  const std::vector<int>& my_members = is_even ? even : odd;
  const std::vector<int>& other_members = is_even ? odd : even;

  // Every collective on this rank's set, then on {0, last} while the same
  // names are in flight... (runSuite waits for each op; the overlap below
  // puts the same name on two sets at once).
  if (runSuite(mine, my_members, is_even ? "even" : "odd", &checks) != 0) return 1;
  {
    // The same name in flight on two sets at once (this rank's set and, for
    // its members, {0, last}), and both complete.
    double a = g_rank + 1.0, b = g_rank + 1.0;
    int64_t one[1] = {1};
    kolo_handle_t ha = 0, hb = 0;
    if (kolo_ps_allreduce_async(mine, "both", &b, &b, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &hb) != KOLO_OK) {
      FAIL("same name on two sets: %s", kolo_last_error());
    }
    if (indexOf(edge, g_rank) >= 0) {
      if (kolo_ps_allreduce_async(edge_id, "both", &a, &a, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &ha) != KOLO_OK ||
          kolo_synchronize(ha, 60000) != KOLO_OK) {
        FAIL("same name on two sets (edge): %s", kolo_last_error());
      }
      const double want_a = edge[0] + edge[1] + 2.0;
      if (a != want_a) FAIL("same name on two sets: edge got %g, want %g", a, want_a);
    }
    if (kolo_synchronize(hb, 60000) != KOLO_OK) FAIL("same name on two sets: %s", kolo_last_error());
    double want_b = 0;
    for (int r : my_members) want_b += r + 1.0;
    if (b != want_b) FAIL("same name on two sets: got %g, want %g", b, want_b);
    ++checks;
  }
  if (indexOf(edge, g_rank) >= 0) {
    if (runSuite(edge_id, edge, "edge", &checks) != 0) return 1;
  } else {
    // A rank outside a set may not use it.
    double x = 0;
    int64_t one[1] = {1};
    kolo_handle_t h = 0;
    if (expectError(kolo_ps_allreduce_async(edge_id, "x", &x, &x, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &h),
                    KOLO_ERR_INVALID_ARGUMENT, "is not in process set " + std::to_string(edge_id), "non-member") != 0) {
      return 1;
    }
    ++checks;
  }

  // One set goes on while another has an op held back: rank 0 submits
  // "held" on the even set, whose other members submit it only after the
  // odd set ran 20 allreduces and the whole job passed a barrier.
  {
    double held = g_rank + 1.0;
    int64_t one[1] = {1};
    kolo_handle_t hh = 0;
    if (g_rank == 0 &&
        kolo_ps_allreduce_async(even_id, "held", &held, &held, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &hh) != KOLO_OK) {
      FAIL("held: %s", kolo_last_error());
    }
    if (!is_even) {
      for (int k = 0; k < 20; ++k) {
        double v = 1;
        std::string name = "quick." + std::to_string(k);
        if (kolo_ps_allreduce_async(odd_id, name.c_str(), &v, &v, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &hh) != KOLO_OK ||
            kolo_synchronize(hh, 60000) != KOLO_OK) {
          FAIL("odd set while the even set waits: %s", kolo_last_error());
        }
        if (v != static_cast<double>(odd.size())) FAIL("quick.%d = %g", k, v);
      }
    }
    // Before the barrier: the other even ranks submit "held" only after it,
    // so it must still be pending here (after it, they may already have).
    if (g_rank == 0 && kolo_poll(hh) != KOLO_IN_PROGRESS) {
      FAIL("held finished before every even rank submitted it: %s", kolo_last_error());
    }
    if (kolo_barrier(60000) != KOLO_OK) FAIL("global barrier while the even set waits: %s", kolo_last_error());
    if (is_even && g_rank != 0) {
      kolo_handle_t h2 = 0;
      if (kolo_ps_allreduce_async(even_id, "held", &held, &held, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &h2) != KOLO_OK) {
        FAIL("held: %s", kolo_last_error());
      }
      hh = h2;
    }
    if (is_even) {
      if (kolo_synchronize(hh, 60000) != KOLO_OK) FAIL("held: %s", kolo_last_error());
      double want = 0;
      for (int r : even) want += r + 1.0;
      if (held != want) FAIL("held = %g, want %g", held, want);
    }
    ++checks;
  }

  // Errors.
  {
    double x = 1;
    int64_t one[1] = {1};
    kolo_handle_t h = 0;
    if (expectError(kolo_ps_allreduce_async(other, "x", &x, &x, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &h),
                    KOLO_ERR_INVALID_ARGUMENT, "is not in process set " + std::to_string(other), "non-member") != 0 ||
        expectError(kolo_ps_allreduce_async(999, "x", &x, &x, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &h),
                    KOLO_ERR_INVALID_ARGUMENT, "unknown process set 999", "unknown set") != 0 ||
        expectError(kolo_ps_broadcast_async(mine, "x", &x, 1, one, KOLO_FLOAT64, other_members[0], &h),
                    KOLO_ERR_INVALID_ARGUMENT, "broadcast root rank " + std::to_string(other_members[0]) + " is not in process set",
                    "root outside the set") != 0) {
      return 1;
    }
    // Members that disagree on a shape get the agent's mismatch error.
    std::vector<float> v(static_cast<size_t>(3 + indexOf(my_members, g_rank)), 1.0f);
    int64_t shape[1] = {static_cast<int64_t>(v.size())};
    kolo_status_t st = kolo_ps_allreduce_async(mine, "mismatch", v.data(), v.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM,
                                               1, 1, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 60000);
    if (my_members.size() > 1 && expectError(st, KOLO_ERR_INVALID_ARGUMENT, "Mismatched", "shape mismatch in a set") != 0) {
      return 1;
    }
    checks += 4;
  }
  {
    int32_t id = -1;
    // The ranks disagree: every rank fails, naming the disagreement.
    std::vector<int> mine_only = {g_rank};
    if (expectError(kolo_add_process_set(mine_only.data(), 1, &id), KOLO_ERR_INVALID_ARGUMENT, "the ranks disagree",
                    "disagreeing lists") != 0 ||
        expectError(kolo_add_process_set(even.data(), static_cast<int>(even.size()), &id), KOLO_ERR_INVALID_ARGUMENT,
                    "already exist as process set " + std::to_string(even_id), "duplicate") != 0) {
      return 1;
    }
    std::vector<int> all;
    for (int r = g_size - 1; r >= 0; --r) all.push_back(r);
    std::vector<int> bad = {0, g_size};
    if (expectError(kolo_add_process_set(all.data(), g_size, &id), KOLO_ERR_INVALID_ARGUMENT, "global process set",
                    "every rank") != 0 ||
        expectError(kolo_add_process_set(bad.data(), 2, &id), KOLO_ERR_INVALID_ARGUMENT,
                    "rank " + std::to_string(g_size) + " is not a rank of this job", "out of range") != 0 ||
        expectError(kolo_remove_process_set(0), KOLO_ERR_INVALID_ARGUMENT, "cannot be removed", "remove global") != 0) {
      return 1;
    }
    checks += 5;
  }
  // The C++ API on this rank's set.
  {
    kolo::ProcessSet ps(mine);
    if (!ps.included() || ps.size() != static_cast<int>(my_members.size()) || ps.ranks() != my_members) {
      FAIL("kolo::ProcessSet(%d): included %d size %d", mine, ps.included(), ps.size());
    }
    std::vector<int64_t> v = {g_rank, 1};
    auto r = kolo::allreduce(ps, "cpp", v.data(), v.data(), {2}, kolo::DataType::kInt64, kolo::ReduceOp::kSum);
    int64_t want = 0;
    for (int m : my_members) want += m;
    if (!r.ok() || v[0] != want || v[1] != static_cast<int64_t>(my_members.size())) {
      FAIL("kolo::allreduce on a set: %s (%lld %lld)", r.toString().c_str(), (long long)v[0], (long long)v[1]);
    }
    auto g = kolo::allgather(ps, "cpp.ag", &v[1], {1}, kolo::DataType::kInt64);
    if (!g.ok() || g->dim0 != static_cast<int64_t>(my_members.size())) FAIL("kolo::allgather on a set");
    if (!kolo::barrier(ps, 60000).ok()) FAIL("kolo::barrier on a set");
    checks += 3;
  }
  // Remove: the set is gone on every rank; the others still work.
  if (kolo_remove_process_set(edge_id) != KOLO_OK) FAIL("remove edge: %s", kolo_last_error());
  {
    double x = 1;
    int64_t one[1] = {1};
    kolo_handle_t h = 0;
    if (expectError(kolo_ps_allreduce_async(edge_id, "x", &x, &x, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &h),
                    KOLO_ERR_INVALID_ARGUMENT, "unknown process set " + std::to_string(edge_id), "removed set") != 0) {
      return 1;
    }
    if (kolo_ps_allreduce_async(mine, "after", &x, &x, 1, one, KOLO_FLOAT64, KOLO_SUM, 1, 1, &h) != KOLO_OK ||
        kolo_synchronize(h, 60000) != KOLO_OK || x != static_cast<double>(my_members.size())) {
      FAIL("after remove: %s (x = %g)", kolo_last_error(), x);
    }
    checks += 2;
  }
  // A set added after a remove gets a fresh id, and works.
  {
    int32_t id = -1;
    std::vector<int> first_two = {0, 1};
    if (kolo_add_process_set(first_two.data(), 2, &id) != KOLO_OK) FAIL("re-add: %s", kolo_last_error());
    if (id <= edge_id) FAIL("re-add: id %d is not new", id);
    if (g_rank < 2 && runSuite(id, first_two, "first-two", &checks) != 0) return 1;
  }
  if (kolo_remove_process_set(odd_id) != KOLO_OK || kolo_remove_process_set(even_id) != KOLO_OK) {
    FAIL("remove: %s", kolo_last_error());
  }
  std::printf("rank %d/%d: OK %d process-set checks passed\n", g_rank, g_size, checks);
  return 0;
}

int runGroupedGlobal() {
  int checks = 0;
  std::vector<int> all;
  for (int r = 0; r < g_size; ++r) all.push_back(r);
  if (runSuite(0, all, "global", &checks) != 0) return 1;
  // A grouped allgather whose members differ across ranks fails on every rank.
  {
    std::string n0 = "gmis.a", n1 = g_rank == 0 ? "gmis.b" : "gmis.c";
    const char* names[2] = {n0.c_str(), n1.c_str()};
    int32_t x[2] = {1, 2};
    const void* ins[2] = {x, x + 1};
    int nd[2] = {1, 1};
    int64_t s1[1] = {1};
    const int64_t* sh[2] = {s1, s1};
    kolo_dtype_t dt[2] = {KOLO_INT32, KOLO_INT32};
    kolo_handle_t hs[2] = {};
    kolo_status_t st = kolo_grouped_allgather_async(2, names, ins, nd, sh, dt, hs);
    if (g_size > 1 &&
        expectError(st, KOLO_ERR_INVALID_ARGUMENT, "Mismatched group membership", "grouped allgather mismatch") != 0) {
      return 1;
    }
    if (st == KOLO_OK) {
      kolo_release(hs[0]);
      kolo_release(hs[1]);
    }
    ++checks;
  }
  // A group with a member whose shapes differ fails on every rank, again
  // and again, and the job goes on each time (both members' failures reach
  // every agent's negotiation in one cycle: the regression this checks).
  for (int round = 0; round < 6 && g_size > 1; ++round) {
    std::string n0 = "gshape." + std::to_string(round) + ".a", n1 = "gshape." + std::to_string(round) + ".b";
    const char* names[2] = {n0.c_str(), n1.c_str()};
    float a[1] = {1}, b[8] = {};
    const void* ins[2] = {a, b};
    void* outs[2] = {a, b};
    int nd[2] = {1, 1};
    int64_t s0[1] = {1}, s1[1] = {1 + g_rank % 2};
    const int64_t* sh[2] = {s0, s1};
    kolo_dtype_t dt[2] = {KOLO_FLOAT32, KOLO_FLOAT32};
    kolo_status_t st = kolo_grouped_allreduce(2, names, ins, outs, nd, sh, dt, KOLO_SUM, 1.0, 1.0);
    if (expectError(st, KOLO_ERR_INVALID_ARGUMENT, "Mismatched allreduce tensor shapes",
                    "grouped allreduce shape mismatch round " + std::to_string(round)) != 0) {
      return 1;
    }
    double x = 1;
    int64_t one[1] = {1};
    std::string after = "gshape.after." + std::to_string(round);
    st = kolo_allreduce(after.c_str(), &x, &x, 1, one, KOLO_FLOAT64, KOLO_SUM, 1.0, 1.0);
    if (st != KOLO_OK || x != g_size) FAIL("%s after a failed group: %s (x = %g)", after.c_str(), kolo_last_error(), x);
    ++checks;
  }
  std::printf("rank %d/%d: OK %d grouped checks passed\n", g_rank, g_size, checks);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "";
  kolo_status_t st = kolo_init();
  if (st != KOLO_OK) {
    std::printf("init failed: %s: %s\n", kolo_status_string(st), kolo_last_error());
    return 3;
  }
  g_rank = kolo_rank();
  g_size = kolo_size();
  int rc = 0;
  if (mode == "sets") rc = runSets();
  else if (mode == "grouped") rc = runGroupedGlobal();
  else {
    std::printf("unknown mode %s\n", mode.c_str());
    rc = 2;
  }
  kolo_shutdown();
  return rc;
}
