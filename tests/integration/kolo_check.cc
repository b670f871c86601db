// A rank program for the integration tests (launched by the harness or by
// kolorun). It drives libkolo through the C ABI and checks every result
// against a reference computed locally: each rank can compute every other
// rank's input, because inputs are a pure function of (rank, element).
//
//   kolo_check allreduce [--big]   every dtype x op x awkward size
//   kolo_check direct              the direct user-memory path around its threshold (every dtype x op)
//   kolo_check mismatch            ranks disagree on dtype / shape / op, then recover
//   kolo_check duplicate           a name submitted twice while in flight
//   kolo_check die VICTIM          VICTIM kills itself mid-collective; others must fail fast
//   kolo_check loop N              N allreduces (a second job running alongside)
//   kolo_check until FILE          allreduces with exact results until FILE exists (all ranks
//                                  agree when: the flag is part of the sum); rank 0 says
//                                  "training" after the first; with KOLO_CHECK_PROGRESS=PATH
//                                  rank 0 writes its step count there every 50 steps
//   kolo_check init-only           init, print the world, shut down
//   kolo_check broadcast [--big]   every dtype x several roots x sizes 0/1/odd (1M with --big)
//   kolo_check allgather [--big]   first dims differing per rank (0 included), every dtype
//   kolo_check reducescatter       every dtype x op x first dims (incl. < size), trailing dims
//   kolo_check alltoall            uneven splits (0 included) and even splits, every dtype
//   kolo_check barrier             ranks arrive at different times; none leaves before the last arrives
//   kolo_check coll-mismatch       broadcast root mismatch and bad roots, then recover
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "kolo/kolo.hpp"
#include "kolo/kolo_c.h"
#include "check_fail.h"

namespace {

using Clock = std::chrono::steady_clock;
int g_rank = -1, g_size = 0;


const char* dtypeName(kolo_dtype_t t) {
  static const char* names[] = {"float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"};
  return names[t];
}
const char* opName(kolo_op_t o) {
  switch (o) {
    case KOLO_AVERAGE: return "average";
    case KOLO_SUM: return "sum";
    case KOLO_MIN: return "min";
    case KOLO_MAX: return "max";
    case KOLO_PRODUCT: return "product";
  }
  return "?";
}

// Small integers: exact in every dtype, and so are their sums over <= 8 ranks.
double inputValue(int rank, size_t i, kolo_op_t op, kolo_dtype_t dt) {
  if (op == KOLO_PRODUCT) {
    static const double choices[] = {1, -1, 2, 1, 1, -1, 1};
    double v = choices[(i * 3 + rank * 5) % 7];
    return dt == KOLO_UINT8 ? std::fabs(v) : v;
  }
  double v = static_cast<double>(static_cast<int>((rank + 1) * (i % 5 + 1) + i % 3) % 9 - 4);
  return dt == KOLO_UINT8 ? std::fabs(v) : v;
}

void store(kolo_dtype_t t, void* p, size_t i, double v) {
  switch (t) {
    case KOLO_FLOAT16: static_cast<uint16_t*>(p)[i] = kolo::floatToHalf(static_cast<float>(v)); break;
    case KOLO_BFLOAT16: static_cast<uint16_t*>(p)[i] = kolo::floatToBf16(static_cast<float>(v)); break;
    case KOLO_FLOAT32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case KOLO_FLOAT64: static_cast<double*>(p)[i] = v; break;
    case KOLO_INT8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case KOLO_UINT8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case KOLO_INT32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case KOLO_INT64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

// The value the agent must produce, computed the way docs/architecture.md
// specifies: exact combination, then the Average's 1/size applied in double
// and rounded once to the dtype.
double expected(int size, size_t i, kolo_op_t op, kolo_dtype_t dt) {
  double acc = inputValue(0, i, op, dt);
  for (int r = 1; r < size; ++r) {
    double v = inputValue(r, i, op, dt);
    if (op == KOLO_SUM || op == KOLO_AVERAGE) acc += v;
    else if (op == KOLO_MIN) acc = std::min(acc, v);
    else if (op == KOLO_MAX) acc = std::max(acc, v);
    else acc *= v;
  }
  if (op == KOLO_AVERAGE) acc = acc * (1.0 / size);
  // Round through the dtype, as the agent stores it.
  std::vector<char> tmp(8);
  store(dt, tmp.data(), 0, acc);
  switch (dt) {
    case KOLO_FLOAT16: return kolo::halfToFloat(*reinterpret_cast<uint16_t*>(tmp.data()));
    case KOLO_BFLOAT16: return kolo::bf16ToFloat(*reinterpret_cast<uint16_t*>(tmp.data()));
    case KOLO_FLOAT32: return *reinterpret_cast<float*>(tmp.data());
    case KOLO_FLOAT64: return *reinterpret_cast<double*>(tmp.data());
    case KOLO_INT8: return *reinterpret_cast<int8_t*>(tmp.data());
    case KOLO_UINT8: return *reinterpret_cast<uint8_t*>(tmp.data());
    case KOLO_INT32: return *reinterpret_cast<int32_t*>(tmp.data());
    case KOLO_INT64: return static_cast<double>(*reinterpret_cast<int64_t*>(tmp.data()));
  }
  return 0;
}

double load(kolo_dtype_t t, const void* p, size_t i) {
  switch (t) {
    case KOLO_FLOAT16: return kolo::halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case KOLO_BFLOAT16: return kolo::bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case KOLO_FLOAT32: return static_cast<const float*>(p)[i];
    case KOLO_FLOAT64: return static_cast<const double*>(p)[i];
    case KOLO_INT8: return static_cast<const int8_t*>(p)[i];
    case KOLO_UINT8: return static_cast<const uint8_t*>(p)[i];
    case KOLO_INT32: return static_cast<const int32_t*>(p)[i];
    case KOLO_INT64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

// One checked allreduce. out_of_place: separate output buffer; zero_copy: arena memory
// (both, with out_of_place: the input must come back unchanged).
int checkOne(const std::string& name, kolo_dtype_t dt, kolo_op_t op, size_t count, bool zero_copy,
             bool out_of_place) {
  size_t bytes = count * kolo_dtype_size(dt);
  std::vector<char> in_vec, out_vec;
  void* in = nullptr;
  void* out = nullptr;
  if (zero_copy) {
    in = kolo_alloc_shared(bytes ? bytes : 1);
    if (in == nullptr) FAIL("kolo_alloc_shared(%zu): %s", bytes, kolo_last_error());
    out = in;
    if (out_of_place) {
      out = kolo_alloc_shared(bytes ? bytes : 1);
      if (out == nullptr) FAIL("kolo_alloc_shared(%zu): %s", bytes, kolo_last_error());
      std::memset(out, 0x5a, bytes);
    }
  } else {
    in_vec.resize(bytes + 1);
    in = in_vec.data();
    if (out_of_place) {
      out_vec.resize(bytes + 1);
      out = out_vec.data();
    } else {
      out = in;
    }
  }
  for (size_t i = 0; i < count; ++i) store(dt, in, i, inputValue(g_rank, i, op, dt));
  int64_t shape[2] = {static_cast<int64_t>(count), 1};
  int ndim = (count % 2 == 0) ? 1 : 2;
  kolo_status_t st = kolo_allreduce(name.c_str(), in, out, ndim, shape, dt, op, 1.0, 1.0);
  if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  for (size_t i = 0; i < count; ++i) {
    double want = expected(g_size, i, op, dt);
    double got = load(dt, out, i);
    if (got != want) {
      FAIL("%s (%s %s count %zu%s%s) element %zu: got %g, want %g", name.c_str(), dtypeName(dt), opName(op),
           count, zero_copy ? " zero-copy" : "", out_of_place ? " out-of-place" : "", i, got, want);
    }
  }
  if (out_of_place) {
    for (size_t i = 0; i < count; ++i) {
      std::vector<char> tmp(16);  // the input value as stored in the tensor's dtype
      store(dt, tmp.data(), 0, inputValue(g_rank, i, op, dt));
      const double want = load(dt, tmp.data(), 0);
      double got = load(dt, in, i);
      if (got != want) {
        FAIL("%s (%s %s count %zu%s out-of-place) input element %zu was changed: %g, was %g", name.c_str(),
             dtypeName(dt), opName(op), count, zero_copy ? " zero-copy" : "", i, got, want);
      }
    }
  }
  if (zero_copy) kolo_free_shared(in);
  if (zero_copy && out_of_place) kolo_free_shared(out);
  return 0;
}

// Small allreduces of every dtype and op, submitted together and then
// waited for, round after round under the same names (cached from the
// second round): across agents those up to --cross-inline-bytes travel
// inside the negotiation message, the larger ones and those past the
// message's room the usual way. Each round shifts the inputs, so a stale
// result fails; every element is checked exactly.
int runInline(int rounds) {
  const kolo_op_t ops[] = {KOLO_SUM, KOLO_AVERAGE, KOLO_MIN, KOLO_MAX, KOLO_PRODUCT};
  const size_t counts[] = {1, 7, 50};
  struct T {
    std::string name;
    kolo_dtype_t dt;
    kolo_op_t op;
    size_t count;
    std::vector<char> buf;
    kolo_handle_t h;
  };
  std::vector<T> ts;
  for (int d = 0; d < 8; ++d) {
    for (kolo_op_t op : ops) {
      for (size_t count : counts) {
        auto dt = static_cast<kolo_dtype_t>(d);
        ts.push_back({std::string("in.") + dtypeName(dt) + "." + opName(op) + "." + std::to_string(count), dt, op,
                      count, {}, 0});
      }
    }
  }
  for (int r = 0; r < rounds; ++r) {
    for (T& t : ts) {
      t.buf.assign(t.count * kolo_dtype_size(t.dt), 0);
      for (size_t i = 0; i < t.count; ++i) store(t.dt, t.buf.data(), i, inputValue(g_rank, i + r, t.op, t.dt));
      int64_t shape[1] = {static_cast<int64_t>(t.count)};
      kolo_status_t st =
          kolo_allreduce_async(t.name.c_str(), t.buf.data(), t.buf.data(), 1, shape, t.dt, t.op, 1.0, 1.0, &t.h);
      if (st != KOLO_OK) FAIL("round %d %s: %s: %s", r, t.name.c_str(), kolo_status_string(st), kolo_last_error());
    }
    for (T& t : ts) {
      kolo_status_t st = kolo_synchronize(t.h, -1);
      if (st != KOLO_OK) FAIL("round %d %s: %s: %s", r, t.name.c_str(), kolo_status_string(st), kolo_last_error());
      for (size_t i = 0; i < t.count; ++i) {
        double want = expected(g_size, i + r, t.op, t.dt);
        double got = load(t.dt, t.buf.data(), i);
        if (got != want) FAIL("round %d %s element %zu: got %g, want %g", r, t.name.c_str(), i, got, want);
      }
    }
  }
  std::printf("rank %d: inline checks passed: %zu tensors x %d rounds\n", g_rank, ts.size(), rounds);
  return 0;
}

int runAllreduce(bool big) {
  std::vector<size_t> sizes = {0, 1, 7, 1001, 65537};
  if (big) sizes.push_back((1u << 20) + 3);
  int checks = 0;
  const kolo_op_t ops[] = {KOLO_SUM, KOLO_AVERAGE, KOLO_MIN, KOLO_MAX, KOLO_PRODUCT};
  for (int d = 0; d < 8; ++d) {
    for (kolo_op_t op : ops) {
      for (size_t count : sizes) {
        auto dt = static_cast<kolo_dtype_t>(d);
        std::string name = std::string("t.") + dtypeName(dt) + "." + opName(op) + "." + std::to_string(count);
        if (checkOne(name, dt, op, count, false, false)) return 1;
        ++checks;
      }
    }
  }
  // Zero copy, out of place, big float32, and pre/post scale factors.
  if (checkOne("zc.small", KOLO_FLOAT32, KOLO_SUM, 333, true, false)) return 1;
  if (checkOne("zc.big", KOLO_FLOAT32, KOLO_SUM, (1u << 21) + 5, true, false)) return 1;
  if (checkOne("oop.big", KOLO_FLOAT32, KOLO_AVERAGE, (1u << 20) + 1, false, true)) return 1;
  // Zero copy out of place (input and output in the arena): the result
  // lands in the output and the input is left unchanged; the big ones cross
  // agents pipelined (the input copied chunk by chunk ahead of the ring).
  if (checkOne("zcoop.small", KOLO_INT32, KOLO_MAX, 333, true, true)) return 1;
  if (checkOne("zcoop.big", KOLO_FLOAT32, KOLO_SUM, (1u << 21) + 5, true, true)) return 1;
  if (checkOne("zcoop.avg", KOLO_FLOAT64, KOLO_AVERAGE, (1u << 20) + 7, true, true)) return 1;
  checks += 6;
  {
    std::vector<double> v(129);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(g_rank + 1) * (i + 1);
    int64_t shape[1] = {static_cast<int64_t>(v.size())};
    kolo_status_t st = kolo_allreduce("scaled", v.data(), v.data(), 1, shape, KOLO_FLOAT64, KOLO_SUM, 0.5, 3.0);
    if (st != KOLO_OK) FAIL("scaled: %s", kolo_last_error());
    double ranksum = g_size * (g_size + 1) / 2.0;
    for (size_t i = 0; i < v.size(); ++i) {
      double want = 3.0 * (0.5 * ranksum * (i + 1));
      if (v[i] != want) FAIL("scaled element %zu: got %g want %g", i, v[i], want);
    }
    ++checks;
  }
  // Many async ops in flight at once, completed out of submission order.
  {
    const int kN = 64;
    std::vector<std::vector<float>> bufs(kN, std::vector<float>(100));
    std::vector<kolo_handle_t> hs(kN);
    for (int k = 0; k < kN; ++k) {
      for (size_t i = 0; i < 100; ++i) bufs[k][i] = static_cast<float>(k + g_rank);
      int64_t shape[1] = {100};
      std::string name = "async." + std::to_string(k);
      kolo_status_t st = kolo_allreduce_async(name.c_str(), bufs[k].data(), bufs[k].data(), 1, shape,
                                              KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0, &hs[k]);
      if (st != KOLO_OK) FAIL("%s: %s", name.c_str(), kolo_last_error());
    }
    for (int k = kN - 1; k >= 0; --k) {
      kolo_status_t st = kolo_synchronize(hs[k], 30000);
      if (st != KOLO_OK) FAIL("sync async.%d: %s", k, kolo_last_error());
      float want = static_cast<float>(g_size * k + g_size * (g_size - 1) / 2);
      for (float x : bufs[k]) {
        if (x != want) FAIL("async.%d: got %g want %g", k, x, want);
      }
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d allreduce checks passed\n", g_rank, g_size, checks);
  return 0;
}

// The direct user-memory path (an allreduce of at least the agent's
// --direct-min-kb in the trainer's own memory, read and written in place by
// the agent): sizes just below, at and above the threshold (run it on an
// agent with --direct-min-kb 256, or pass KOLO_CHECK_THRESHOLD_KB), every
// dtype and op, buffers at odd addresses, in place and out of place (the
// input must come back unchanged), scale factors, and several large ones in
// flight at once completed in reverse order. Every element is checked.
int runDirect() {
  int checks = 0;
  const kolo_op_t ops[] = {KOLO_SUM, KOLO_AVERAGE, KOLO_MIN, KOLO_MAX, KOLO_PRODUCT};
  // KOLO_CHECK_THRESHOLD_KB: the threshold to straddle (default 256: the
  // agent's --direct-min-kb in DirectUserMemoryIsExactAndTaken; the tests of
  // the default thresholds pass theirs).
  const char* thr_env = std::getenv("KOLO_CHECK_THRESHOLD_KB");
  const size_t threshold = (thr_env != nullptr ? std::strtoull(thr_env, nullptr, 10) : 256) << 10;
  for (int d = 0; d < 8; ++d) {
    auto dt = static_cast<kolo_dtype_t>(d);
    const size_t es = kolo_dtype_size(dt);
    const size_t counts[] = {threshold / es - 1, threshold / es, threshold / es + 3, (3 * threshold) / es + 1};
    for (kolo_op_t op : ops) {
      for (size_t count : counts) {
        std::string name = std::string("direct.") + dtypeName(dt) + "." + opName(op) + "." + std::to_string(count);
        if (checkOne(name, dt, op, count, false, (count & 1) != 0)) return 1;
        ++checks;
      }
    }
  }
  // Odd addresses (1..7 bytes past an aligned start), in place and out of
  // place; the floats go in and come out with memcpy (no misaligned loads
  // or stores in this program).
  for (size_t shift = 1; shift < 8; shift += 3) {
    const size_t count = threshold + 5;  // float32: 4x the threshold
    std::vector<char> in_store(count * 4 + 16), out_store(count * 4 + 16);
    char* in = in_store.data() + shift;
    char* out = out_store.data() + 8 - shift;
    std::vector<float> vals(count), got(count);
    for (size_t i = 0; i < count; ++i) vals[i] = static_cast<float>(inputValue(g_rank, i, KOLO_SUM, KOLO_FLOAT32));
    for (int oop = 0; oop < 2; ++oop) {
      std::memcpy(in, vals.data(), count * 4);
      char* dst = oop ? out : in;
      int64_t shape[1] = {static_cast<int64_t>(count)};
      std::string name = "direct.unaligned." + std::to_string(shift) + "." + std::to_string(oop);
      kolo_status_t st = kolo_allreduce(name.c_str(), in, dst, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
      if (st != KOLO_OK) FAIL("%s: %s", name.c_str(), kolo_last_error());
      std::memcpy(got.data(), dst, count * 4);
      for (size_t i = 0; i < count; ++i) {
        double want = expected(g_size, i, KOLO_SUM, KOLO_FLOAT32);
        if (got[i] != want) FAIL("%s element %zu: got %g want %g", name.c_str(), i, got[i], want);
      }
      ++checks;
    }
  }
  {
    std::vector<double> v(threshold / 4 + 9);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(g_rank + 1) * (i + 1);
    int64_t shape[1] = {static_cast<int64_t>(v.size())};
    kolo_status_t st = kolo_allreduce("direct.scaled", v.data(), v.data(), 1, shape, KOLO_FLOAT64, KOLO_SUM, 0.5, 3.0);
    if (st != KOLO_OK) FAIL("direct.scaled: %s", kolo_last_error());
    double ranksum = g_size * (g_size + 1) / 2.0;
    for (size_t i = 0; i < v.size(); ++i) {
      double want = 3.0 * (0.5 * ranksum * (i + 1));
      if (v[i] != want) FAIL("direct.scaled element %zu: got %g want %g", i, v[i], want);
    }
    ++checks;
  }
  {
    // KOLO_CHECK_ASYNC_N: how many (default 12; more than an arena holds
    // makes KOLO_DIRECT=auto send the rest direct).
    const char* n_env = std::getenv("KOLO_CHECK_ASYNC_N");
    const int kN = n_env != nullptr ? std::atoi(n_env) : 12;
    // KOLO_CHECK_ASYNC_LAG_MS: ranks other than 0 wait this long first, so
    // rank 0 has all its tensors in flight at once (none can complete).
    const char* lag_env = std::getenv("KOLO_CHECK_ASYNC_LAG_MS");
    if (lag_env != nullptr && g_rank != 0)
      ::usleep(static_cast<useconds_t>(std::atoi(lag_env)) * 1000);
    std::vector<std::vector<float>> bufs(kN, std::vector<float>(threshold / 2 + 31 * kN));
    std::vector<kolo_handle_t> hs(kN);
    for (int k = 0; k < kN; ++k) {
      bufs[k].resize(threshold / 2 + 31 * k);
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = static_cast<float>(k + g_rank + static_cast<int>(i % 7));
      int64_t shape[1] = {static_cast<int64_t>(bufs[k].size())};
      std::string name = "direct.async." + std::to_string(k);
      kolo_status_t st = kolo_allreduce_async(name.c_str(), bufs[k].data(), bufs[k].data(), 1, shape, KOLO_FLOAT32,
                                              KOLO_SUM, 1.0, 1.0, &hs[k]);
      if (st != KOLO_OK) FAIL("%s: %s", name.c_str(), kolo_last_error());
    }
    for (int k = kN - 1; k >= 0; --k) {
      if (kolo_synchronize(hs[k], 30000) != KOLO_OK) FAIL("sync direct.async.%d: %s", k, kolo_last_error());
      for (size_t i = 0; i < bufs[k].size(); ++i) {
        float want = static_cast<float>(g_size * (k + static_cast<int>(i % 7)) + g_size * (g_size - 1) / 2);
        if (bufs[k][i] != want) FAIL("direct.async.%d element %zu: got %g want %g", k, i, bufs[k][i], want);
      }
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d direct checks passed\n", g_rank, g_size, checks);
  return 0;
}

// A rank whose direct-path tensor the agent cannot use: rank 1's input is
// inaccessible (PROT_NONE), then rank 0's output is read-only. Every rank's op fails with
// the agent's text (--across, ranks 0 and 1 on one agent: the other
// agents' ranks get the good result of bad.output); the job goes on (the next
// allreduce is exact).
// Across agents with the direct path pipelined (rank 1 alone on its agent,
// its tensor read chunk by chunk while the agents' ring runs): an unreadable
// input fails the whole job, on every rank.
int runDirectBadPipelined() {
  const size_t count = (1u << 18) + 1;
  const size_t bytes = count * sizeof(float);
  int64_t shape[1] = {static_cast<int64_t>(count)};
  std::vector<float> good(count, 1.0f);
  void* none = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (none == MAP_FAILED) FAIL("mmap: %s", std::strerror(errno));
  void* in = g_rank == 1 ? none : good.data();
  kolo_status_t st = kolo_allreduce("bad.pipelined", in, in, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  std::printf("rank %d: bad.pipelined: %s: %s\n", g_rank, kolo_status_string(st), st == KOLO_OK ? "" : kolo_last_error());
  if (g_rank == 1 && st == KOLO_OK) FAIL("bad.pipelined succeeded on the rank whose input is unreadable");
  st = kolo_allreduce("after.job.failed", good.data(), good.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  if (st == KOLO_OK) FAIL("after.job.failed: the job went on after a tensor the ring used could not be read");
  std::printf("rank %d: OK the job failed: %s\n", g_rank, kolo_last_error());
  ::munmap(none, bytes);
  return 0;
}

int runDirectBad(bool across) {
  const size_t count = (1u << 18) + 1;  // 1 MiB of float32: the direct path
  const size_t bytes = count * sizeof(float);
  int64_t shape[1] = {static_cast<int64_t>(count)};
  std::vector<float> good(count, 1.0f), out(count, 0.0f);
  // Reserved but inaccessible (PROT_NONE), so nothing else lands there.
  void* gone = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (gone == MAP_FAILED) FAIL("mmap: %s", std::strerror(errno));
  const void* in = g_rank == 1 ? gone : good.data();
  kolo_status_t st = kolo_allreduce("bad.input", in, out.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  if (st == KOLO_OK) FAIL("bad.input: succeeded with rank 1's input unmapped");
  std::printf("rank %d: bad.input: %s: %s\n", g_rank, kolo_status_string(st), kolo_last_error());
  void* ro = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ro == MAP_FAILED) FAIL("mmap: %s", std::strerror(errno));
  void* dst = g_rank == 0 ? ro : out.data();
  st = kolo_allreduce("bad.output", good.data(), dst, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  if (across && kolo_cross_rank() != 0) {
    // Across agents the agents' result is good; only rank 0's agent fails
    // the op (its write into rank 0 failed).
    if (st != KOLO_OK) FAIL("bad.output on rank %d (another agent than rank 0): %s", g_rank, kolo_last_error());
    for (size_t i = 0; i < count; ++i) {
      if (out[i] != static_cast<float>(g_size)) FAIL("bad.output element %zu: got %g want %d", i, out[i], g_size);
    }
  } else {
    if (st == KOLO_OK) FAIL("bad.output: succeeded with rank 0's output read-only");
    std::printf("rank %d: bad.output: %s: %s\n", g_rank, kolo_status_string(st), kolo_last_error());
  }
  ::munmap(ro, bytes);
  ::munmap(gone, bytes);
  for (size_t i = 0; i < count; ++i) good[i] = static_cast<float>(g_rank + (i % 3));
  st = kolo_allreduce("after.bad", good.data(), good.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  if (st != KOLO_OK) FAIL("after.bad: %s", kolo_last_error());
  for (size_t i = 0; i < count; ++i) {
    float want = static_cast<float>(g_size * (g_size - 1) / 2 + g_size * static_cast<int>(i % 3));
    if (good[i] != want) FAIL("after.bad element %zu: got %g want %g", i, good[i], want);
  }
  std::printf("rank %d: OK direct errors checked\n", g_rank);
  return 0;
}

int runMismatch() {
  std::vector<double> buf(16, 1.0);
  int64_t shape[1] = {16};
  int64_t other_shape[1] = {8};
  // dtype: the last rank sends float64, everyone else float32 (16 floats = 8 doubles in bytes? no: same element count).
  kolo_dtype_t dt = g_rank == g_size - 1 ? KOLO_FLOAT64 : KOLO_FLOAT32;
  kolo_status_t st = kolo_allreduce("bad.dtype", buf.data(), buf.data(), 1, shape, dt, KOLO_SUM, 1, 1);
  if (st != KOLO_ERR_INVALID_ARGUMENT) FAIL("dtype mismatch gave %s, want KOLO_ERR_INVALID_ARGUMENT", kolo_status_string(st));
  std::string msg = kolo_last_error();
  if (msg.find("Mismatched data types") == std::string::npos || msg.find("float32") == std::string::npos ||
      msg.find("float64") == std::string::npos || msg.find("rank " + std::to_string(g_size - 1)) == std::string::npos) {
    FAIL("dtype mismatch message lacks sides or ranks: %s", msg.c_str());
  }
  std::printf("rank %d: dtype mismatch error: %s\n", g_rank, msg.c_str());
  st = kolo_allreduce("bad.shape", buf.data(), buf.data(), 1, g_rank == 0 ? other_shape : shape, KOLO_FLOAT32,
                      KOLO_SUM, 1, 1);
  msg = kolo_last_error();
  if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("shape [8]") == std::string::npos ||
      msg.find("shape [16]") == std::string::npos) {
    FAIL("shape mismatch: %s %s", kolo_status_string(st), msg.c_str());
  }
  st = kolo_allreduce("bad.op", buf.data(), buf.data(), 1, shape, KOLO_FLOAT32, g_rank == 0 ? KOLO_MAX : KOLO_SUM, 1, 1);
  msg = kolo_last_error();
  if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("max") == std::string::npos) FAIL("op mismatch: %s", msg.c_str());
  st = kolo_allreduce("bad.scale", buf.data(), buf.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, g_rank == 0 ? 2 : 1);
  msg = kolo_last_error();
  if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("postscale") == std::string::npos) FAIL("scale mismatch: %s", msg.c_str());
  // The job goes on.
  std::vector<float> ok(16, static_cast<float>(g_rank));
  st = kolo_allreduce("after.mismatch", ok.data(), ok.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
  if (st != KOLO_OK) FAIL("allreduce after the mismatches: %s", kolo_last_error());
  float want = g_size * (g_size - 1) / 2.0f;
  if (ok[3] != want) FAIL("after mismatch got %g want %g", ok[3], want);
  std::printf("rank %d: OK mismatch errors reported and job recovered\n", g_rank);
  return 0;
}

int runDuplicate() {
  // Rank 0 submits "dup" twice before anyone else submits it (the others
  // wait for "dup.ready", which rank 0 joins only after both submissions),
  // so the first "dup" is certainly still in flight when the second comes.
  std::vector<float> a(8, 1), b(8, 1), token(1, 0);
  int64_t shape[1] = {8};
  int64_t one[1] = {1};
  kolo_handle_t h1 = 0, h2 = 0;
  if (g_rank == 0) {
    kolo_status_t st = kolo_allreduce_async("dup", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h1);
    if (st != KOLO_OK) FAIL("first submit: %s", kolo_last_error());
    st = kolo_allreduce_async("dup", b.data(), b.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h2);
    if (st == KOLO_OK) st = kolo_synchronize(h2, 10000);
    std::string msg = kolo_last_error();
    if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("dup") == std::string::npos) {
      FAIL("duplicate name gave %s: %s", kolo_status_string(st), msg.c_str());
    }
    std::printf("rank 0: duplicate error: %s\n", msg.c_str());
  }
  if (kolo_allreduce("dup.ready", token.data(), token.data(), 1, one, KOLO_FLOAT32, KOLO_SUM, 1, 1) != KOLO_OK) {
    FAIL("dup.ready: %s", kolo_last_error());
  }
  if (g_rank != 0) {
    kolo_status_t st = kolo_allreduce_async("dup", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h1);
    if (st != KOLO_OK) FAIL("submit: %s", kolo_last_error());
  }
  kolo_status_t st = kolo_synchronize(h1, 10000);
  if (st != KOLO_OK || a[0] != static_cast<float>(g_size)) FAIL("first dup op: %s", kolo_last_error());
  std::printf("rank %d: OK duplicate rejected, first op intact\n", g_rank);
  return 0;
}

int runDie(int victim) {
  std::vector<float> a(1000, 1);
  int64_t shape[1] = {1000};
  for (int i = 0; i < 3; ++i) {
    if (kolo_allreduce(("warm." + std::to_string(i)).c_str(), a.data(), a.data(), 1, shape, KOLO_FLOAT32,
                       KOLO_SUM, 1, 1) != KOLO_OK) {
      FAIL("warm-up: %s", kolo_last_error());
    }
  }
  if (g_rank == victim) {
    // Submit one op the others will not pair with, then die with it in flight.
    kolo_handle_t h;
    (void)kolo_allreduce_async("victim.only", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the others block on "mid"
    std::printf("rank %d: killing myself\n", g_rank);
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
  kolo_handle_t h;
  auto t0 = Clock::now();
  kolo_status_t st = kolo_allreduce_async("mid", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h);
  if (st == KOLO_OK) st = kolo_synchronize(h, 15000);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st != KOLO_ERR_PEER_FAILURE) FAIL("pending op gave %s (%s), want KOLO_ERR_PEER_FAILURE", kolo_status_string(st), kolo_last_error());
  std::printf("rank %d: pending op failed after %.3f s: %s\n", g_rank, waited, kolo_last_error());
  auto t1 = Clock::now();
  st = kolo_allreduce("later", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
  double later = std::chrono::duration<double>(Clock::now() - t1).count();
  if (st != KOLO_ERR_PEER_FAILURE) FAIL("later op gave %s, want KOLO_ERR_PEER_FAILURE", kolo_status_string(st));
  std::printf("rank %d: OK peer failure seen (later op failed in %.3f s)\n", g_rank, later);
  return 0;
}

// Split reduction (the ranks reduce their shares): every rank submits "mid"
// (1 MiB, split) but the victim dies without reducing its share; the
// others, waiting for it, fail with PEER_FAILURE within the agent's
// detection, not after KOLO_OP_TIMEOUT.
int runSplitDie(int victim) {
  std::vector<float> a(262144, 1);
  int64_t shape[1] = {262144};
  for (int i = 0; i < 3; ++i) {
    std::fill(a.begin(), a.end(), 1.0f);
    if (kolo_allreduce(("warm." + std::to_string(i)).c_str(), a.data(), a.data(), 1, shape,
                       KOLO_FLOAT32, KOLO_SUM, 1, 1) != KOLO_OK) {
      FAIL("warm-up: %s", kolo_last_error());
    }
    if (a[0] != static_cast<float>(g_size) || a.back() != static_cast<float>(g_size))
      FAIL("warm-up result");
  }
  kolo_handle_t h;
  auto t0 = Clock::now();
  kolo_status_t st =
      kolo_allreduce_async("mid", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h);
  if (g_rank == victim) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(300));  // the others reduce and wait for its share
    std::printf("rank %d: killing myself\n", g_rank);
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
  if (st == KOLO_OK) st = kolo_synchronize(h, 15000);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st != KOLO_ERR_PEER_FAILURE) {
    FAIL("pending op gave %s (%s), want KOLO_ERR_PEER_FAILURE", kolo_status_string(st),
         kolo_last_error());
  }
  std::printf("rank %d: pending op failed after %.3f s: %s\n", g_rank, waited, kolo_last_error());
  return 0;
}

// Split reduction with a rank that submits but does not look at its ops for
// `lag_ms` (run with KOLO_OP_TIMEOUT below it): the others fail "mid" with
// TIMED_OUT naming that rank once their op timeout passed; the late rank
// then finishes it exactly (their slots are kept for it), and a barrier
// shows the job goes on.
int runSplitStall(int late, int lag_ms) {
  std::vector<float> a(262144, 1);
  int64_t shape[1] = {262144};
  // (the first op's wait reads the agent's PeerArenas frame: "mid" splits)
  if (kolo_allreduce("warm", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1) !=
      KOLO_OK) {
    FAIL("warm-up: %s", kolo_last_error());
  }
  std::fill(a.begin(), a.end(), 1.0f);
  kolo_handle_t h;
  auto t0 = Clock::now();
  kolo_status_t st =
      kolo_allreduce_async("mid", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h);
  if (st != KOLO_OK) FAIL("submit: %s", kolo_last_error());
  if (g_rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(lag_ms));
  st = kolo_synchronize(h, 30000);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  if (g_rank == late) {
    if (st != KOLO_OK) FAIL("late rank: %s (%s)", kolo_status_string(st), kolo_last_error());
    if (a[0] != static_cast<float>(g_size) || a.back() != static_cast<float>(g_size))
      FAIL("late rank's result");
  } else {
    if (st != KOLO_ERR_TIMED_OUT)
      FAIL("mid gave %s (%s), want KOLO_ERR_TIMED_OUT", kolo_status_string(st), kolo_last_error());
    std::printf("rank %d: split op failed after %.3f s: %s\n", g_rank, waited, kolo_last_error());
  }
  if (kolo_barrier(30000) != KOLO_OK) FAIL("barrier: %s", kolo_last_error());
  std::printf("rank %d: OK split stall checked\n", g_rank);
  return 0;
}

// Rank 1 arrives late at "slow" (a slow rank, as in a stalled job).
int runStall(int delay_s) {
  std::vector<float> a(64, 1);
  int64_t shape[1] = {64};
  if (g_rank == 1) std::this_thread::sleep_for(std::chrono::seconds(delay_s));
  kolo_status_t st = kolo_allreduce("slow", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
  std::printf("rank %d: slow allreduce: %s %s\n", g_rank, kolo_status_string(st), st == KOLO_OK ? "" : kolo_last_error());
  return st == KOLO_OK ? 0 : 1;
}

// Training-step shape: each step submits `tensors` allreduces of varied
// sizes at once (as backward produces gradients), then waits for all; every
// element is checked. Exercises fusion while its parameters change (autotune).
int runSteps(int steps) {
  const int tensors = 24;
  std::vector<std::vector<float>> bufs(tensors);
  std::vector<kolo_handle_t> handles(tensors);
  for (int t = 0; t < tensors; ++t) bufs[t].resize(static_cast<size_t>(97 + 4099 * (t % 7) + 131 * t));
  for (int s = 0; s < steps; ++s) {
    for (int t = 0; t < tensors; ++t) {
      auto& b = bufs[t];
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((g_rank + 1) * (s + t + static_cast<int>(i % 5)));
      int64_t shape[1] = {static_cast<int64_t>(b.size())};
      std::string name = "step.grad" + std::to_string(t);
      kolo_status_t st = kolo_allreduce_async(name.c_str(), b.data(), b.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM,
                                              1, 1, &handles[t]);
      if (st != KOLO_OK) FAIL("step %d tensor %d: %s: %s", s, t, kolo_status_string(st), kolo_last_error());
    }
    for (int t = tensors - 1; t >= 0; --t) {
      kolo_status_t st = kolo_synchronize(handles[t], -1);
      if (st != KOLO_OK) FAIL("step %d tensor %d: %s: %s", s, t, kolo_status_string(st), kolo_last_error());
      const float ranks_sum = static_cast<float>(g_size * (g_size + 1) / 2);
      for (size_t i = 0; i < bufs[t].size(); ++i) {
        float want = ranks_sum * static_cast<float>(s + t + static_cast<int>(i % 5));
        if (bufs[t][i] != want) FAIL("step %d tensor %d [%zu]: got %g want %g", s, t, i, bufs[t][i], want);
      }
    }
  }
  std::printf("rank %d: OK %d steps\n", g_rank, steps);
  return 0;
}

// Rank 0 starts the agent's timeline through the API, every rank runs a
// few allreduces, rank 0 stops it; a bad call is refused with its text.
int runApiTimeline(const char* path) {
  if (kolo_start_timeline(nullptr, 0) != KOLO_ERR_INVALID_ARGUMENT) FAIL("start_timeline(NULL) was accepted");
  if (g_rank == 0) {
    kolo_status_t st = kolo_start_timeline(path, 1);
    if (st != KOLO_OK) FAIL("start_timeline: %s: %s", kolo_status_string(st), kolo_last_error());
  }
  if (kolo_barrier(-1) != KOLO_OK) FAIL("barrier: %s", kolo_last_error());
  std::vector<float> a(1024, 1.0f);
  int64_t shape[1] = {1024};
  for (int i = 0; i < 10; ++i) {
    kolo_status_t st = kolo_allreduce("tl.grad", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
    if (st != KOLO_OK) FAIL("allreduce: %s", kolo_last_error());
  }
  if (kolo_barrier(-1) != KOLO_OK) FAIL("barrier: %s", kolo_last_error());
  if (g_rank == 0) {
    kolo_status_t st = kolo_stop_timeline();
    if (st != KOLO_OK) FAIL("stop_timeline: %s: %s", kolo_status_string(st), kolo_last_error());
  }
  if (kolo_barrier(-1) != KOLO_OK) FAIL("barrier: %s", kolo_last_error());
  std::printf("rank %d: OK api timeline\n", g_rank);
  return 0;
}

int runLoop(int n, size_t count) {
  std::vector<float> a(count);
  int64_t shape[1] = {static_cast<int64_t>(count)};
  for (int i = 0; i < n; ++i) {
    for (auto& x : a) x = static_cast<float>(g_rank + i);
    kolo_status_t st = kolo_allreduce("loop", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
    if (st != KOLO_OK) FAIL("loop %d: %s: %s", i, kolo_status_string(st), kolo_last_error());
    float want = static_cast<float>(g_size * i + g_size * (g_size - 1) / 2);
    if (a[17] != want) FAIL("loop %d: got %g want %g", i, a[17], want);
  }
  std::printf("rank %d: OK %d loop allreduces\n", g_rank, n);
  return 0;
}

// `n` small allreduces with gaps that cross the agent's and libkolo's spin
// windows (none, a short spin, sleeps past both), the ranks out of step,
// every 7th step two in flight at once: the doorbell and completion
// wake-ups are skipped while the other side polls, and a lost one costs
// the op a poll timeout (libkolo's 1 s) or the agent's next timer. Every
// result is checked and every op must complete within `limit_ms`.
int runWakeups(int n, int limit_ms) {
  const std::chrono::microseconds gaps[] = {
      std::chrono::microseconds(0), std::chrono::microseconds(10), std::chrono::microseconds(40),
      std::chrono::microseconds(200), std::chrono::microseconds(2000)};
  double slowest_ms = 0;
  int slowest_step = -1;
  for (int i = 0; i < n; ++i) {
    auto gap = gaps[(i + 2 * g_rank) % 5];
    if (gap.count() == 10) {
      for (auto end = Clock::now() + gap; Clock::now() < end;) {
      }
    } else if (gap.count() > 0) {
      std::this_thread::sleep_for(gap);
    }
    const int in_flight = i % 7 == 0 ? 2 : 1;
    float v[2] = {static_cast<float>(g_rank + i), static_cast<float>(g_rank * 3 + i)};
    int64_t shape[1] = {1};
    kolo_handle_t h[2] = {0, 0};
    auto t0 = Clock::now();
    for (int k = 0; k < in_flight; ++k) {
      kolo_status_t st = kolo_allreduce_async(k == 0 ? "wake.a" : "wake.b", &v[k], &v[k], 1, shape,
                                              KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0, &h[k]);
      if (st != KOLO_OK) FAIL("step %d: %s: %s", i, kolo_status_string(st), kolo_last_error());
    }
    for (int k = 0; k < in_flight; ++k) {
      kolo_status_t st = kolo_synchronize(h[k], -1);
      if (st != KOLO_OK) FAIL("step %d: %s: %s", i, kolo_status_string(st), kolo_last_error());
    }
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (ms > slowest_ms) {
      slowest_ms = ms;
      slowest_step = i;
    }
    float want0 = static_cast<float>(g_size * i + g_size * (g_size - 1) / 2);
    float want1 = static_cast<float>(g_size * i + 3 * g_size * (g_size - 1) / 2);
    if (v[0] != want0) FAIL("step %d: got %g want %g", i, v[0], want0);
    if (in_flight == 2 && v[1] != want1) FAIL("step %d (second): got %g want %g", i, v[1], want1);
  }
  if (slowest_ms > limit_ms) {
    FAIL("step %d took %.1f ms (bound %d ms): a lost wake-up", slowest_step, slowest_ms, limit_ms);
  }
  std::printf("rank %d: OK %d wakeups, slowest %.2f ms\n", g_rank, n, slowest_ms);
  return 0;
}

// Allreduces until the test creates `stop_file` (at most 120 s). The last
// element carries each rank's "I saw the file" flag, so every rank stops
// after the same step.
int runUntil(const char* stop_file) {
  const size_t count = 4096;
  std::vector<float> a(count + 1);
  int64_t shape[1] = {static_cast<int64_t>(count + 1)};
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  const char* progress = std::getenv("KOLO_CHECK_PROGRESS");
  int i = 0;
  for (;; ++i) {
    for (size_t k = 0; k < count; ++k) a[k] = static_cast<float>(g_rank + i + static_cast<int>(k % 3));
    a[count] = ::access(stop_file, F_OK) == 0 ? 1.0f : 0.0f;
    kolo_status_t st = kolo_allreduce("until", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
    if (st != KOLO_OK) FAIL("step %d: %s: %s", i, kolo_status_string(st), kolo_last_error());
    for (size_t k = 0; k < count; ++k) {
      float want = static_cast<float>(g_size * (i + static_cast<int>(k % 3)) + g_size * (g_size - 1) / 2);
      if (a[k] != want) FAIL("step %d [%zu]: got %g want %g", i, k, a[k], want);
    }
    if (i == 0 && g_rank == 0) {
      std::printf("training\n");
      std::fflush(stdout);
    }
    if (a[count] > 0.0f) break;
    if (progress != nullptr && g_rank == 0 && i % 50 == 0) {
      // Rank 0's step count, for tests that watch the job go on (rewritten in place).
      if (FILE* f = std::fopen(progress, "w")) {
        std::fprintf(f, "%d\n", i);
        std::fclose(f);
      }
    }
    // Pacing, not synchronisation: leave the shared CPUs to the daemons.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (Clock::now() > give_up) FAIL("step %d: %s did not appear within 120 s", i, stop_file);
  }
  std::printf("rank %d: OK %d allreduces until stopped\n", g_rank, i + 1);
  return 0;
}

// The value a broadcast must deliver: the root's input, rounded through the dtype.
double roundTrip(kolo_dtype_t dt, double v) {
  char tmp[8];
  store(dt, tmp, 0, v);
  return load(dt, tmp, 0);
}

int checkBroadcast(const std::string& name, kolo_dtype_t dt, size_t count, int root, bool zero_copy) {
  size_t bytes = count * kolo_dtype_size(dt);
  std::vector<char> vec;
  void* buf = nullptr;
  if (zero_copy) {
    buf = kolo_alloc_shared(bytes ? bytes : 1);
    if (buf == nullptr) FAIL("kolo_alloc_shared(%zu): %s", bytes, kolo_last_error());
  } else {
    vec.resize(bytes + 1);
    buf = vec.data();
  }
  // Every rank fills its own input; only the root's may survive.
  for (size_t i = 0; i < count; ++i) store(dt, buf, i, inputValue(g_rank, i, KOLO_SUM, dt));
  int64_t shape[2] = {static_cast<int64_t>(count), 1};
  int ndim = (count % 2 == 0) ? 1 : 2;
  kolo_status_t st = kolo_broadcast(name.c_str(), buf, ndim, shape, dt, root);
  if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  for (size_t i = 0; i < count; ++i) {
    double want = roundTrip(dt, inputValue(root, i, KOLO_SUM, dt));
    double got = load(dt, buf, i);
    if (got != want) {
      FAIL("%s (%s count %zu root %d%s) element %zu: got %g, want %g", name.c_str(), dtypeName(dt), count, root,
           zero_copy ? " zero-copy" : "", i, got, want);
    }
  }
  if (zero_copy) kolo_free_shared(buf);
  return 0;
}

int runBroadcast(bool big) {
  std::vector<size_t> sizes = {0, 1, 7, 1001, 65537};
  std::vector<int> roots = {0, g_size - 1, g_size / 2};
  int checks = 0;
  for (int d = 0; d < 8; ++d) {
    auto dt = static_cast<kolo_dtype_t>(d);
    for (int root : roots) {
      for (size_t count : sizes) {
        std::string name = std::string("b.") + dtypeName(dt) + ".r" + std::to_string(root) + "." + std::to_string(count);
        if (checkBroadcast(name, dt, count, root, false)) return 1;
        ++checks;
      }
    }
  }
  if (checkBroadcast("b.zc", KOLO_FLOAT32, 4099, g_size - 1, true)) return 1;
  ++checks;
  if (big) {
    for (int root : roots) {
      if (checkBroadcast("b.big.r" + std::to_string(root), KOLO_FLOAT32, (1u << 20) + 3, root, false)) return 1;
      if (checkBroadcast("b.big16.r" + std::to_string(root), KOLO_BFLOAT16, (1u << 20) + 1, root, false)) return 1;
      checks += 2;
    }
  }
  // Several broadcasts in flight at once, with different roots, synchronized in reverse order.
  {
    const int kN = 16;
    std::vector<std::vector<int32_t>> bufs(kN, std::vector<int32_t>(333));
    std::vector<kolo_handle_t> hs(kN);
    for (int k = 0; k < kN; ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = g_rank * 1000 + k;
      int64_t shape[1] = {333};
      std::string name = "b.async." + std::to_string(k);
      kolo_status_t st = kolo_broadcast_async(name.c_str(), bufs[k].data(), 1, shape, KOLO_INT32, k % g_size, &hs[k]);
      if (st != KOLO_OK) FAIL("%s: %s", name.c_str(), kolo_last_error());
    }
    for (int k = kN - 1; k >= 0; --k) {
      kolo_status_t st = kolo_synchronize(hs[k], 30000);
      if (st != KOLO_OK) FAIL("sync b.async.%d: %s", k, kolo_last_error());
      int32_t want = (k % g_size) * 1000 + k;
      for (int32_t x : bufs[k]) {
        if (x != want) FAIL("b.async.%d: got %d want %d", k, x, want);
      }
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d broadcast checks passed\n", g_rank, g_size, checks);
  return 0;
}

// Rank r contributes dim0(r) rows of `trailing`; checks the concatenation.
int checkAllgather(const std::string& name, kolo_dtype_t dt, const std::vector<int64_t>& trailing,
                   const std::vector<int64_t>& dim0s) {
  size_t row = 1;
  for (int64_t t : trailing) row *= static_cast<size_t>(t);
  size_t es = kolo_dtype_size(dt);
  size_t count = static_cast<size_t>(dim0s[g_rank]) * row;
  std::vector<char> in(count * es + 1);
  for (size_t i = 0; i < count; ++i) store(dt, in.data(), i, inputValue(g_rank, i, KOLO_SUM, dt));
  std::vector<int64_t> shape = {dim0s[g_rank]};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  kolo_handle_t h = 0;
  kolo_status_t st = kolo_allgather_async(name.c_str(), in.data(), static_cast<int>(shape.size()), shape.data(), dt, &h);
  if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  std::fill(in.begin(), in.end(), 0x5a);  // the input may be reused once the call returns
  st = kolo_synchronize(h, 60000);
  if (st != KOLO_OK) FAIL("%s: sync: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  void* data = nullptr;
  int64_t dim0 = -1;
  st = kolo_result(h, &data, &dim0);
  if (st != KOLO_OK) FAIL("%s: kolo_result: %s", name.c_str(), kolo_last_error());
  int64_t want_dim0 = 0;
  for (int r = 0; r < g_size; ++r) want_dim0 += dim0s[r];
  if (dim0 != want_dim0) FAIL("%s: first dimension %lld, want %lld", name.c_str(), (long long)dim0, (long long)want_dim0);
  size_t off = 0;
  for (int r = 0; r < g_size; ++r) {
    size_t n = static_cast<size_t>(dim0s[r]) * row;
    for (size_t i = 0; i < n; ++i) {
      double want = roundTrip(dt, inputValue(r, i, KOLO_SUM, dt));
      double got = load(dt, data, off + i);
      if (got != want) {
        FAIL("%s (%s) rank %d's element %zu (output element %zu): got %g, want %g", name.c_str(), dtypeName(dt), r, i,
             off + i, got, want);
      }
    }
    off += n;
  }
  kolo_release(h);
  void* again = nullptr;
  if (kolo_result(h, &again, &dim0) == KOLO_OK) FAIL("%s: kolo_result after kolo_release succeeded", name.c_str());
  return 0;
}

int runAllgather(bool big) {
  int checks = 0;
  const std::vector<std::vector<int64_t>> trailings = {{}, {3}, {2, 5}};
  for (int round = 0; round < 2; ++round) {
    std::vector<int64_t> dim0s(g_size);
    for (int r = 0; r < g_size; ++r) dim0s[r] = (r * 3 + round) % 4;  // 0 occurs
    for (int d = 0; d < 8; ++d) {
      auto dt = static_cast<kolo_dtype_t>(d);
      for (size_t t = 0; t < trailings.size(); ++t) {
        std::string name = std::string("g.") + dtypeName(dt) + ".t" + std::to_string(t) + ".r" + std::to_string(round);
        if (checkAllgather(name, dt, trailings[t], dim0s)) return 1;
        ++checks;
      }
    }
  }
  {
    // Every rank sends nothing, and a single rank sends everything.
    std::vector<int64_t> zeros(g_size, 0), one(g_size, 0);
    one[g_size - 1] = 1001;
    if (checkAllgather("g.zeros", KOLO_FLOAT32, {4}, zeros)) return 1;
    if (checkAllgather("g.one", KOLO_INT64, {}, one)) return 1;
    checks += 2;
  }
  {
    // The C++ API (kolo.hpp): rank r sends r + 1 int32 rows of {r, r}.
    std::vector<int32_t> mine(2 * (g_rank + 1), g_rank);
    auto g = kolo::allgather("g.cpp", mine.data(), {g_rank + 1, 2}, kolo::DataType::kInt32);
    if (!g.ok()) FAIL("kolo::allgather: %s", g.result().toString().c_str());
    int64_t want_rows = static_cast<int64_t>(g_size) * (g_size + 1) / 2;
    if (g->dim0 != want_rows || g->data.size() != static_cast<size_t>(want_rows) * 8) {
      FAIL("kolo::allgather: %lld rows, %zu bytes", static_cast<long long>(g->dim0), g->data.size());
    }
    const auto* v = reinterpret_cast<const int32_t*>(g->data.data());
    size_t k = 0;
    for (int r = 0; r < g_size; ++r) {
      for (int i = 0; i < 2 * (r + 1); ++i, ++k) {
        if (v[k] != r) FAIL("kolo::allgather element %zu: got %d want %d", k, v[k], r);
      }
    }
    kolo::Result b = kolo::barrier(30000);
    if (!b.ok()) FAIL("kolo::barrier: %s", b.toString().c_str());
    ++checks;
  }
  if (big) {
    std::vector<int64_t> dim0s(g_size);
    for (int r = 0; r < g_size; ++r) dim0s[r] = 100003 + 7 * r;
    if (checkAllgather("g.big", KOLO_FLOAT32, {5}, dim0s)) return 1;
    ++checks;
  }
  std::printf("rank %d/%d: OK %d allgather checks passed\n", g_rank, g_size, checks);
  return 0;
}

int checkReducescatter(const std::string& name, kolo_dtype_t dt, kolo_op_t op, int64_t dim0,
                       const std::vector<int64_t>& trailing) {
  size_t row = 1;
  for (int64_t t : trailing) row *= static_cast<size_t>(t);
  size_t es = kolo_dtype_size(dt);
  size_t count = static_cast<size_t>(dim0) * row;
  std::vector<char> in(count * es + 1);
  for (size_t i = 0; i < count; ++i) store(dt, in.data(), i, inputValue(g_rank, i, op, dt));
  int64_t extra = dim0 % g_size;
  int64_t rows = dim0 / g_size + (g_rank < extra ? 1 : 0);
  int64_t first = g_rank * (dim0 / g_size) + std::min<int64_t>(g_rank, extra);
  std::vector<char> out(static_cast<size_t>(rows) * row * es + 1, 0x5a);
  std::vector<int64_t> shape = {dim0};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  kolo_status_t st = kolo_reducescatter(name.c_str(), in.data(), rows > 0 ? out.data() : nullptr,
                                        static_cast<int>(shape.size()), shape.data(), dt, op);
  if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  for (size_t i = 0; i < static_cast<size_t>(rows) * row; ++i) {
    size_t global = static_cast<size_t>(first) * row + i;
    double want = expected(g_size, global, op, dt);
    double got = load(dt, out.data(), i);
    if (got != want) {
      FAIL("%s (%s %s dim0 %lld) element %zu (global %zu): got %g, want %g", name.c_str(), dtypeName(dt), opName(op),
           static_cast<long long>(dim0), i, global, got, want);
    }
  }
  if (static_cast<unsigned char>(out.back()) != 0x5a) FAIL("%s: wrote past its block", name.c_str());
  return 0;
}

int runReducescatter() {
  int checks = 0;
  const kolo_op_t ops[] = {KOLO_SUM, KOLO_AVERAGE, KOLO_MIN, KOLO_MAX, KOLO_PRODUCT};
  const std::vector<int64_t> dims = {0, 1, static_cast<int64_t>(g_size) + 1, 7, 1001};
  for (int d = 0; d < 8; ++d) {
    auto dt = static_cast<kolo_dtype_t>(d);
    for (kolo_op_t op : ops) {
      for (int64_t dim0 : dims) {
        std::vector<int64_t> trailing = (dim0 % 2 == 1) ? std::vector<int64_t>{3} : std::vector<int64_t>{};
        std::string name = std::string("rs.") + dtypeName(dt) + "." + opName(op) + "." + std::to_string(dim0);
        if (checkReducescatter(name, dt, op, dim0, trailing)) return 1;
        ++checks;
      }
    }
  }
  if (checkReducescatter("rs.big", KOLO_FLOAT32, KOLO_AVERAGE, 65537, {17})) return 1;
  ++checks;
  std::printf("rank %d/%d: OK %d reducescatter checks passed\n", g_rank, g_size, checks);
  return 0;
}

// splits(s, d): rows rank s sends to rank d.
int checkAlltoall(const std::string& name, kolo_dtype_t dt, const std::vector<int64_t>& trailing,
                  const std::function<int64_t(int, int)>& splits, bool pass_null) {
  size_t row = 1;
  for (int64_t t : trailing) row *= static_cast<size_t>(t);
  size_t es = kolo_dtype_size(dt);
  std::vector<int64_t> mine(g_size);
  int64_t dim0 = 0;
  for (int d = 0; d < g_size; ++d) dim0 += mine[d] = splits(g_rank, d);
  size_t count = static_cast<size_t>(dim0) * row;
  std::vector<char> in(count * es + 1);
  for (size_t i = 0; i < count; ++i) store(dt, in.data(), i, inputValue(g_rank, i, KOLO_SUM, dt));
  std::vector<int64_t> shape = {dim0};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  kolo_handle_t h = 0;
  kolo_status_t st = kolo_alltoall_async(name.c_str(), in.data(), static_cast<int>(shape.size()), shape.data(), dt,
                                         pass_null ? nullptr : mine.data(), &h);
  if (st != KOLO_OK) FAIL("%s: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  st = kolo_synchronize(h, 60000);
  if (st != KOLO_OK) FAIL("%s: sync: %s: %s", name.c_str(), kolo_status_string(st), kolo_last_error());
  void* data = nullptr;
  int64_t rows = -1;
  if (kolo_result(h, &data, &rows) != KOLO_OK) FAIL("%s: kolo_result: %s", name.c_str(), kolo_last_error());
  int64_t want_rows = 0;
  for (int s = 0; s < g_size; ++s) want_rows += splits(s, g_rank);
  if (rows != want_rows) FAIL("%s: received %lld rows, want %lld", name.c_str(), (long long)rows, (long long)want_rows);
  size_t off = 0;
  for (int s = 0; s < g_size; ++s) {
    int64_t first = 0;
    for (int t = 0; t < g_rank; ++t) first += splits(s, t);
    size_t n = static_cast<size_t>(splits(s, g_rank)) * row;
    for (size_t i = 0; i < n; ++i) {
      double want = roundTrip(dt, inputValue(s, static_cast<size_t>(first) * row + i, KOLO_SUM, dt));
      double got = load(dt, data, off + i);
      if (got != want) {
        FAIL("%s (%s) from rank %d element %zu: got %g, want %g", name.c_str(), dtypeName(dt), s, i, got, want);
      }
    }
    off += n;
  }
  kolo_release(h);
  return 0;
}

int runAlltoall() {
  int checks = 0;
  const std::vector<std::vector<int64_t>> trailings = {{}, {3}};
  for (int d = 0; d < 8; ++d) {
    auto dt = static_cast<kolo_dtype_t>(d);
    for (size_t t = 0; t < trailings.size(); ++t) {
      std::string name = std::string("a2a.") + dtypeName(dt) + ".t" + std::to_string(t);
      if (checkAlltoall(name, dt, trailings[t], [](int s, int d) { return static_cast<int64_t>((s + 2 * d + 1) % 3); },
                        false)) {
        return 1;
      }
      ++checks;
    }
  }
  if (checkAlltoall("a2a.even", KOLO_FLOAT32, {5}, [](int, int) { return int64_t{2}; }, true)) return 1;
  if (checkAlltoall("a2a.none", KOLO_INT32, {}, [](int, int) { return int64_t{0}; }, false)) return 1;
  if (checkAlltoall("a2a.big", KOLO_FLOAT64, {9}, [](int s, int d) { return int64_t{4099} + s + d; }, false)) return 1;
  checks += 3;
  {
    // Splits that do not add up to the first dimension are refused at once.
    std::vector<float> x(4, 0);
    std::vector<int64_t> bad(g_size, 0);
    int64_t shape[1] = {4};
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_alltoall_async("a2a.bad", x.data(), 1, shape, KOLO_FLOAT32, bad.data(), &h);
    if (st != KOLO_ERR_INVALID_ARGUMENT || std::string(kolo_last_error()).find("splits add up to 0") == std::string::npos) {
      FAIL("bad splits gave %s: %s", kolo_status_string(st), kolo_last_error());
    }
    ++checks;
  }
  std::printf("rank %d/%d: OK %d alltoall checks passed\n", g_rank, g_size, checks);
  return 0;
}

int64_t wallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Ranks arrive staggered (rank r after r*100 ms); every rank must leave the
// barrier after the last arrival. The arrival times are exchanged with a Max
// allreduce afterwards (all ranks of a test run on one machine: one clock).
int runBarrier() {
  for (int round = 0; round < 3; ++round) {
    int late = (g_rank + round) % g_size;
    std::this_thread::sleep_for(std::chrono::milliseconds(100 * late));  // staggering, not synchronisation
    int64_t arrived = wallMicros();
    kolo_status_t st = kolo_barrier(30000);
    int64_t left = wallMicros();
    if (st != KOLO_OK) FAIL("barrier %d: %s: %s", round, kolo_status_string(st), kolo_last_error());
    int64_t last_arrival = arrived;
    int64_t one[1] = {1};
    std::string name = "barrier.check." + std::to_string(round);
    st = kolo_allreduce(name.c_str(), &last_arrival, &last_arrival, 1, one, KOLO_INT64, KOLO_MAX, 1, 1);
    if (st != KOLO_OK) FAIL("%s: %s", name.c_str(), kolo_last_error());
    if (left < last_arrival) {
      FAIL("barrier %d: left at %lld us, before the last rank arrived at %lld us", round,
           static_cast<long long>(left), static_cast<long long>(last_arrival));
    }
    std::printf("rank %d: barrier %d waited %.3f s\n", g_rank, round, (left - arrived) / 1e6);
  }
  std::printf("rank %d: OK barrier never left early\n", g_rank);
  return 0;
}

int runCollMismatch() {
  std::vector<float> buf(16, static_cast<float>(g_rank));
  int64_t shape[1] = {16};
  // Root out of range: refused on the calling rank at once.
  kolo_status_t st = kolo_broadcast("b.badroot", buf.data(), 1, shape, KOLO_FLOAT32, g_size);
  std::string msg = kolo_last_error();
  if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("root rank") == std::string::npos) {
    FAIL("out-of-range root gave %s: %s", kolo_status_string(st), msg.c_str());
  }
  if (g_size >= 2) {
    int root = g_rank == g_size - 1 ? 1 : 0;
    st = kolo_broadcast("b.mismatch", buf.data(), 1, shape, KOLO_FLOAT32, root);
    msg = kolo_last_error();
    if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("Mismatched broadcast root ranks") == std::string::npos ||
        msg.find("root 0") == std::string::npos || msg.find("root 1") == std::string::npos ||
        msg.find("rank " + std::to_string(g_size - 1)) == std::string::npos) {
      FAIL("root mismatch gave %s: %s", kolo_status_string(st), msg.c_str());
    }
    std::printf("rank %d: root mismatch error: %s\n", g_rank, msg.c_str());
    int64_t other[1] = {8};
    st = kolo_broadcast("b.shape", buf.data(), 1, g_rank == 0 ? other : shape, KOLO_FLOAT32, 0);
    msg = kolo_last_error();
    if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("shape [8]") == std::string::npos ||
        msg.find("broadcast") == std::string::npos) {
      FAIL("broadcast shape mismatch gave %s: %s", kolo_status_string(st), msg.c_str());
    }
    // Broadcast against allreduce of the same name.
    if (g_rank == 0) {
      st = kolo_allreduce("b.op", buf.data(), buf.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
    } else {
      st = kolo_broadcast("b.op", buf.data(), 1, shape, KOLO_FLOAT32, 0);
    }
    msg = kolo_last_error();
    if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("Mismatched operations") == std::string::npos) {
      FAIL("allreduce vs broadcast gave %s: %s", kolo_status_string(st), msg.c_str());
    }
  }
  if (g_size >= 2) {
    // Allgather: the first dimension may differ, the others may not.
    std::vector<float> g(2 * 4, 1.0f);
    int64_t gshape[2] = {2, g_rank == 0 ? 3 : 4};
    kolo_handle_t h = 0;
    st = kolo_allgather_async("g.mismatch", g.data(), 2, gshape, KOLO_FLOAT32, &h);
    if (st == KOLO_OK) st = kolo_synchronize(h, 30000);
    msg = kolo_last_error();
    if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("Mismatched allgather tensor shapes") == std::string::npos ||
        msg.find("[2, 3]") == std::string::npos || msg.find("[2, 4]") == std::string::npos ||
        msg.find("rank 0") == std::string::npos) {
      FAIL("allgather trailing-dim mismatch gave %s: %s", kolo_status_string(st), msg.c_str());
    }
    std::printf("rank %d: allgather mismatch error: %s\n", g_rank, msg.c_str());
  }
  if (g_size >= 2) {
    // Reducescatter: every dimension must match.
    std::vector<float> in(6, 1.0f), out(6, 0.0f);
    int64_t rshape[1] = {g_rank == 0 ? 4 : 6};
    st = kolo_reducescatter("rs.mismatch", in.data(), out.data(), 1, rshape, KOLO_FLOAT32, KOLO_SUM);
    msg = kolo_last_error();
    if (st != KOLO_ERR_INVALID_ARGUMENT || msg.find("Mismatched reducescatter tensor shapes") == std::string::npos ||
        msg.find("[4]") == std::string::npos || msg.find("[6]") == std::string::npos) {
      FAIL("reducescatter shape mismatch gave %s: %s", kolo_status_string(st), msg.c_str());
    }
  }
  {
    // A scalar cannot be gathered along a first dimension.
    float x = 1;
    kolo_handle_t h = 0;
    st = kolo_allgather_async("g.scalar", &x, 0, nullptr, KOLO_FLOAT32, &h);
    if (st != KOLO_ERR_INVALID_ARGUMENT) FAIL("scalar allgather gave %s", kolo_status_string(st));
  }
  // The job goes on.
  for (auto& x : buf) x = static_cast<float>(g_rank + 10);
  st = kolo_broadcast("b.after", buf.data(), 1, shape, KOLO_FLOAT32, g_size - 1);
  if (st != KOLO_OK) FAIL("broadcast after the mismatches: %s", kolo_last_error());
  if (buf[5] != static_cast<float>(g_size - 1 + 10)) FAIL("after mismatch got %g", buf[5]);
  std::printf("rank %d: OK collective mismatch errors reported and job recovered\n", g_rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "allreduce";
  auto t0 = Clock::now();
  // KOLO_CHECK_NO_DIRECT_RANK=L: local rank L keeps the direct path off
  // (a job that mixes direct and arena ranks).
  const char* no_direct = std::getenv("KOLO_CHECK_NO_DIRECT_RANK");
  const char* local_rank = std::getenv("KOLO_LOCAL_RANK");
  if (no_direct != nullptr && local_rank != nullptr && std::string(no_direct) == local_rank) {
    ::setenv("KOLO_DIRECT", "0", 1);
  }
  kolo_status_t st = kolo_init();
  if (st != KOLO_OK) {
    std::printf("init failed after %.3f s: %s: %s\n", std::chrono::duration<double>(Clock::now() - t0).count(),
                kolo_status_string(st), kolo_last_error());
    return 3;
  }
  g_rank = kolo_rank();
  g_size = kolo_size();
  int rc = 0;
  if (mode == "allreduce") rc = runAllreduce(argc > 2 && std::string(argv[2]) == "--big");
  else if (mode == "mismatch") rc = runMismatch();
  else if (mode == "direct") rc = runDirect();
  else if (mode == "direct-bad") rc = runDirectBad(argc > 2 && std::string(argv[2]) == "--across");
  else if (mode == "direct-bad-pipelined") rc = runDirectBadPipelined();
  else if (mode == "duplicate") rc = runDuplicate();
  else if (mode == "die") rc = runDie(argc > 2 ? std::atoi(argv[2]) : 1);
  else if (mode == "split-die")
    rc = runSplitDie(argc > 2 ? std::atoi(argv[2]) : 1);
  else if (mode == "split-stall")
    rc = runSplitStall(argc > 2 ? std::atoi(argv[2]) : 1, argc > 3 ? std::atoi(argv[3]) : 3000);
  else if (mode == "stall") rc = runStall(argc > 2 ? std::atoi(argv[2]) : 3);
  else if (mode == "loop") rc = runLoop(argc > 2 ? std::atoi(argv[2]) : 100, argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 4096);
  else if (mode == "until" && argc > 2) rc = runUntil(argv[2]);
  else if (mode == "wakeups")
    rc = runWakeups(argc > 2 ? std::atoi(argv[2]) : 2000, argc > 3 ? std::atoi(argv[3]) : 500);
  else if (mode == "inline") rc = runInline(argc > 2 ? std::atoi(argv[2]) : 20);
  else if (mode == "api-timeline" && argc > 2) rc = runApiTimeline(argv[2]);
  else if (mode == "steps") rc = runSteps(argc > 2 ? std::atoi(argv[2]) : 10);
  else if (mode == "broadcast") rc = runBroadcast(argc > 2 && std::string(argv[2]) == "--big");
  else if (mode == "barrier") rc = runBarrier();
  else if (mode == "reducescatter") rc = runReducescatter();
  else if (mode == "alltoall") rc = runAlltoall();
  else if (mode == "allgather") rc = runAllgather(argc > 2 && std::string(argv[2]) == "--big");
  else if (mode == "coll-mismatch") rc = runCollMismatch();
  else if (mode == "init-only") {
    std::printf("rank %d/%d local %d/%d cross %d/%d\n", g_rank, g_size, kolo_local_rank(), kolo_local_size(),
                kolo_cross_rank(), kolo_cross_size());
  } else {
    std::printf("unknown mode %s\n", mode.c_str());
    rc = 2;
  }
  kolo_shutdown();
  return rc;
}
