// A rank program for the integration tests (launched by the harness or by
// kolorun). It drives libkolo through the C ABI and checks every result
// against a reference computed locally: each rank can compute every other
// rank's input, because inputs are a pure function of (rank, element).
//
//   kolo_check allreduce [--big]   every dtype x op x awkward size
//   kolo_check mismatch            ranks disagree on dtype / shape / op, then recover
//   kolo_check duplicate           a name submitted twice while in flight
//   kolo_check die VICTIM          VICTIM kills itself mid-collective; others must fail fast
//   kolo_check loop N              N allreduces (a second job running alongside)
//   kolo_check init-only           init, print the world, shut down
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "kolo/kolo_c.h"

namespace {

using Clock = std::chrono::steady_clock;
int g_rank = -1, g_size = 0;

#define FAIL(...)                                   \
  do {                                              \
    std::printf("rank %d: FAIL ", g_rank);          \
    std::printf(__VA_ARGS__);                       \
    std::printf("\n");                              \
    std::fflush(stdout);                            \
    kolo_shutdown();                                \
    return 1;                                       \
  } while (0)

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

// One checked allreduce. out_of_place: separate output buffer; zero_copy: arena memory.
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
  if (zero_copy) kolo_free_shared(in);
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
  checks += 3;
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

// Rank 1 arrives late at "slow" (a slow rank, as in a stalled job).
int runStall(int delay_s) {
  std::vector<float> a(64, 1);
  int64_t shape[1] = {64};
  if (g_rank == 1) std::this_thread::sleep_for(std::chrono::seconds(delay_s));
  kolo_status_t st = kolo_allreduce("slow", a.data(), a.data(), 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1);
  std::printf("rank %d: slow allreduce: %s %s\n", g_rank, kolo_status_string(st), st == KOLO_OK ? "" : kolo_last_error());
  return st == KOLO_OK ? 0 : 1;
}

int runLoop(int n) {
  std::vector<float> a(4096);
  int64_t shape[1] = {4096};
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

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "allreduce";
  auto t0 = Clock::now();
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
  else if (mode == "duplicate") rc = runDuplicate();
  else if (mode == "die") rc = runDie(argc > 2 ? std::atoi(argv[2]) : 1);
  else if (mode == "stall") rc = runStall(argc > 2 ? std::atoi(argv[2]) : 3);
  else if (mode == "loop") rc = runLoop(argc > 2 ? std::atoi(argv[2]) : 100);
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
