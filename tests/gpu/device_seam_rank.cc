// A rank of the device protocol tests (device_seam_test.cc) written against
// the device seam (agent/gpu/device_api.h) only, so the same program runs on
// the host emulation (KOLO_DEVICE=host-emulated, CPU machines, sanitizers)
// and on CUDA (a GPU machine). Links libkolo's internals and talks to a real
// kolo-agent. Usage: kolo_gpu_seam_rank every|inflight|full|die|fault|colls|mixed|cross|xcolls|
// refused|fused|many|fusedie|zerocopy
// Prints "<MODE> OK" and exits 0 on success; "SKIP: <why>" when no device
// arena was granted; "FAULT: <status>" for the fault mode.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agent/gpu/device_api.h"
#include "client.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/ipc_layout.h"
#include "common/reduce.h"
#include "device_client.h"

namespace {

using kolo::AllreduceArgs;
using kolo::Client;
using kolo::DataType;
using kolo::ReduceOp;
using std::chrono::milliseconds;

int rank_ = -1;

#define FAIL(...)                         \
  do {                                    \
    std::printf("rank %d FAIL: ", rank_); \
    std::printf(__VA_ARGS__);             \
    std::printf("\n");                    \
    std::fflush(stdout);                  \
    std::_Exit(1);                        \
  } while (0)

kolo::gpu::DeviceApi& api() { return *kolo::gpu::deviceApi(); }

// Small integers, exact in every dtype.
void fromDoubles(DataType dt, const double* v, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DataType::kFloat16: {
        uint16_t h = kolo::floatToHalf(static_cast<float>(v[i]));
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t h = kolo::floatToBf16(static_cast<float>(v[i]));
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DataType::kFloat32:
        reinterpret_cast<float*>(out)[i] = static_cast<float>(v[i]);
        break;
      case DataType::kFloat64:
        reinterpret_cast<double*>(out)[i] = v[i];
        break;
      case DataType::kInt8:
        reinterpret_cast<int8_t*>(out)[i] = static_cast<int8_t>(v[i]);
        break;
      case DataType::kUint8:
        reinterpret_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(v[i]);
        break;
      case DataType::kInt32:
        reinterpret_cast<int32_t*>(out)[i] = static_cast<int32_t>(v[i]);
        break;
      case DataType::kInt64:
        reinterpret_cast<int64_t*>(out)[i] = static_cast<int64_t>(v[i]);
        break;
    }
  }
}

// A device buffer with host mirrors, copied through the seam.
struct DevBuf {
  void* d = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    auto p = api().allocDevice(n);
    if (!p.isOk()) FAIL("allocDevice: %s", p.status().toString().c_str());
    d = *p;
  }
  ~DevBuf() { api().freeDevice(d); }
  void upload(const void* h, void* s) {
    auto st = api().copyAsync(d, h, bytes, s);
    if (!st.isOk()) FAIL("upload: %s", st.toString().c_str());
  }
  void download(void* h, void* s) {
    auto st = api().copyAsync(h, d, bytes, s);
    if (st.isOk()) st = api().streamSynchronize(s, 30'000);
    if (!st.isOk()) FAIL("download: %s", st.toString().c_str());
  }
};

// Rank r's input: small integers, so every dtype holds them exactly and any
// order of summation agrees (bit-exact across agents too); products in -2..2.
void fillInput(DataType dt, ReduceOp op, int r, size_t n, std::vector<char>* out) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>((i * 7 + static_cast<size_t>(r) * 13) % 101);
    v[i] = op == ReduceOp::kProduct ? (k % 5) - 2 : k - 50;
    if (dt == DataType::kUint8 && op != ReduceOp::kProduct) v[i] = k % 60;
    if (dt == DataType::kUint8 && op == ReduceOp::kProduct) v[i] = k % 3;
  }
  out->resize(n * kolo::dataTypeSize(dt));
  fromDoubles(dt, v.data(), n, out->data());
}

std::vector<char> reference(DataType dt, ReduceOp op, int world, size_t n) {
  std::vector<std::vector<char>> ins(world);
  std::vector<const void*> srcs;
  for (int r = 0; r < world; ++r) {
    fillInput(dt, op, r, n, &ins[r]);
    srcs.push_back(ins[r].data());
  }
  std::vector<char> out(n * kolo::dataTypeSize(dt));
  void* dst = out.data();
  const bool avg = op == ReduceOp::kAverage;
  kolo::reduceBlocks(dt, avg ? ReduceOp::kSum : op, srcs.data(), world, &dst, 1, n, 1.0,
                     avg ? 1.0 / world : 1.0);
  return out;
}

void* newStream(std::vector<std::unique_ptr<kolo::gpu::DevStream>>* keep) {
  auto s = api().createStream();
  if (!s.isOk()) FAIL("createStream: %s", s.status().toString().c_str());
  keep->push_back(std::move(*s));
  return keep->back()->get();
}

// Every dtype and op, in and out of place, then a broadcast per dtype from
// the last rank; bit for bit against common/reduce over every rank's input.
int every(Client& c) {
  const auto w = c.world();
  std::vector<std::unique_ptr<kolo::gpu::DevStream>> keep;
  void* s = newStream(&keep);
  const size_t n = 1037;  // not a multiple of any vector width
  int seq = 0;
  for (int t = 0; t < kolo::kNumDataTypes; ++t) {
    const auto dt = static_cast<DataType>(t);
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      std::vector<char> in, got;
      fillInput(dt, op, w.rank, n, &in);
      got.resize(in.size());
      DevBuf din(in.size()), dout(in.size());
      din.upload(in.data(), s);
      const bool in_place = seq % 2 == 0;
      int64_t shape[1] = {static_cast<int64_t>(n)};
      const std::string name = "seam." + std::to_string(seq++);
      AllreduceArgs a;
      a.name = name.c_str();
      a.input = din.d;
      a.output = in_place ? din.d : dout.d;
      a.ndim = 1;
      a.shape = shape;
      a.dtype = t;
      a.op = static_cast<int>(op);
      a.stream = s;
      auto h = c.allreduceAsync(a);
      if (!h.isOk()) FAIL("%s: %s", name.c_str(), h.status().toString().c_str());
      auto st = c.wait(*h, milliseconds(60'000));
      if (!st.isOk()) FAIL("%s: %s", name.c_str(), st.toString().c_str());
      (in_place ? din : dout).download(got.data(), s);
      if (got != reference(dt, op, w.size, n)) {
        FAIL("%s (%s, op %d): not bit-exact", name.c_str(),
             std::string(kolo::dataTypeName(dt)).c_str(), static_cast<int>(op));
      }
    }
    std::vector<char> in, got;
    fillInput(dt, ReduceOp::kSum, w.rank, n, &in);
    got.resize(in.size());
    DevBuf b(in.size());
    b.upload(in.data(), nullptr);
    int64_t shape[1] = {static_cast<int64_t>(n)};
    const std::string name = "seam.bcast." + std::to_string(t);
    auto h = c.broadcastAsync(name.c_str(), b.d, 1, shape, t, w.size - 1);
    if (!h.isOk()) FAIL("%s: %s", name.c_str(), h.status().toString().c_str());
    auto st = c.wait(*h, milliseconds(60'000));
    if (!st.isOk()) FAIL("%s: %s", name.c_str(), st.toString().c_str());
    b.download(got.data(), nullptr);
    std::vector<char> want;
    fillInput(dt, ReduceOp::kSum, w.size - 1, n, &want);
    if (got != want) FAIL("%s: not the root's bytes", name.c_str());
  }
  std::printf("rank %d device: %s, %d ops\n", rank_, api().name(), seq);
  std::printf("EVERY OK\n");
  return 0;
}

// More device ops in flight than event pairs (64): submitted before any
// wait, each checked.
int inflight(Client& c) {
  const auto w = c.world();
  std::vector<std::unique_ptr<kolo::gpu::DevStream>> keep;
  void* s = newStream(&keep);
  constexpr int kOps = 100;
  const size_t n = 256;
  std::vector<std::unique_ptr<DevBuf>> bufs;
  std::vector<uint64_t> handles;
  std::vector<std::string> names;
  int64_t shape[1] = {static_cast<int64_t>(n)};
  for (int i = 0; i < kOps; ++i) {
    std::vector<int32_t> in(n);
    for (size_t j = 0; j < n; ++j) in[j] = static_cast<int32_t>(j) + i * 1000 + w.rank;
    bufs.push_back(std::make_unique<DevBuf>(n * 4));
    bufs.back()->upload(in.data(), s);
    names.push_back("inflight." + std::to_string(i));
    AllreduceArgs a;
    a.name = names.back().c_str();
    a.input = a.output = bufs.back()->d;
    a.ndim = 1;
    a.shape = shape;
    a.dtype = static_cast<int>(DataType::kInt32);
    a.op = static_cast<int>(ReduceOp::kSum);
    a.stream = s;
    auto h = c.allreduceAsync(a);
    if (!h.isOk()) FAIL("%s: %s", a.name, h.status().toString().c_str());
    handles.push_back(*h);
  }
  const int32_t rank_sum = w.size * (w.size - 1) / 2;
  for (int i = 0; i < kOps; ++i) {
    auto st = c.wait(handles[i], milliseconds(60'000));
    if (!st.isOk()) FAIL("%s: %s", names[i].c_str(), st.toString().c_str());
    std::vector<int32_t> got(n);
    bufs[i]->download(got.data(), s);
    for (size_t j = 0; j < n; ++j) {
      const int32_t want = (static_cast<int32_t>(j) + i * 1000) * w.size + rank_sum;
      if (got[j] != want) FAIL("%s: element %zu is %d, not %d", names[i].c_str(), j, got[j], want);
    }
  }
  std::printf("INFLIGHT OK\n");
  return 0;
}

AllreduceArgs floatArgs(const char* name, void* d, int64_t* shape) {
  AllreduceArgs a;
  a.name = name;
  a.input = a.output = d;
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kFloat32);
  a.op = static_cast<int>(ReduceOp::kSum);
  return a;
}

// A tensor larger than the whole device arena (KOLO_DEVICE_ARENA_MB=2) is
// refused with the reason; the next op works.
int full(Client& c) {
  int64_t big[1] = {1 << 20};  // 4 MiB of float32
  DevBuf b(4u << 20);
  auto h = c.allreduceAsync(floatArgs("full.big", b.d, big));
  if (h.isOk()) FAIL("a tensor larger than the device arena was accepted");
  std::printf("rank %d refusal: %s\n", rank_, h.status().toString().c_str());
  int64_t small[1] = {1024};
  h = c.allreduceAsync(floatArgs("full.small", b.d, small));
  if (!h.isOk() || !c.wait(*h, milliseconds(30'000)).isOk())
    FAIL("the op after the refusal failed");
  if (!api().streamSynchronize(nullptr, 30'000).isOk()) FAIL("sync");
  std::printf("FULL OK\n");
  return 0;
}

// The last rank dies after submitting; the others get an error, not a hang.
int die(Client& c) {
  const auto w = c.world();
  int64_t shape[1] = {4096};
  DevBuf b(4096 * 4);
  if (w.rank == w.size - 1) {
    auto h = c.allreduceAsync(floatArgs("die.0", b.d, shape));
    (void)h;
    std::fflush(stdout);
    std::_Exit(7);
  }
  // Not submitted here yet: the dead rank's submission is pending, ours completes the name.
  ::usleep(200'000);
  auto h = c.allreduceAsync(floatArgs("die.0", b.d, shape));
  const auto t0 = std::chrono::steady_clock::now();
  kolo::Status st = h.isOk() ? c.wait(*h, milliseconds(60'000)) : h.status();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (st.isOk()) FAIL("the op succeeded although a rank died");
  if (st.code() == kolo::Code::kTimedOut) FAIL("hang: %s", st.toString().c_str());
  std::printf("rank %d error after %.1f s: %s\n", rank_, secs, st.toString().c_str());
  std::printf("DIE OK\n");
  return 0;
}

// One allreduce under the injected faults (KOLO_DEVICE_EMU_FAULTS in this
// rank or the agent): prints the first error seen, submission, completion
// or the stream's (bounded: 3 s).
int fault(Client& c) {
  int64_t shape[1] = {1024};
  DevBuf b(4096);
  std::vector<std::unique_ptr<kolo::gpu::DevStream>> keep;
  void* s = newStream(&keep);
  AllreduceArgs a = floatArgs("fault.0", b.d, shape);
  a.stream = s;
  auto h = c.allreduceAsync(a);
  kolo::Status st = h.isOk() ? c.wait(*h, milliseconds(30'000)) : h.status();
  if (st.isOk()) st = api().streamSynchronize(s, 3'000);
  std::printf("rank %d FAULT: %s\n", rank_, st.toString().c_str());
  std::printf("FAULT DONE\n");
  return 0;
}

#include "tests/gpu/device_seam_colls.inc"
#include "tests/gpu/device_seam_fusion.inc"
#include "tests/gpu/device_seam_nccl.inc"
#include "tests/gpu/device_seam_zerocopy.inc"

// Several GPUs per node, across agents: one device allreduce, refused with
// the text on every rank; a host allreduce after it works.
int refused(Client& c) {
  int64_t shape[1] = {256};
  DevBuf d(256 * 4);
  auto h = c.allreduceAsync(floatArgs("refused.0", d.d, shape));
  kolo::Status st = h.isOk() ? c.wait(*h, milliseconds(30'000)) : h.status();
  std::printf("rank %d REFUSED: %s\n", rank_, st.toString().c_str());
  if (st.isOk()) FAIL("the device allreduce was not refused");
  std::vector<float> host(256, 1.0f);
  h = c.allreduceAsync(floatArgs("refused.host", host.data(), shape));
  st = h.isOk() ? c.wait(*h, milliseconds(30'000)) : h.status();
  if (!st.isOk()) FAIL("the host allreduce after the refusal: %s", st.toString().c_str());
  if (host[0] != static_cast<float>(c.world().size)) FAIL("host allreduce: %f", host[0]);
  std::printf("REFUSED DONE\n");
  return 0;
}

// The GPU this trainer uses, made current before kolo_init as a CUDA
// trainer does (kolo.torch: the current device, else local_rank %
// device_count): KOLO_TEST_GPU_OF_RANK="g0,g1,..." (by local rank) when
// set, else local_rank % device_count.
void pickGpu() {
  auto n = api().deviceCount();
  if (!n.isOk() || *n <= 1) return;
  const char* lr = std::getenv("KOLO_LOCAL_RANK");
  const int local = lr != nullptr ? std::atoi(lr) : 0;
  int gpu = local % *n;
  if (const char* map = std::getenv("KOLO_TEST_GPU_OF_RANK"); map != nullptr && *map != '\0') {
    std::vector<int> gpus;
    for (const char* p = map; *p != '\0';) {
      gpus.push_back(std::atoi(p));
      while (*p != '\0' && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    if (local < static_cast<int>(gpus.size())) gpu = gpus[local];
  }
  auto st = api().setDevice(gpu);
  if (!st.isOk()) FAIL("setDevice(%d): %s", gpu, st.toString().c_str());
  std::printf("local rank %d on GPU %d of %d\n", local, gpu, *n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(
        stderr,
        "usage: %s every|inflight|full|die|fault|colls|mixed|cross|xcolls|refused|fused|many|"
        "fusedie|zerocopy|loop|elastic|bench|scaled\n",
        argv[0]);
    return 2;
  }
  if (const char* dev = std::getenv("KOLO_DEVICE"); dev != nullptr && *dev != '\0') {
    auto kind = kolo::gpu::parseDeviceKind(dev);
    if (kind.isOk() && kolo::gpu::selectDeviceApi(*kind).isOk() &&
        kolo::gpu::deviceApi() != nullptr)
      pickGpu();
  }
  auto opts = kolo::ClientOptions::fromEnvironment();
  if (!opts.isOk()) FAIL("options: %s", opts.status().toString().c_str());
  auto client = Client::connect(*opts);
  if (!client.isOk()) FAIL("connect: %s", client.status().toString().c_str());
  Client& c = **client;
  rank_ = c.world().rank;
  if (!c.deviceReady()) {
    std::printf("SKIP: no device arena: %s\n", c.deviceWhy().c_str());
    c.shutdown();
    return 0;
  }
  const std::string mode = argv[1];
  int rc = 2;
  if (mode == "every")
    rc = every(c);
  else if (mode == "inflight")
    rc = inflight(c);
  else if (mode == "full")
    rc = full(c);
  else if (mode == "die")
    rc = die(c);
  else if (mode == "fault")
    rc = fault(c);
  else if (mode == "colls")
    rc = colls(c);
  else if (mode == "mixed")
    rc = mixed(c);
  else if (mode == "cross")
    rc = cross(c);
  else if (mode == "refused")
    rc = refused(c);
  else if (mode == "fused")
    rc = fused(c);
  else if (mode == "many")
    rc = many(c);
  else if (mode == "fusedie")
    rc = fusedie(c);
  else if (mode == "zerocopy")
    rc = zerocopy(c);
  else if (mode == "loop")
    rc = loop(c);
  else if (mode == "elastic")
    rc = elastic(c);
  else if (mode == "bench")
    rc = bench(c);
  else if (mode == "xcolls")
    rc = xcolls(c);
  else if (mode == "scaled")
    rc = scaled(c);
  std::fflush(stdout);
  c.shutdown();
  return rc;
}
