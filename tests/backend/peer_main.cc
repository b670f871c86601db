// One agent's side of the multi-process backend tests (spawned by
// multiprocess_test.cc): connects through a FileKvStore directory and runs a
// scenario, reporting on stdout.
//
//   kolo_backend_test_peer BACKEND DIR RANK SIZE SCENARIO TIMEOUT_MS
//
// Scenarios:
//   check  allreduce of several shapes/dtypes/ops, compared bit for bit with
//          the reference; prints "OK" and exits 0, or "FAIL ..." and exits 1.
//   loop   allreduce of 1 Mi float32 over and over, printing "iter N" after
//          each; on the first failure prints "RESULT <status>" and exits 2
//          for PeerFailure, 3 for any other error, 4 if no completion came.
//   bench  a backend-only timing (not a test): allreduce float32 sum of
//          KOLO_PEER_BENCH_BYTES (default 64 MiB) KOLO_PEER_BENCH_ITERS times
//          (default 10, after 2 warm-ups), each iteration preceded by a
//          barrier; prints "median_us X min_us Y busbw_GBps Z" (rank 0's
//          times) and exits 0. Backend knobs come from KOLO_BACKEND_CHUNK_BYTES,
//          KOLO_BACKEND_PIPELINE_DEPTH and KOLO_BACKEND_REDUCE_THREAD.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"
#include "tests/backend/test_util.h"

using namespace kolo;
using namespace kolo::testing_backend;

namespace {

// Runs one collective and waits for it, bounded.
Status runOne(const std::function<void(Backend::Done)>& post, std::chrono::milliseconds bound) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  post([p](Status s) { p->set_value(std::move(s)); });
  if (f.wait_for(bound) != std::future_status::ready) {
    // The backend still holds our buffers: leave at once rather than unwind.
    std::printf("RESULT HANG: no completion within %lld ms\n",
                static_cast<long long>(bound.count()));
    std::fflush(stdout);
    std::_Exit(4);
  }
  return f.get();
}

int check(Backend& b, int rank, int size, std::chrono::milliseconds bound) {
  struct Shape {
    size_t count;
    DataType dtype;
    ReduceOp op;
  };
  const Shape shapes[] = {{(size_t{1} << 20) + 3, DataType::kFloat32, ReduceOp::kSum},
                          {1000, DataType::kInt8, ReduceOp::kProduct},
                          {7, DataType::kBFloat16, ReduceOp::kMax},
                          {300001, DataType::kInt64, ReduceOp::kMin},
                          {2, DataType::kFloat16, ReduceOp::kAverage}};
  for (const auto& s : shapes) {
    Bytes buf = makeInput(s.dtype, s.op, rank, s.count);
    Status st = runOne(
        [&](Backend::Done d) { b.allreduce(buf.data(), s.count, s.dtype, s.op, std::move(d)); },
        bound);
    if (!st.isOk()) {
      std::printf("FAIL allreduce %zu %s: %s\n", s.count,
                  std::string(dataTypeName(s.dtype)).c_str(), st.toString().c_str());
      return 1;
    }
    Bytes want = makeReference(s.dtype, s.op, size, s.count);
    auto same = sameBytes(buf.data(), want.data(), want.size());
    if (!same) {
      std::printf("FAIL allreduce %zu %s: %s\n", s.count,
                  std::string(dataTypeName(s.dtype)).c_str(), same.message());
      return 1;
    }
  }
  Status st = runOne([&](Backend::Done d) { b.barrier(std::move(d)); }, bound);
  if (!st.isOk()) {
    std::printf("FAIL barrier: %s\n", st.toString().c_str());
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

int loop(Backend& b, int rank, std::chrono::milliseconds bound) {
  const size_t count = size_t{1} << 20;
  Bytes buf = makeInput(DataType::kFloat32, ReduceOp::kSum, rank, count);
  for (int iter = 1; iter <= 1000000; ++iter) {
    Status st = runOne(
        [&](Backend::Done d) {
          b.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum, std::move(d));
        },
        bound);
    if (!st.isOk()) {
      std::printf("RESULT %s\n", st.toString().c_str());
      std::fflush(stdout);
      return st.code() == Code::kPeerFailure ? 2 : 3;
    }
    // Keep the values small: restart from the input every time.
    buf = makeInput(DataType::kFloat32, ReduceOp::kSum, rank, count);
    std::printf("iter %d\n", iter);
    std::fflush(stdout);
  }
  return 0;
}

long envLong(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? std::atol(v) : dflt;
}

int bench(Backend& b, int rank, int size, std::chrono::milliseconds bound) {
  const size_t bytes = static_cast<size_t>(envLong("KOLO_PEER_BENCH_BYTES", 64L << 20));
  const int iters = static_cast<int>(envLong("KOLO_PEER_BENCH_ITERS", 10));
  const size_t count = std::max<size_t>(1, bytes / 4);
  std::vector<float> buf(count, 0.0f);  // zeros: repeated sums stay exact
  std::vector<double> us;
  for (int i = -2; i < iters; ++i) {
    Status st = runOne([&](Backend::Done d) { b.barrier(std::move(d)); }, bound);
    const auto t0 = std::chrono::steady_clock::now();
    if (st.isOk()) {
      st = runOne(
          [&](Backend::Done d) {
            b.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum, std::move(d));
          },
          bound);
    }
    if (!st.isOk()) {
      std::printf("FAIL bench: %s\n", st.toString().c_str());
      return 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  const double busbw = static_cast<double>(count * 4) / (med * 1e3) * 2.0 * (size - 1) / size;
  if (rank == 0) std::printf("median_us %.1f min_us %.1f busbw_GBps %.3f\n", med, us[0], busbw);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s BACKEND DIR RANK SIZE check|loop|bench TIMEOUT_MS\n", argv[0]);
    return 64;
  }
  const std::string backend = argv[1];
  FileKvStore kv(argv[2]);
  BackendOptions o;
  o.rank = std::atoi(argv[3]);
  o.size = std::atoi(argv[4]);
  const std::string scenario = argv[5];
  o.timeout = std::chrono::milliseconds(std::atol(argv[6]));
  o.key_prefix = "test/" + backend;
  o.name = "peer" + std::to_string(o.rank);
  o.chunk_bytes =
      static_cast<size_t>(envLong("KOLO_BACKEND_CHUNK_BYTES", static_cast<long>(o.chunk_bytes)));
  o.pipeline_depth = static_cast<int>(envLong("KOLO_BACKEND_PIPELINE_DEPTH", o.pipeline_depth));
  o.reduce_thread = envLong("KOLO_BACKEND_REDUCE_THREAD", o.reduce_thread ? 1 : 0) != 0;
  auto created = createBackend(backend, o, kv);
  if (!created.isOk()) {
    std::printf("FAIL create: %s\n", created.status().toString().c_str());
    return 1;
  }
  std::unique_ptr<Backend> b = std::move(created).value();
  const auto bound = o.timeout + std::chrono::seconds(5);
  int rc = scenario == "check"   ? check(*b, o.rank, o.size, bound)
           : scenario == "bench" ? bench(*b, o.rank, o.size, bound)
                                 : loop(*b, o.rank, bound);
  std::fflush(stdout);
  b.reset();
  return rc;
}
