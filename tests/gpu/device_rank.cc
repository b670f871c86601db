// A rank of the device path tests (device_path_test.cc): links the client
// library's internals (kolo_client_static) and talks to a real kolo-agent.
// Usage: kolo_gpu_device_rank refuse|stream|allreduce|ordering|die|bench
// Prints "<MODE> OK" and exits 0 on success; "SKIP: <why>" and exits 0 when
// the mode cannot run here (no GPU, or a GPU where a refusal was expected).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client.h"
#include "common/dtype.h"
#include "kolo/kolo_c.h"

#ifdef KOLO_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tests/gpu/device_rank_kernels.h"
#endif

namespace {

using kolo::AllreduceArgs;
using kolo::Client;
using kolo::CollectiveType;
using kolo::DataType;
using kolo::ReduceOp;
using std::chrono::milliseconds;

int rank_ = -1;

#define FAIL(...)                                 \
  do {                                            \
    std::printf("rank %d FAIL: ", rank_);         \
    std::printf(__VA_ARGS__);                     \
    std::printf("\n");                            \
    std::fflush(stdout);                          \
    std::exit(1);                                 \
  } while (0)

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// Host path still bit-exact; explicit device flag and a raw device
// descriptor both refused with the clear text, quickly.
int refuse(Client& c) {
  if (c.deviceReady()) {
    std::printf("SKIP: a device arena was granted (this machine has a GPU)\n");
    return 0;
  }
  std::printf("rank %d device-why: %s\n", rank_, c.deviceWhy().c_str());
  const auto w = c.world();
  std::vector<int32_t> in(1000), out(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int32_t>(i) * (w.rank + 1);
  int64_t shape[1] = {1000};
  AllreduceArgs a;
  a.name = "host.ok";
  a.input = in.data();
  a.output = out.data();
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kInt32);
  a.op = static_cast<int>(ReduceOp::kSum);
  auto h = c.allreduceAsync(a);
  if (!h.isOk()) FAIL("host allreduce: %s", h.status().toString().c_str());
  auto st = c.wait(*h, milliseconds(30'000));
  if (!st.isOk()) FAIL("host allreduce: %s", st.toString().c_str());
  const int32_t ranks_sum = w.size * (w.size + 1) / 2;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != static_cast<int32_t>(i) * ranks_sum) FAIL("host allreduce: out[%zu] = %d", i, out[i]);
  }
  // A "device" tensor (explicit flag on host memory): libkolo refuses it.
  a.name = "device.flag";
  a.device = 1;
  auto t0 = std::chrono::steady_clock::now();
  auto d = c.allreduceAsync(a);
  if (d.isOk()) FAIL("an explicit device tensor was accepted without a device arena");
  const std::string m = d.status().message();
  if (d.status().code() != kolo::Code::kUnavailable ||
      !contains(m, "allreduce of device tensor 'device.flag': this rank has no device arena (") ||
      !contains(m, "hand kolo host tensors instead")) {
    FAIL("unexpected refusal: %s", d.status().toString().c_str());
  }
  std::printf("rank %d client refusal: %s\n", rank_, m.c_str());
  // The agent's own check: a descriptor flagged "device" from a rank without
  // a device arena is refused (not run on host offsets, not left hanging).
  auto r = c.submitDeviceDescForTest("device.raw", 4096);
  if (!r.isOk()) FAIL("raw submit: %s", r.status().toString().c_str());
  st = c.wait(*r, milliseconds(10'000));
  if (st.isOk() || st.code() == kolo::Code::kTimedOut) FAIL("raw device descriptor: %s", st.toString().c_str());
  if (st.code() != kolo::Code::kUnavailable ||
      !contains(st.message(), "allreduce of device tensor 'device.raw': this rank has no device arena on the kolo "
                              "agent (")) {
    FAIL("unexpected agent refusal: %s", st.toString().c_str());
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (secs > 5.0) FAIL("the refusals took %.1f s", secs);
  std::printf("rank %d agent refusal: %s\n", rank_, st.message().c_str());
  // The connection is still good afterwards.
  a.name = "host.after";
  a.device = -1;
  h = c.allreduceAsync(a);
  if (!h.isOk() || !c.wait(*h, milliseconds(30'000)).isOk()) FAIL("host allreduce after the refusals");
  std::printf("REFUSE OK\n");
  return 0;
}

// The C ABI's thread stream (kolo_set_stream, ABI 2) on a host tensor: it
// is ignored, the host allreduce stays bit-exact (the "stream" is a bogus
// pointer that must never reach CUDA). The device half is streamDevice().
#ifdef KOLO_TEST_HAVE_CUDA
int streamDevice(Client& c);
#endif
int stream(Client& c) {
  const auto w = c.world();
  int bogus = 0;
  kolo_stream_t ks = KOLO_STREAM_INIT;
  ks.device = 0;
  ks.stream = &bogus;
  if (kolo_set_stream(&ks) != KOLO_OK) FAIL("kolo_set_stream: %s", kolo_last_error());
  std::vector<int64_t> in(777), out(777);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i) * 3 + w.rank;
  int64_t shape[1] = {777};
  AllreduceArgs a;
  a.name = "stream.host";
  a.input = in.data();
  a.output = out.data();
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kInt64);
  a.op = static_cast<int>(ReduceOp::kSum);
  auto h = c.allreduceAsync(a);
  if (!h.isOk()) FAIL("host allreduce with a thread stream: %s", h.status().toString().c_str());
  auto st = c.wait(*h, milliseconds(30'000));
  if (!st.isOk()) FAIL("host allreduce with a thread stream: %s", st.toString().c_str());
  const int64_t rank_sum = static_cast<int64_t>(w.size) * (w.size - 1) / 2;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != static_cast<int64_t>(i) * 3 * w.size + rank_sum) FAIL("host allreduce: out[%zu] = %ld", i, static_cast<long>(out[i]));
  }
  (void)kolo_set_stream(nullptr);
  if (!c.deviceReady()) {
    std::printf("rank %d no device arena: %s\n", rank_, c.deviceWhy().c_str());
    std::printf("STREAM OK\n");
    return 0;
  }
#ifdef KOLO_TEST_HAVE_CUDA
  return streamDevice(c);
#else
  FAIL("a device arena was granted to a libkolo built without CUDA");
#endif
}

#ifdef KOLO_TEST_HAVE_CUDA

#define CUDA_OK(call)                                                             \
  do {                                                                            \
    cudaError_t _e = (call);                                                      \
    if (_e != cudaSuccess) FAIL("%s: %s", #call, cudaGetErrorString(_e));        \
  } while (0)

template <typename T>
T valueOf(int rank, size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 101) - 50);
}

// One device allreduce of `n` elements of T with `op`, in or out of place,
// checked bit for bit against the reference computed here.
template <typename T>
void checkAllreduce(Client& c, cudaStream_t s, DataType dt, ReduceOp op, size_t n, bool in_place, int seq) {
  const auto w = c.world();
  std::vector<T> host(n), got(n);
  for (size_t i = 0; i < n; ++i) host[i] = valueOf<T>(w.rank, i);
  void* din = nullptr;
  void* dout = nullptr;
  CUDA_OK(cudaMalloc(&din, n * sizeof(T) + 1));
  CUDA_OK(cudaMalloc(&dout, n * sizeof(T) + 1));
  CUDA_OK(cudaMemcpyAsync(din, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, s));
  int64_t shape[1] = {static_cast<int64_t>(n)};
  std::string name = "dev." + std::to_string(seq);
  AllreduceArgs a;
  a.name = name.c_str();
  a.input = din;
  a.output = in_place ? din : dout;
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(dt);
  a.op = static_cast<int>(op);
  a.stream = s;
  auto h = c.allreduceAsync(a);
  if (!h.isOk()) FAIL("%s: %s", name.c_str(), h.status().toString().c_str());
  auto st = c.wait(*h, milliseconds(60'000));
  if (!st.isOk()) FAIL("%s: %s", name.c_str(), st.toString().c_str());
  CUDA_OK(cudaMemcpyAsync(got.data(), a.output, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; ++i) {
    T want = valueOf<T>(0, i);
    for (int r = 1; r < w.size; ++r) {
      T v = valueOf<T>(r, i);
      if (op == ReduceOp::kMax) want = v > want ? v : want;
      else if (op == ReduceOp::kMin) want = v < want ? v : want;
      else want = static_cast<T>(want + v);
    }
    if (op == ReduceOp::kAverage) want = static_cast<T>(static_cast<double>(want) * (1.0 / w.size));
    if (std::memcmp(&want, &got[i], sizeof(T)) != 0) {
      FAIL("%s (dtype %d op %d n %zu %s): element %zu is %g, want %g", name.c_str(), static_cast<int>(dt),
           static_cast<int>(op), n, in_place ? "in place" : "out of place", i, static_cast<double>(got[i]),
           static_cast<double>(want));
    }
  }
  CUDA_OK(cudaFree(din));
  CUDA_OK(cudaFree(dout));
}

bool needDevice(Client& c) {
  if (!c.deviceReady()) {
    std::printf("SKIP: no device arena: %s\n", c.deviceWhy().c_str());
    return false;
  }
  return true;
}

int allreduce(Client& c) {
  if (!needDevice(c)) return 0;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int seq = 0;
  for (size_t n : {size_t{1}, size_t{1000}, size_t{(1u << 20) + 3}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      ++seq;
      checkAllreduce<float>(c, s, DataType::kFloat32, op, n, seq % 2 == 0, seq);
      ++seq;
      checkAllreduce<int32_t>(c, s, DataType::kInt32, op, n, seq % 2 == 0, seq);
      ++seq;
      checkAllreduce<double>(c, s, DataType::kFloat64, op, n, seq % 2 == 0, seq);
    }
    ++seq;
    checkAllreduce<float>(c, s, DataType::kFloat32, ReduceOp::kAverage, n, false, seq);
  }
  // More device ops in flight than event pairs (64): 100 submitted before
  // any wait; the 65th waits for completions inside allreduceAsync.
  const auto w = c.world();
  {
    const int kOps = 100;
    const size_t m = 257;
    float* bufs = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&bufs), kOps * m * sizeof(float)));
    std::vector<float> init(kOps * m);
    for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>((i % 97) + w.rank);
    CUDA_OK(cudaMemcpyAsync(bufs, init.data(), init.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    int64_t shape1[1] = {static_cast<int64_t>(m)};
    std::vector<uint64_t> hs;
    std::vector<std::string> names(kOps);
    for (int j = 0; j < kOps; ++j) {
      names[j] = "dev.many." + std::to_string(j);
      AllreduceArgs a;
      a.name = names[j].c_str();
      a.input = a.output = bufs + j * m;
      a.ndim = 1;
      a.shape = shape1;
      a.dtype = static_cast<int>(DataType::kFloat32);
      a.op = static_cast<int>(ReduceOp::kSum);
      a.stream = s;
      auto h = c.allreduceAsync(a);
      if (!h.isOk()) FAIL("many: op %d: %s", j, h.status().toString().c_str());
      hs.push_back(*h);
    }
    for (uint64_t h : hs) {
      auto st = c.wait(h, milliseconds(60'000));
      if (!st.isOk()) FAIL("many: %s", st.toString().c_str());
    }
    std::vector<float> got(init.size());
    CUDA_OK(cudaMemcpyAsync(got.data(), bufs, got.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    const float ranks = static_cast<float>(w.size * (w.size - 1) / 2);
    for (size_t i = 0; i < got.size(); ++i) {
      float want = static_cast<float>(w.size) * static_cast<float>(i % 97) + ranks;
      if (got[i] != want) FAIL("many: element %zu is %g, want %g", i, got[i], want);
    }
    CUDA_OK(cudaFree(bufs));
    seq += kOps;
  }
  // Broadcast in place from the last rank, on the legacy default stream.
  const size_t n = 4099;
  std::vector<int32_t> host(n), got(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<int32_t>(i) + 1000 * w.rank;
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n * sizeof(int32_t)));
  CUDA_OK(cudaMemcpy(d, host.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
  int64_t shape[1] = {static_cast<int64_t>(n)};
  auto h = c.broadcastAsync("dev.bcast", d, 1, shape, static_cast<int>(DataType::kInt32), w.size - 1);
  if (!h.isOk()) FAIL("broadcast: %s", h.status().toString().c_str());
  auto st = c.wait(*h, milliseconds(60'000));
  if (!st.isOk()) FAIL("broadcast: %s", st.toString().c_str());
  CUDA_OK(cudaMemcpy(got.data(), d, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != static_cast<int32_t>(i) + 1000 * (w.size - 1)) FAIL("broadcast: element %zu is %d", i, got[i]);
  }
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaStreamDestroy(s));
  std::printf("ALLREDUCE OK (%d ops)\n", seq + 1);
  return 0;
}

// The trainer's stream is busy (~0.5 s) producing the tensor when the
// allreduce is submitted: the copy-in must wait for it on the device.
int ordering(Client& c) {
  if (!needDevice(c)) return 0;
  const auto w = c.world();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 1 << 16;
  float* d = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)));
  CUDA_OK(cudaMemsetAsync(d, 0, n * sizeof(float), s));
  kolo::gpu::testing::launchSpinThenFill(s, d, n, 100.0f * static_cast<float>(w.rank + 1), 1'000'000'000ull);
  int64_t shape[1] = {static_cast<int64_t>(n)};
  AllreduceArgs a;
  a.name = "dev.ordering";
  a.input = d;
  a.output = d;
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kFloat32);
  a.op = static_cast<int>(ReduceOp::kSum);
  a.stream = s;
  auto t0 = std::chrono::steady_clock::now();
  auto h = c.allreduceAsync(a);
  if (!h.isOk()) FAIL("submit: %s", h.status().toString().c_str());
  double submit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto st = c.wait(*h, milliseconds(60'000));
  if (!st.isOk()) FAIL("wait: %s", st.toString().c_str());
  std::vector<float> got(n);
  CUDA_OK(cudaMemcpyAsync(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  const float ranks = static_cast<float>(w.size * (w.size + 1) / 2);
  for (size_t i = 0; i < n; ++i) {
    float want = 100.0f * ranks + static_cast<float>(w.size) * static_cast<float>(i % 1024);
    if (got[i] != want) FAIL("element %zu is %g, want %g (the copy-in overtook the trainer's kernel?)", i, got[i], want);
  }
  std::printf("rank %d submit took %.3f s (must not wait for the busy stream)\n", rank_, submit_s);
  if (submit_s > 0.25) FAIL("allreduceAsync blocked on the host for %.3f s", submit_s);
  std::printf("ORDERING OK\n");
  return 0;
}

// Rank 1 dies with its device arena mapped and an op in flight; rank 0 must
// get an error, not hang.
int die(Client& c) {
  if (!needDevice(c)) return 0;
  const auto w = c.world();
  const size_t n = 1 << 20;
  float* d = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)));
  CUDA_OK(cudaMemset(d, 0, n * sizeof(float)));
  int64_t shape[1] = {static_cast<int64_t>(n)};
  AllreduceArgs a;
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kFloat32);
  a.op = static_cast<int>(ReduceOp::kSum);
  a.input = a.output = d;
  a.name = "dev.die.0";
  auto h = c.allreduceAsync(a);
  if (!h.isOk() || !c.wait(*h, milliseconds(60'000)).isOk()) FAIL("the first allreduce failed");
  if (w.rank == 1) {
    a.name = "dev.die.1";
    (void)c.allreduceAsync(a);
    std::printf("rank 1 dies now\n");
    std::fflush(stdout);
    std::_Exit(7);
  }
  ::usleep(200'000);
  a.name = "dev.die.2";  // rank 1 never submits this one
  h = c.allreduceAsync(a);
  kolo::Status st = h.isOk() ? c.wait(*h, milliseconds(60'000)) : h.status();
  if (st.isOk()) FAIL("an allreduce with a dead rank succeeded");
  if (st.code() == kolo::Code::kTimedOut) FAIL("hung: %s", st.toString().c_str());
  std::printf("rank 0 got: %s\nDIE OK\n", st.toString().c_str());
  return 0;
}
// Timings for docs/gpu.md (run by bench/gpu_check.sh through the disabled
// test DevicePathGpu.DISABLED_Bench*): float32 allreduce of device tensors
// end to end (copy-in, agent kernel, copy-out, stream synchronised) per size;
// rank 0 prints a table. "floor" is the least device traffic an allreduce of
// k tensors on one GPU needs (read k*S, write k*S) at the D2D copy bandwidth
// measured here; "x floor" is the measured time over that.
int bench(Client& c) {
  if (!needDevice(c)) return 0;
  const auto w = c.world();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t max_bytes = size_t{256} << 20;
  void* a_buf = nullptr;
  void* b_buf = nullptr;
  CUDA_OK(cudaMalloc(&a_buf, max_bytes));
  CUDA_OK(cudaMalloc(&b_buf, max_bytes));
  CUDA_OK(cudaMemset(a_buf, 0, max_bytes));
  // D2D copy bandwidth (bytes read + written), measured alone by rank 0 first.
  double copy_gbs = 0;
  if (w.rank == 0) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaMemcpyAsync(b_buf, a_buf, max_bytes, cudaMemcpyDeviceToDevice, s));
    CUDA_OK(cudaEventRecord(e0, s));
    for (int i = 0; i < 10; ++i) CUDA_OK(cudaMemcpyAsync(b_buf, a_buf, max_bytes, cudaMemcpyDeviceToDevice, s));
    CUDA_OK(cudaEventRecord(e1, s));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    copy_gbs = 2.0 * 10 * static_cast<double>(max_bytes) / (ms * 1e-3) / 1e9;
    std::printf("device: D2D copy %.0f GB/s (bytes read + written); %d trainers share the GPU\n", copy_gbs, w.size);
    std::printf("%12s %8s %12s %12s %10s %10s %10s\n", "bytes", "iters", "us/op", "floor us", "x floor", "submit us",
                "wait us");
  }
  int seq = 0;
  for (size_t bytes : {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, max_bytes}) {
    const int iters = bytes >= (size_t{16} << 20) ? 10 : 200;
    int64_t shape[1] = {static_cast<int64_t>(bytes / sizeof(float))};
    AllreduceArgs a;
    a.ndim = 1;
    a.shape = shape;
    a.dtype = static_cast<int>(DataType::kFloat32);
    a.op = static_cast<int>(ReduceOp::kSum);
    a.input = a_buf;
    a.output = b_buf;
    a.stream = s;
    std::chrono::steady_clock::time_point t0;
    // Where the host time of an op goes: the submission (staging copy and
    // event record, then the descriptor), and the wait (the agent's answer,
    // then the copy-out enqueued on the stream).
    double submit_us = 0, wait_us = 0;
    using Us = std::chrono::duration<double, std::micro>;
    for (int i = -3; i < iters; ++i) {  // 3 warm-up ops
      if (i == 0) {
        CUDA_OK(cudaStreamSynchronize(s));
        t0 = std::chrono::steady_clock::now();
      }
      std::string name = "bench." + std::to_string(++seq);
      a.name = name.c_str();
      auto ta = std::chrono::steady_clock::now();
      auto h = c.allreduceAsync(a);
      if (!h.isOk()) FAIL("bench: %s", h.status().toString().c_str());
      auto tb = std::chrono::steady_clock::now();
      auto st = c.wait(*h, milliseconds(120'000));
      if (!st.isOk()) FAIL("bench: %s", st.toString().c_str());
      if (i >= 0) {
        submit_us += Us(tb - ta).count();
        wait_us += Us(std::chrono::steady_clock::now() - tb).count();
      }
    }
    CUDA_OK(cudaStreamSynchronize(s));
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (w.rank == 0) {
      double floor_us = 2.0 * w.size * static_cast<double>(bytes) / (copy_gbs * 1e9) * 1e6;
      std::printf("%12zu %8d %12.1f %12.1f %10.2f %10.1f %10.1f\n", bytes, iters, us, floor_us, us / floor_us,
                  submit_us / iters, wait_us / iters);
    }
  }
  CUDA_OK(cudaFree(a_buf));
  CUDA_OK(cudaFree(b_buf));
  std::printf("BENCH OK\n");
  return 0;
}
// The device half of "stream": the allreduce names no stream (OpArgs.stream
// NULL), the thread's kolo_set_stream stream orders it: the tensor is
// produced by a long kernel on that (non-blocking) stream right before the
// submission, so a copy on any other stream would read stale values. Then a
// stream named on another device is refused with both devices named.
int streamDevice(Client& c) {
  const auto w = c.world();
  int dev = -1;
  CUDA_OK(cudaGetDevice(&dev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  kolo_stream_t ks = KOLO_STREAM_INIT;
  ks.device = dev;
  ks.stream = s;
  if (kolo_set_stream(&ks) != KOLO_OK) FAIL("kolo_set_stream: %s", kolo_last_error());
  const size_t n = 1 << 20;
  float* buf = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&buf), n * sizeof(float)));
  // ~0.3 s of spinning on s, then buf[i] = rank + 1 + i % 1024.
  kolo::gpu::testing::launchSpinThenFill(s, buf, n, static_cast<float>(w.rank + 1), 500'000'000ull);
  int64_t shape[1] = {static_cast<int64_t>(n)};
  AllreduceArgs a;
  a.name = "stream.device";
  a.input = buf;
  a.output = buf;
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kFloat32);
  a.op = static_cast<int>(ReduceOp::kSum);
  auto h = c.allreduceAsync(a);
  if (!h.isOk()) FAIL("device allreduce on the thread stream: %s", h.status().toString().c_str());
  auto st = c.wait(*h, milliseconds(60'000));
  if (!st.isOk()) FAIL("device allreduce on the thread stream: %s", st.toString().c_str());
  std::vector<float> got(n);
  CUDA_OK(cudaMemcpyAsync(got.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(w.size * (w.size + 1) / 2 + w.size * static_cast<int>(i % 1024));
    if (got[i] != want) FAIL("stream.device: element %zu is %g, want %g", i, static_cast<double>(got[i]), static_cast<double>(want));
  }
  // A stream said to be on another device: refused at submission, naming both.
  ks.device = dev + 1;
  if (kolo_set_stream(&ks) != KOLO_OK) FAIL("kolo_set_stream: %s", kolo_last_error());
  a.name = "stream.otherdevice";
  auto bad = c.allreduceAsync(a);
  if (bad.isOk() || bad.status().code() != kolo::Code::kInvalidArgument ||
      !contains(bad.status().message(), ("its stream is on CUDA device " + std::to_string(dev + 1)).c_str()) ||
      !contains(bad.status().message(), "this rank's device arena is on CUDA device")) {
    FAIL("a stream on another device: %s", bad.isOk() ? "accepted" : bad.status().toString().c_str());
  }
  std::printf("rank %d refusal: %s\n", rank_, bad.status().message().c_str());
  (void)kolo_set_stream(nullptr);
  CUDA_OK(cudaFree(buf));
  CUDA_OK(cudaStreamDestroy(s));
  std::printf("STREAM OK\n");
  return 0;
}

#endif  // KOLO_TEST_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s refuse|stream|allreduce|ordering|die|bench\n", argv[0]);
    return 2;
  }
  auto opts = kolo::ClientOptions::fromEnvironment();
  if (!opts.isOk()) FAIL("options: %s", opts.status().toString().c_str());
  auto client = Client::connect(*opts);
  if (!client.isOk()) FAIL("connect: %s", client.status().toString().c_str());
  Client& c = **client;
  rank_ = c.world().rank;
  const std::string mode = argv[1];
  int rc = 2;
  if (mode == "refuse") rc = refuse(c);
  else if (mode == "stream") rc = stream(c);
#ifdef KOLO_TEST_HAVE_CUDA
  else if (mode == "allreduce") rc = allreduce(c);
  else if (mode == "ordering") rc = ordering(c);
  else if (mode == "die") rc = die(c);
  else if (mode == "bench") rc = bench(c);
#else
  else if (mode == "allreduce" || mode == "ordering" || mode == "die" || mode == "bench") {
    std::printf("SKIP: this build has no CUDA\n");
    rc = 0;
  }
#endif
  std::fflush(stdout);
  c.shutdown();
  return rc;
}
