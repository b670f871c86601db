// One NCCL rank per process for tests/gpu/nccl_process_test.cc: the NCCL
// backend on device buffers, meeting its peers through a FileKvStore
// directory, as agents on one GPU would (several processes on one GPU need
// their own NCCL_HOSTID each; the test sets it).
//
//   kolo_gpu_nccl_rank DIR RANK SIZE check|loop TIMEOUT_MS
//
//   check  allreduce of every dtype and op, broadcast from every root,
//          allgatherv, reducescatter and alltoallv with uneven blocks and a
//          barrier, each compared bit for bit with the conformance suite's
//          references; prints "OK" and exits 0, else "FAIL ..." and exits 1.
//   loop   allreduce of 1 Mi float32 over and over, printing "iter N"; on
//          the first failure prints "RESULT <status>" and exits 2 (or 4 when
//          no completion came within TIMEOUT_MS + 5 s).
// On the device: GPU RANK % device count. With KOLO_DEVICE=host-emulated
// the device seam and NCCL are the host emulation (docs/gpu.md, "The NCCL
// emulation"), so the same rank runs on CPU machines.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "agent/backends/kv_store.h"
#include "agent/backends/nccl/factory.h"
#include "agent/gpu/device_api.h"
#include "tests/backend/test_util.h"

using namespace kolo;
using namespace kolo::testing_backend;

namespace {

std::chrono::milliseconds g_bound;

Status runOne(const std::function<void(Backend::Done)>& post) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  post([p](Status s) { p->set_value(std::move(s)); });
  if (f.wait_for(g_bound) != std::future_status::ready) {
    std::printf("RESULT HANG: no completion within %lld ms\n",
                static_cast<long long>(g_bound.count()));
    std::fflush(stdout);
    std::_Exit(4);
  }
  return f.get();
}

gpu::DeviceApi* g_dev = nullptr;

// Device memory on the seam (freed at exit with the process).
class DevBuf {
 public:
  explicit DevBuf(void* p) : p_(p) {}
  DevBuf(DevBuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ~DevBuf() {
    if (p_ != nullptr) g_dev->freeDevice(p_);
  }
  void* data() const { return p_; }

 private:
  void* p_;
};

// Synchronous copy on the legacy stream, bounded.
Status copySync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return okStatus();
  RETURN_IF_ERROR(g_dev->copyAsync(dst, src, bytes, nullptr));
  return g_dev->streamSynchronize(nullptr, 60000);
}

// Device buffers holding `host` (at least `capacity` bytes, never 0).
StatusOr<DevBuf> toDevice(const Bytes& host, size_t capacity = 0) {
  ASSIGN_OR_RETURN(void* p, g_dev->allocDevice(std::max<size_t>({host.size(), capacity, 1})));
  DevBuf b(p);
  RETURN_IF_ERROR(copySync(b.data(), host.data(), host.size()));
  return b;
}

Bytes toHost(const void* dev, size_t bytes) {
  Bytes h(bytes);
  Status s = copySync(h.data(), dev, bytes);
  if (!s.isOk()) std::printf("FAIL copy from the device: %s\n", s.toString().c_str());
  return h;
}

#define CHECK_OK(what, expr)                                                          \
  do {                                                                                \
    Status s_ = (expr);                                                               \
    if (!s_.isOk()) {                                                                 \
      std::printf("FAIL %s: %s\n", std::string(what).c_str(), s_.toString().c_str()); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)
#define CHECK_SAME(what, got, want)                                             \
  do {                                                                          \
    auto same_ = sameBytes((got).data(), (want).data(), (want).size());         \
    if (!same_) {                                                               \
      std::printf("FAIL %s: %s\n", std::string(what).c_str(), same_.message()); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

int checkAllreduce(Backend& b, int rank, int size) {
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    for (ReduceOp op :
         {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (size_t count : {size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
        const std::string what = "allreduce " + std::string(dataTypeName(t)) + " " +
                                 std::string(reduceOpName(op)) + " " + std::to_string(count);
        auto buf = toDevice(makeInput(t, op, rank, count));
        CHECK_OK(what, buf.status());
        CHECK_OK(what, runOne([&](Backend::Done d) {
                   b.allreduce(buf->data(), count, t, op, std::move(d));
                 }));
        const Bytes want = makeReference(t, op, size, count);
        CHECK_SAME(what, toHost(buf->data(), want.size()), want);
      }
    }
  }
  return 0;
}

int checkMoves(Backend& b, int rank, int size) {
  for (int root = 0; root < size; ++root) {
    const size_t bytes = 1000003;
    auto buf = toDevice(patternBytes(rank, bytes));
    CHECK_OK("broadcast", buf.status());
    CHECK_OK("broadcast",
             runOne([&](Backend::Done d) { b.broadcast(buf->data(), bytes, root, std::move(d)); }));
    CHECK_SAME("broadcast from " + std::to_string(root), toHost(buf->data(), bytes),
               patternBytes(root, bytes));
  }
  std::vector<size_t> rb(size);
  for (int i = 0; i < size; ++i) rb[i] = static_cast<size_t>((i * 5 + 2) % 7) * 1000 + 1;
  const size_t total = std::accumulate(rb.begin(), rb.end(), size_t{0});
  auto in = toDevice(patternBytes(rank, rb[rank]));
  auto out = toDevice({}, total);
  CHECK_OK("allgatherv", in.status());
  CHECK_OK("allgatherv", out.status());
  CHECK_OK("allgatherv", runOne([&](Backend::Done d) {
             b.allgatherv(in->data(), rb[rank], out->data(), rb, std::move(d));
           }));
  Bytes want;
  for (int i = 0; i < size; ++i) {
    Bytes p = patternBytes(i, rb[i]);
    want.insert(want.end(), p.begin(), p.end());
  }
  CHECK_SAME("allgatherv", toHost(out->data(), total), want);
  CHECK_OK("barrier", runOne([&](Backend::Done d) { b.barrier(std::move(d)); }));
  return 0;
}

int checkReducescatterAlltoall(Backend& b, int rank, int size) {
  const DataType t = DataType::kBFloat16;
  const ReduceOp op = ReduceOp::kSum;
  std::vector<size_t> rc(size);
  for (int i = 0; i < size; ++i) rc[i] = static_cast<size_t>((i * 5 + 2) % 7) * 100 + 3;
  const size_t total = std::accumulate(rc.begin(), rc.end(), size_t{0});
  size_t off = 0;
  for (int i = 0; i < rank; ++i) off += rc[i];
  auto in = toDevice(makeInput(t, op, rank, total));
  auto out = toDevice({}, rc[rank] * dataTypeSize(t));
  CHECK_OK("reducescatter", in.status());
  CHECK_OK("reducescatter", out.status());
  CHECK_OK("reducescatter", runOne([&](Backend::Done d) {
             b.reducescatter(in->data(), out->data(), rc, t, op, std::move(d));
           }));
  const Bytes want_rs = makeReference(t, op, size, rc[rank], off);
  CHECK_SAME("reducescatter", toHost(out->data(), want_rs.size()), want_rs);

  auto sz = [](int from, int to) { return static_cast<size_t>((from * 3 + to * 7) % 5) * 333; };
  std::vector<size_t> sb(size), rbytes(size);
  Bytes send, want;
  for (int p = 0; p < size; ++p) {
    sb[p] = sz(rank, p);
    rbytes[p] = sz(p, rank);
    Bytes blk = patternBytes(rank, sb[p], static_cast<uint64_t>(p) + 1);
    send.insert(send.end(), blk.begin(), blk.end());
    Bytes exp = patternBytes(p, rbytes[p], static_cast<uint64_t>(rank) + 1);
    want.insert(want.end(), exp.begin(), exp.end());
  }
  auto ain = toDevice(send);
  auto aout = toDevice({}, want.size());
  CHECK_OK("alltoallv", ain.status());
  CHECK_OK("alltoallv", aout.status());
  CHECK_OK("alltoallv", runOne([&](Backend::Done d) {
             b.alltoallv(ain->data(), sb, aout->data(), rbytes, std::move(d));
           }));
  CHECK_SAME("alltoallv", toHost(aout->data(), want.size()), want);
  return 0;
}

int loop(Backend& b, int rank) {
  const size_t count = size_t{1} << 20;
  const Bytes input = makeInput(DataType::kFloat32, ReduceOp::kSum, rank, count);
  auto buf = toDevice(input);
  CHECK_OK("loop", buf.status());
  for (int iter = 1; iter <= 1000000; ++iter) {
    Status st = runOne([&](Backend::Done d) {
      b.allreduce(buf->data(), count, DataType::kFloat32, ReduceOp::kSum, std::move(d));
    });
    if (!st.isOk()) {
      std::printf("RESULT %s\n", st.toString().c_str());
      std::fflush(stdout);
      return 2;
    }
    if (!copySync(buf->data(), input.data(), input.size()).isOk()) return 3;
    std::printf("iter %d\n", iter);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DIR RANK SIZE check|loop TIMEOUT_MS\n", argv[0]);
    return 64;
  }
  FileKvStore kv(argv[1]);
  BackendOptions o;
  o.rank = std::atoi(argv[2]);
  o.size = std::atoi(argv[3]);
  const std::string scenario = argv[4];
  o.timeout = std::chrono::milliseconds(std::atol(argv[5]));
  o.key_prefix = "test/nccl-procs";
  o.name = "nccl-rank" + std::to_string(o.rank);
  g_bound = o.timeout + std::chrono::seconds(5);
  const char* kind = std::getenv("KOLO_DEVICE");
  if (kind != nullptr && std::string(kind) == "host-emulated") {
    Status sel = gpu::selectDeviceApi(gpu::DeviceKind::kHostEmulated);
    if (!sel.isOk()) {
      std::printf("FAIL select: %s\n", sel.toString().c_str());
      return 1;
    }
  }
  g_dev = gpu::deviceApi();
  if (g_dev == nullptr) {
    std::printf("FAIL no device implementation in this build\n");
    return 1;
  }
  auto n = g_dev->deviceCount();
  if (!n.isOk() || *n == 0) {
    std::printf("FAIL no GPU: %s\n", n.isOk() ? "0 devices" : n.status().toString().c_str());
    return 1;
  }
  auto created = createNcclBackend(o, kv, o.rank % *n);
  if (!created.isOk()) {
    std::printf("FAIL create: %s\n", created.status().toString().c_str());
    return 1;
  }
  std::unique_ptr<Backend> b = std::move(created).value();
  int rc = 0;
  if (scenario == "check") {
    rc = checkAllreduce(*b, o.rank, o.size);
    if (rc == 0) rc = checkMoves(*b, o.rank, o.size);
    if (rc == 0) rc = checkReducescatterAlltoall(*b, o.rank, o.size);
    if (rc == 0) std::printf("OK\n");
  } else {
    rc = loop(*b, o.rank);
  }
  std::fflush(stdout);
  b.reset();
  return rc;
}
