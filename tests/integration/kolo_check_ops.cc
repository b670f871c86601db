// A rank program for the integration tests of join, grouped allreduce,
// out-of-place broadcast and fp16/bf16-compressed allreduce. Like kolo_check
// it drives libkolo through the C ABI and checks every result against a
// reference computed locally from (rank, element, step).
//
//   kolo_check_ops join LAYOUT      ranks run out of data at different steps and join
//   kolo_check_ops grouped          grouped allreduces (several dtypes/ops), membership mismatch
//   kolo_check_ops broadcast-oop    out-of-place broadcast: input untouched, output = root's
//   kolo_check_ops compressed       fp16/bf16-compressed float32 allreduce vs reference
//
// LAYOUT is the ranks per agent ("2_1"): a rank's agent, and so whether a
// whole agent has joined, follows from it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "kolo/kolo.hpp"
#include "kolo/kolo_c.h"
#include "check_fail.h"

namespace {

using Clock = std::chrono::steady_clock;
int g_rank = -1, g_size = 0;


bool contains(const char* hay, const std::string& needle) { return std::string(hay).find(needle) != std::string::npos; }

std::vector<int> parseLayout(const std::string& s) {
  std::vector<int> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find('_', p);
    if (q == std::string::npos) q = s.size();
    out.push_back(std::atoi(s.substr(p, q - p).c_str()));
    p = q + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------
// join

// Steps rank r runs before it joins: every rank a different count, so the
// ranks run out at different steps; the one with the most steps joins last.
int stepsOf(int r) { return 1 + (r * 2 + 1) % (g_size + 1); }

float sumValue(int r, size_t i, int k) { return static_cast<float>((r + 1) * 10 + static_cast<int>(i % 7) + k); }
int32_t maxValue(int r, size_t i, int k) { return -1 - static_cast<int32_t>((r * 3 + i + k) % 11); }

int runJoin(const std::string& layout_arg) {
  std::vector<int> layout = parseLayout(layout_arg);
  std::vector<int> agent_of;
  for (size_t a = 0; a < layout.size(); ++a) {
    for (int i = 0; i < layout[a]; ++i) agent_of.push_back(static_cast<int>(a));
  }
  if (static_cast<int>(agent_of.size()) != g_size) FAIL("layout %s does not add up to %d ranks", layout_arg.c_str(), g_size);
  const int mine = stepsOf(g_rank);
  int max_steps = 0, want_last = -1;
  for (int r = 0; r < g_size; ++r) {
    if (stepsOf(r) > max_steps) max_steps = stepsOf(r), want_last = r;
  }
  int checks = 0, stand_in_steps = 0;  // steps run while a whole agent had joined
  for (int k = 0; k < mine; ++k) {
    std::vector<bool> active(g_size);
    bool any_joined = false;
    for (int r = 0; r < g_size; ++r) {
      active[r] = stepsOf(r) > k;
      any_joined |= !active[r];
    }
    // Is every rank of some agent gone? (then only allreduce goes on across agents)
    bool whole_agent_joined = false;
    for (size_t a = 0; a < layout.size(); ++a) {
      bool all = true;
      for (int r = 0; r < g_size; ++r) all &= agent_of[r] != static_cast<int>(a) || !active[r];
      whole_agent_joined |= all;
    }
    stand_in_steps += whole_agent_joined && layout.size() > 1;
    // Sum (float32) and Average (float64): the joined ranks count as zeros;
    // Average still divides by the job size.
    const size_t n = 1003;
    std::vector<float> s(n), s_out(n);
    std::vector<double> a(n), a_out(n);
    for (size_t i = 0; i < n; ++i) s[i] = sumValue(g_rank, i, k), a[i] = sumValue(g_rank, i, k);
    int64_t shape[1] = {static_cast<int64_t>(n)};
    std::string sn = "join.sum." + std::to_string(k), an = "join.avg." + std::to_string(k);
    kolo_handle_t hs = 0, ha = 0;
    if (kolo_allreduce_async(sn.c_str(), s.data(), s_out.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &hs) != KOLO_OK ||
        kolo_allreduce_async(an.c_str(), a.data(), a_out.data(), 1, shape, KOLO_FLOAT64, KOLO_AVERAGE, 1, 1, &ha) != KOLO_OK) {
      FAIL("step %d: submit: %s", k, kolo_last_error());
    }
    if (kolo_synchronize(hs, 60000) != KOLO_OK) FAIL("%s: %s", sn.c_str(), kolo_last_error());
    if (kolo_synchronize(ha, 60000) != KOLO_OK) FAIL("%s: %s", an.c_str(), kolo_last_error());
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < g_size; ++r) want += active[r] ? sumValue(r, i, k) : 0.0;
      if (s_out[i] != static_cast<float>(want)) FAIL("%s[%zu]: got %g, want %g", sn.c_str(), i, s_out[i], want);
      const double avg = want * (1.0 / g_size);  // the agent folds 1/size into the postscale
      if (a_out[i] != avg) FAIL("%s[%zu]: got %.17g, want %.17g", an.c_str(), i, a_out[i], avg);
    }
    checks += 2;
    // Max (int32) of negative values: a joined rank's zero wins. Above 8 MiB
    // (cross-pipeline-kb), so that across agents it is pipelined (the zero
    // source is reduced chunk by chunk with the others).
    const size_t nm = (8u << 20) / sizeof(int32_t) + 7;
    std::vector<int32_t> m(nm);
    for (size_t i = 0; i < nm; ++i) m[i] = maxValue(g_rank, i, k);
    std::string mn = "join.max." + std::to_string(k);
    int64_t mshape[1] = {static_cast<int64_t>(nm)};
    if (kolo_allreduce(mn.c_str(), m.data(), m.data(), 1, mshape, KOLO_INT32, KOLO_MAX, 1, 1) != KOLO_OK) {
      FAIL("%s: %s", mn.c_str(), kolo_last_error());
    }
    for (size_t i = 0; i < nm; ++i) {
      int32_t want = any_joined ? 0 : INT32_MIN;
      for (int r = 0; r < g_size; ++r) {
        if (active[r]) want = std::max(want, maxValue(r, i, k));
      }
      if (m[i] != want) FAIL("%s[%zu]: got %d, want %d", mn.c_str(), i, m[i], want);
    }
    ++checks;
    // Allgather: while a rank has joined it fails, as in Horovod; otherwise
    // it runs. Under a new name each step, and under the same name every step
    // (cached: across agents its "<name>.__sizes" allreduce is small enough
    // to go inline).
    auto checkAllgather = [&](const std::string& gn) -> int {
      std::vector<int32_t> rows(static_cast<size_t>(g_rank + 1) * 2);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = g_rank * 1000 + static_cast<int32_t>(i) + k;
      int64_t gshape[2] = {g_rank + 1, 2};
      kolo_handle_t hg = 0;
      kolo_status_t gst = kolo_allgather_async(gn.c_str(), rows.data(), 2, gshape, KOLO_INT32, &hg);
      if (gst == KOLO_OK) gst = kolo_synchronize(hg, 60000);
      if (any_joined) {
        if (gst == KOLO_OK || !contains(kolo_last_error(), "joined (kolo_join)")) {
          FAIL("%s while a rank has joined: %s: %s", gn.c_str(), kolo_status_string(gst), kolo_last_error());
        }
        if (hg != 0) kolo_release(hg);
        return 0;
      }
      if (gst != KOLO_OK) FAIL("%s: %s: %s", gn.c_str(), kolo_status_string(gst), kolo_last_error());
      void* data = nullptr;
      int64_t dim0 = 0;
      if (kolo_result(hg, &data, &dim0) != KOLO_OK) FAIL("%s: kolo_result: %s", gn.c_str(), kolo_last_error());
      std::vector<int32_t> want;
      for (int r = 0; r < g_size; ++r) {
        if (!active[r]) continue;
        for (int i = 0; i < (r + 1) * 2; ++i) want.push_back(r * 1000 + i + k);
      }
      if (dim0 * 2 != static_cast<int64_t>(want.size()) ||
          std::memcmp(data, want.data(), want.size() * sizeof(int32_t)) != 0) {
        FAIL("%s: %lld rows, not the active ranks' rows in rank order", gn.c_str(), static_cast<long long>(dim0));
      }
      kolo_release(hg);
      return 0;
    };
    if (checkAllgather("join.ag." + std::to_string(k)) != 0) return 1;
    if (checkAllgather("join.ag.same") != 0) return 1;
    checks += 2;
    // A small allreduce under the same name every step (cached: across
    // agents it goes inline, and a node standing in contributes zeros).
    {
      float rs[5];
      for (int i = 0; i < 5; ++i) rs[i] = static_cast<float>(sumValue(g_rank, i, k));
      int64_t rshape[1] = {5};
      if (kolo_allreduce("join.sum.same", rs, rs, 1, rshape, KOLO_FLOAT32, KOLO_SUM, 1, 1) != KOLO_OK) {
        FAIL("join.sum.same step %d: %s", k, kolo_last_error());
      }
      for (int i = 0; i < 5; ++i) {
        double want = 0;
        for (int r = 0; r < g_size; ++r) want += active[r] ? sumValue(r, i, k) : 0.0;
        if (rs[i] != static_cast<float>(want)) FAIL("join.sum.same step %d [%d]: got %g, want %g", k, i, rs[i], want);
      }
      ++checks;
    }
    kolo_status_t st = KOLO_OK;
    // Any other collective fails while a rank has joined.
    if (any_joined) {
      std::vector<float> b(4, 1.0f);
      int64_t bshape[1] = {4};
      std::string bn = "join.bc." + std::to_string(k);
      st = kolo_broadcast(bn.c_str(), b.data(), 1, bshape, KOLO_FLOAT32, 0);
      if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "broadcast of tensor '" + bn + "' cannot run while") ||
          !contains(kolo_last_error(), "joined (kolo_join)")) {
        FAIL("%s while a rank has joined: %s: %s", bn.c_str(), kolo_status_string(st), kolo_last_error());
      }
      ++checks;
    }
  }
  int last = -2;
  kolo_status_t st = kolo_join(60000, &last);
  if (st != KOLO_OK) FAIL("kolo_join: %s: %s", kolo_status_string(st), kolo_last_error());
  if (last != want_last) FAIL("kolo_join: last joined rank %d, want %d", last, want_last);
  // Everyone takes part again.
  float v = static_cast<float>(g_rank + 1), want = 0;
  for (int r = 0; r < g_size; ++r) want += static_cast<float>(r + 1);
  int64_t one[1] = {1};
  if (kolo_allreduce("join.after", &v, &v, 1, one, KOLO_FLOAT32, KOLO_SUM, 1, 1) != KOLO_OK || v != want) {
    FAIL("allreduce after join: %s (got %g, want %g)", kolo_last_error(), v, want);
  }
  // A second join (C++ API), all at once: the last rank is one of them, the same on every rank.
  kolo::Expected<int> again = kolo::join(60000);
  if (!again.ok() || *again < 0 || *again >= g_size) {
    FAIL("second kolo::join: %s", again.ok() ? "out of range" : again.result().toString().c_str());
  }
  int64_t agreed[1] = {*again};
  int64_t min_max[2] = {*again, -*again};
  int64_t two[1] = {2};
  if (kolo_allreduce("join.agree", min_max, min_max, 1, two, KOLO_INT64, KOLO_MIN, 1, 1) != KOLO_OK ||
      min_max[0] != agreed[0] || -min_max[1] != agreed[0]) {
    FAIL("ranks disagree on the last joined rank (%lld): %s", static_cast<long long>(agreed[0]), kolo_last_error());
  }
  std::printf("rank %d/%d: OK %d join checks passed (ran %d steps, %d with a whole agent joined, last joined %d)\n",
              g_rank, g_size, checks + 2, mine, stand_in_steps, want_last);
  return 0;
}


// ---------------------------------------------------------------------------
// grouped allreduce

double groupValue(int r, size_t i, int m) { return static_cast<double>((r + 2) * (m + 1) + static_cast<int>(i % 5)); }

int runGrouped() {
  int checks = 0;
  // Several groups of mixed dtypes and sizes (empty included), Sum and Average.
  const kolo_dtype_t dts[] = {KOLO_FLOAT32, KOLO_FLOAT64, KOLO_INT32, KOLO_FLOAT32, KOLO_INT64};
  const int64_t sizes[] = {17, 1000, 0, 4099, 3};
  for (int round = 0; round < 3; ++round) {
    const kolo_op_t op = round == 1 ? KOLO_AVERAGE : KOLO_SUM;
    const int count = 5;
    std::vector<std::string> names;
    std::vector<std::vector<double>> in(count), out(count);
    std::vector<const char*> cnames;
    std::vector<const void*> ins;
    std::vector<void*> outs;
    std::vector<int> ndims;
    std::vector<std::vector<int64_t>> shapes(count);
    std::vector<const int64_t*> shape_ptrs;
    std::vector<kolo_dtype_t> dtypes;
    std::vector<std::vector<char>> bufs(count), obufs(count);
    for (int m = 0; m < count; ++m) {
      kolo_dtype_t dt = op == KOLO_AVERAGE && (dts[m] == KOLO_INT32 || dts[m] == KOLO_INT64) ? KOLO_FLOAT64 : dts[m];
      names.push_back("grp." + std::to_string(round) + "." + std::to_string(m));
      size_t n = static_cast<size_t>(sizes[m]);
      size_t es = kolo_dtype_size(dt);
      bufs[m].assign(n * es + 1, 0);
      obufs[m].assign(n * es + 1, 0);
      for (size_t i = 0; i < n; ++i) {
        double v = groupValue(g_rank, i, m);
        if (dt == KOLO_FLOAT32) reinterpret_cast<float*>(bufs[m].data())[i] = static_cast<float>(v);
        if (dt == KOLO_FLOAT64) reinterpret_cast<double*>(bufs[m].data())[i] = v;
        if (dt == KOLO_INT32) reinterpret_cast<int32_t*>(bufs[m].data())[i] = static_cast<int32_t>(v);
        if (dt == KOLO_INT64) reinterpret_cast<int64_t*>(bufs[m].data())[i] = static_cast<int64_t>(v);
      }
      shapes[m] = {sizes[m]};
      dtypes.push_back(dt);
      ndims.push_back(1);
    }
    for (int m = 0; m < count; ++m) {
      cnames.push_back(names[m].c_str());
      ins.push_back(bufs[m].data());
      outs.push_back(m % 2 == 0 ? static_cast<void*>(bufs[m].data()) : static_cast<void*>(obufs[m].data()));
      shape_ptrs.push_back(shapes[m].data());
    }
    std::vector<kolo_handle_t> hs(count);
    kolo_status_t st = kolo_grouped_allreduce_async(count, cnames.data(), ins.data(), outs.data(), ndims.data(),
                                                    shape_ptrs.data(), dtypes.data(), op, 1.0, 1.0, hs.data());
    if (st != KOLO_OK) FAIL("group %d: %s: %s", round, kolo_status_string(st), kolo_last_error());
    for (int m = 0; m < count; ++m) {
      if (kolo_synchronize(hs[m], 60000) != KOLO_OK) FAIL("%s: %s", cnames[m], kolo_last_error());
      size_t n = static_cast<size_t>(sizes[m]);
      for (size_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int r = 0; r < g_size; ++r) sum += groupValue(r, i, m);
        double want = op == KOLO_AVERAGE ? sum * (1.0 / g_size) : sum;
        const void* o = outs[m];
        double got = 0;
        if (dtypes[m] == KOLO_FLOAT32) got = static_cast<const float*>(o)[i], want = static_cast<float>(want);
        if (dtypes[m] == KOLO_FLOAT64) got = static_cast<const double*>(o)[i];
        if (dtypes[m] == KOLO_INT32) got = static_cast<const int32_t*>(o)[i];
        if (dtypes[m] == KOLO_INT64) got = static_cast<double>(static_cast<const int64_t*>(o)[i]);
        if (got != want) FAIL("%s[%zu]: got %.17g, want %.17g", cnames[m], i, got, want);
      }
      ++checks;
    }
  }
  // C++ API, blocking.
  {
    std::vector<float> a(8), b(3);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(g_rank + i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(2 * g_rank + i);
    kolo::Result r = kolo::groupedAllreduce({{"grp.cpp.a", a.data(), a.data(), {8}, kolo::DataType::kFloat32},
                                             {"grp.cpp.b", b.data(), b.data(), {3}, kolo::DataType::kFloat32}},
                                            kolo::ReduceOp::kSum);
    if (!r.ok()) FAIL("kolo::groupedAllreduce: %s", r.toString().c_str());
    const float base = static_cast<float>(g_size * (g_size - 1) / 2);
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != base + static_cast<float>(g_size * i)) FAIL("grp.cpp.a[%zu] = %g", i, a[i]);
    }
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i] != 2 * base + static_cast<float>(g_size * i)) FAIL("grp.cpp.b[%zu] = %g", i, b[i]);
    }
    ++checks;
  }
  // Membership mismatch: the last rank groups a different second tensor.
  // The mismatching name fails with the membership text, and the whole group
  // with it (on every rank).
  if (g_size > 1) {
    float x[4] = {1, 2, 3, 4}, y[4] = {1, 2, 3, 4};
    const bool odd = g_rank == g_size - 1;
    const char* names[2] = {"grp.mm.a", odd ? "grp.mm.c" : "grp.mm.b"};
    const void* ins[2] = {x, y};
    void* outs[2] = {x, y};
    int ndims[2] = {1, 1};
    int64_t shp[1] = {4};
    const int64_t* shapes[2] = {shp, shp};
    kolo_dtype_t dts2[2] = {KOLO_FLOAT32, KOLO_FLOAT32};
    kolo_handle_t hs[2] = {0, 0};
    kolo_status_t st = kolo_grouped_allreduce_async(2, names, ins, outs, ndims, shapes, dts2, KOLO_SUM, 1, 1, hs);
    if (st != KOLO_OK) FAIL("mismatch group submit: %s", kolo_last_error());
    st = kolo_synchronize(hs[0], 60000);
    if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "Mismatched group membership for tensor 'grp.mm.a'")) {
      FAIL("grp.mm.a: %s: %s", kolo_status_string(st), kolo_last_error());
    }
    st = kolo_synchronize(hs[1], 60000);
    if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "failed because another of its tensors failed")) {
      FAIL("%s: %s: %s", names[1], kolo_status_string(st), kolo_last_error());
    }
    checks += 2;
    // The job goes on.
    float v = 1;
    int64_t one[1] = {1};
    if (kolo_allreduce("grp.after", &v, &v, 1, one, KOLO_FLOAT32, KOLO_SUM, 1, 1) != KOLO_OK || v != g_size) {
      FAIL("allreduce after the mismatch: %s (got %g)", kolo_last_error(), v);
    }
  }
  // Refused before anything is submitted: a name twice.
  {
    float x[2] = {0, 0};
    const char* names[2] = {"grp.dup", "grp.dup"};
    const void* ins[2] = {x, x};
    void* outs[2] = {x, x};
    int ndims[2] = {1, 1};
    int64_t shp[1] = {2};
    const int64_t* shapes[2] = {shp, shp};
    kolo_dtype_t dts2[2] = {KOLO_FLOAT32, KOLO_FLOAT32};
    kolo_handle_t hs[2];
    kolo_status_t st = kolo_grouped_allreduce_async(2, names, ins, outs, ndims, shapes, dts2, KOLO_SUM, 1, 1, hs);
    if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "tensor 'grp.dup' appears twice in the group")) {
      FAIL("duplicate member: %s: %s", kolo_status_string(st), kolo_last_error());
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d grouped allreduce checks passed\n", g_rank, g_size, checks);
  return 0;
}

// ---------------------------------------------------------------------------
// out-of-place broadcast

int runBroadcastOop() {
  int checks = 0;
  const int64_t sizes[] = {0, 1, 1001, 65537};
  for (int root = 0; root < g_size; root += std::max(1, g_size - 1)) {
    for (int64_t n : sizes) {
      for (kolo_dtype_t dt : {KOLO_FLOAT32, KOLO_INT8, KOLO_FLOAT64}) {
        size_t es = kolo_dtype_size(dt);
        size_t bytes = static_cast<size_t>(n) * es;
        std::vector<unsigned char> in(bytes + 1), out(bytes + 1, 0xEE), want(bytes + 1);
        for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(g_rank * 31 + i * 7);
        for (size_t i = 0; i < bytes; ++i) want[i] = static_cast<unsigned char>(root * 31 + i * 7);
        std::vector<unsigned char> in_before = in;
        int64_t shape[1] = {n};
        std::string name = "boop." + std::to_string(root) + "." + std::to_string(n) + "." + std::to_string(dt);
        kolo_status_t st = kolo_broadcast_oop(name.c_str(), in.data(), out.data(), 1, shape, dt, root);
        if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
        if (std::memcmp(out.data(), want.data(), bytes) != 0) FAIL("%s: output is not the root's tensor", name.c_str());
        if (in != in_before) FAIL("%s: the input was written", name.c_str());
        ++checks;
      }
    }
  }
  // Zero copy input (from the arena) stays untouched too; NULL input off the root.
  {
    const int64_t n = 4096;
    float* shared = static_cast<float*>(kolo_alloc_shared(n * sizeof(float)));
    if (shared == nullptr) FAIL("kolo_alloc_shared: %s", kolo_last_error());
    for (int64_t i = 0; i < n; ++i) shared[i] = static_cast<float>(g_rank * 100 + i);
    std::vector<float> out(n);
    int64_t shape[1] = {n};
    kolo_handle_t h = 0;
    const int root = g_size - 1;
    if (kolo_broadcast_oop_async("boop.shared", shared, out.data(), 1, shape, KOLO_FLOAT32, root, &h) != KOLO_OK ||
        kolo_synchronize(h, 60000) != KOLO_OK) {
      FAIL("boop.shared: %s", kolo_last_error());
    }
    for (int64_t i = 0; i < n; ++i) {
      if (out[i] != static_cast<float>(root * 100 + i)) FAIL("boop.shared[%lld] = %g", (long long)i, out[i]);
      if (shared[i] != static_cast<float>(g_rank * 100 + i)) FAIL("boop.shared: the shared input was written");
    }
    kolo_free_shared(shared);
    std::vector<float> out2(8, -1);
    std::vector<float> in2(8, 5.0f);
    int64_t s8[1] = {8};
    auto r = kolo::broadcastOop("boop.null", g_rank == 0 ? in2.data() : nullptr, out2.data(), {8},
                                kolo::DataType::kFloat32, 0);
    if (!r.ok()) FAIL("boop.null: %s", r.toString().c_str());
    (void)s8;
    for (float v : out2) {
      if (v != 5.0f) FAIL("boop.null: got %g", v);
    }
    checks += 2;
  }
  // A bad root is refused at once.
  {
    float x = 0, y = 0;
    int64_t one[1] = {1};
    kolo_status_t st = kolo_broadcast_oop("boop.badroot", &x, &y, 1, one, KOLO_FLOAT32, g_size);
    if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "is not a rank of this job")) {
      FAIL("bad root: %s: %s", kolo_status_string(st), kolo_last_error());
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d out-of-place broadcast checks passed\n", g_rank, g_size, checks);
  return 0;
}

// ---------------------------------------------------------------------------
// compressed allreduce

float wireRound(kolo_compression_t c, float v) {
  return c == KOLO_COMPRESS_FP16 ? kolo::halfToFloat(kolo::floatToHalf(v)) : kolo::bf16ToFloat(kolo::floatToBf16(v));
}

int runCompressed(const std::string& layout_arg) {
  const bool one_agent = parseLayout(layout_arg).size() == 1;
  int checks = 0;
  for (kolo_compression_t c : {KOLO_COMPRESS_FP16, KOLO_COMPRESS_BF16}) {
    const char* cn = c == KOLO_COMPRESS_FP16 ? "fp16" : "bf16";
    for (kolo_op_t op : {KOLO_SUM, KOLO_AVERAGE, KOLO_MAX}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{70001}}) {
        // Small integers: exact in both wire types, so the result is exact
        // whatever the order of the additions (one agent or several).
        std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), -7.0f);
        for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>((g_rank + 1) * ((i % 9) - 4));
        int64_t shape[1] = {n};
        std::string name = std::string("cmp.") + cn + "." + std::to_string(op) + "." + std::to_string(n);
        kolo_status_t st = kolo_allreduce_compressed(name.c_str(), in.data(), out.data(), 1, shape, op, 1, 1, c);
        if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
        for (int64_t i = 0; i < n; ++i) {
          float acc = op == KOLO_MAX ? -1e30f : 0.0f;
          for (int r = 0; r < g_size; ++r) {
            float v = static_cast<float>((r + 1) * ((i % 9) - 4));
            acc = op == KOLO_MAX ? std::max(acc, v) : acc + v;
          }
          // Average: the sum times 1/size, rounded once to the wire type.
          float want = op == KOLO_AVERAGE ? wireRound(c, static_cast<float>(acc * (1.0 / g_size))) : acc;
          if (out[i] != want) FAIL("%s[%lld]: got %.9g, want %.9g", name.c_str(), (long long)i, out[i], want);
        }
        ++checks;
      }
    }
    // Values the wire type cannot hold: the result is rounded, proof the
    // tensor really travelled compressed (float32 would keep 1 + 2^-12).
    {
      std::vector<float> in(64, 1.0f + 1.0f / 4096), out(64);
      int64_t shape[1] = {64};
      std::string name = std::string("cmp.round.") + cn;
      if (kolo_allreduce_compressed(name.c_str(), in.data(), out.data(), 1, shape, KOLO_SUM, 1, 1, c) != KOLO_OK) {
        FAIL("%s: %s", name.c_str(), kolo_last_error());
      }
      for (float v : out) {
        if (v != static_cast<float>(g_size)) FAIL("%s: got %.9g, want %d", name.c_str(), v, g_size);
      }
      ++checks;
    }
    // One agent: fractional values, bit-exact against the documented
    // accumulation: each input rounded to the wire type, summed in float32
    // in rank order, rounded once to the wire type.
    if (one_agent) {
      const size_t n = 4097;
      std::vector<float> in(n), out(n);
      auto val = [](int r, size_t i) { return std::sin(static_cast<float>(r * 7919 + i)) * 3.3f; };
      for (size_t i = 0; i < n; ++i) in[i] = val(g_rank, i);
      int64_t shape[1] = {static_cast<int64_t>(n)};
      std::string name = std::string("cmp.frac.") + cn;
      kolo_handle_t h = 0;
      if (kolo_allreduce_compressed_async(name.c_str(), in.data(), in.data(), 1, shape, KOLO_SUM, 1, 1, c, &h) != KOLO_OK ||
          kolo_synchronize(h, 60000) != KOLO_OK) {
        FAIL("%s: %s", name.c_str(), kolo_last_error());
      }
      for (size_t i = 0; i < n; ++i) {
        float acc = 0;
        for (int r = 0; r < g_size; ++r) acc += wireRound(c, val(r, i));
        float want = wireRound(c, acc);
        if (in[i] != want) FAIL("%s[%zu]: got %.9g, want %.9g", name.c_str(), i, in[i], want);
      }
      ++checks;
    }
  }
  // C++ API, async, in place.
  {
    std::vector<float> v(300);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(g_rank + 1) * 0.5f;
    auto h = kolo::allreduceCompressedAsync("cmp.cpp", v.data(), v.data(), {300}, kolo::ReduceOp::kSum,
                                            kolo::Compression::kBf16);
    if (!h.ok()) FAIL("kolo::allreduceCompressedAsync: %s", h.result().toString().c_str());
    kolo::Result r = h->wait(60000);
    if (!r.ok()) FAIL("cmp.cpp: %s", r.toString().c_str());
    const float want = 0.5f * static_cast<float>(g_size * (g_size + 1) / 2);
    for (float x : v) {
      if (x != want) FAIL("cmp.cpp: got %g, want %g", x, want);
    }
    ++checks;
  }
  // The ranks must agree on the compression.
  if (g_size > 1) {
    float x[2] = {1, 1};
    int64_t shape[1] = {2};
    kolo_compression_t c = g_rank == 0 ? KOLO_COMPRESS_FP16 : KOLO_COMPRESS_BF16;
    kolo_status_t st = kolo_allreduce_compressed("cmp.mismatch", x, x, 1, shape, KOLO_SUM, 1, 1, c);
    if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "Mismatched data types for tensor 'cmp.mismatch'")) {
      FAIL("compression mismatch: %s: %s", kolo_status_string(st), kolo_last_error());
    }
    ++checks;
  }
  {
    float x = 1;
    int64_t one[1] = {1};
    kolo_status_t st = kolo_allreduce_compressed("cmp.bad", &x, &x, 1, one, KOLO_SUM, 1, 1, static_cast<kolo_compression_t>(7));
    if (st != KOLO_ERR_INVALID_ARGUMENT || !contains(kolo_last_error(), "unknown compression 7")) {
      FAIL("bad compression: %s: %s", kolo_status_string(st), kolo_last_error());
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d compressed allreduce checks passed\n", g_rank, g_size, checks);
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
  const std::string layout = argc > 2 ? argv[2] : std::to_string(g_size);
  if (mode == "join") rc = runJoin(layout);
  else if (mode == "grouped") rc = runGrouped();
  else if (mode == "broadcast-oop") rc = runBroadcastOop();
  else if (mode == "compressed") rc = runCompressed(layout);
  else {
    std::printf("unknown mode %s\n", mode.c_str());
    rc = 2;
  }
  kolo_shutdown();
  return rc;
}
