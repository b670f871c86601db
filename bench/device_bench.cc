#include "bench/device_bench.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "agent/gpu/device_api.h"
#include "kolo/kolo_c.h"

namespace kolo::bench {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int64_t kSyncTimeoutMs = 600'000;
DeviceBench* g_active = nullptr;  // the one instance (copyResult)

Status fromKolo(kolo_status_t st, const std::string& what) {
  if (st == KOLO_OK) return okStatus();
  return Status(static_cast<Code>(st), what + ": " + kolo_last_error());
}

}  // namespace

struct DeviceBench::Holder {
  std::unique_ptr<gpu::DevStream> stream;
};

StatusOr<std::unique_ptr<DeviceBench>> DeviceBench::prepare(const std::string& kind,
                                                            uint64_t buffer_bytes, bool zero_copy) {
  ASSIGN_OR_RETURN(gpu::DeviceKind k, gpu::parseDeviceKind(kind));
  RETURN_IF_ERROR(gpu::selectDeviceApi(k));
  if (gpu::deviceApi() == nullptr) {
    return unavailable("--device " + kind + ": this kolo-bench was built without CUDA");
  }
  setenv("KOLO_DEVICE", kind.c_str(), 1);  // libkolo's seam: the same instance
  std::unique_ptr<DeviceBench> d(new DeviceBench());
  d->kind_ = kind;
  d->zero_copy_ = zero_copy;
  // Staging slots: up to twice the largest size (the n-part ops' slot holds
  // input and output), plus the zero-copy buffers, plus slack.
  const uint64_t need = 2 * buffer_bytes + (zero_copy ? buffer_bytes : 0) + 64 * kMiB;
  const char* set = std::getenv("KOLO_DEVICE_ARENA_MB");
  if (set == nullptr || *set == '\0') {
    d->arena_mb_ = std::min<uint64_t>(65536, (need + kMiB - 1) / kMiB);
    setenv("KOLO_DEVICE_ARENA_MB", std::to_string(d->arena_mb_).c_str(), 1);
  } else {
    d->arena_mb_ = std::strtoull(set, nullptr, 10);
  }
  return d;
}

Status DeviceBench::attach() {
  gpu::DeviceApi& api = *gpu::deviceApi();
  int dev = -1;
  Status st = fromKolo(kolo_device_path(&dev), "kolo_device_path");
  if (!st.isOk()) {
    return Status(st.code(), st.message() + " (start the agent with --device=" + kind_ +
                                 ", e.g. KOLO_DEVICE=" + kind_ + " kolorun ...)");
  }
  device_ = dev;
  RETURN_IF_ERROR(api.setDevice(dev));
  holder_ = std::make_unique<Holder>();
  ASSIGN_OR_RETURN(holder_->stream, api.createStream());
  stream_ = holder_->stream->get();
  kolo_stream_t s = KOLO_STREAM_INIT;
  s.device = dev;
  s.stream = stream_;
  RETURN_IF_ERROR(fromKolo(kolo_set_stream(&s), "kolo_set_stream"));
  g_active = this;
  return okStatus();
}

DeviceBench::~DeviceBench() {
  if (g_active == this) g_active = nullptr;
  gpu::DeviceApi* api = gpu::deviceApi();
  if (api != nullptr && stream_ != nullptr) (void)api->streamSynchronize(stream_, kSyncTimeoutMs);
  for (void* p : buffers_) {
    if (zero_copy_) {
      (void)kolo_device_free(p);
    } else if (api != nullptr) {
      api->freeDevice(p);
    }
  }
  (void)kolo_set_stream(nullptr);
}

StatusOr<void*> DeviceBench::alloc(uint64_t bytes) {
  void* p = nullptr;
  if (zero_copy_) {
    RETURN_IF_ERROR(fromKolo(kolo_device_alloc(bytes, &p), "kolo_device_alloc"));
  } else {
    ASSIGN_OR_RETURN(p, gpu::deviceApi()->allocDevice(bytes));
  }
  buffers_.push_back(p);
  return p;
}

Status DeviceBench::upload(void* dst, const void* src, uint64_t bytes) {
  RETURN_IF_ERROR(gpu::deviceApi()->copyAsync(dst, src, bytes, stream_));
  return sync();
}

Status DeviceBench::download(void* dst, const void* src, uint64_t bytes) {
  RETURN_IF_ERROR(gpu::deviceApi()->copyAsync(dst, src, bytes, stream_));
  return sync();
}

Status DeviceBench::sync() { return gpu::deviceApi()->streamSynchronize(stream_, kSyncTimeoutMs); }

std::string DeviceBench::describe() const {
  return kind_ + " device " + std::to_string(device_) + ", " +
         (zero_copy_ ? "zero copy (kolo_device_alloc; allreduce and broadcast run in the buffers, "
                       "the other collectives stage them like user memory)"
                     : "user device memory (copied into the device arena and out)") +
         ", device arena " + std::to_string(arena_mb_) + " MiB, stream synchronized after each op";
}

const char* DeviceBench::emulationWarning() {
  return "# WARNING: THE DEVICE IS HOST-EMULATED (--device host-emulated, the test emulation): "
         "these are CPU timings of the emulated device path, NOT GPU figures";
}

Status DeviceBench::copyResult(void* dst, const void* src, uint64_t bytes) {
  if (g_active == nullptr) return internalError("device result copy without a device bench");
  return g_active->download(dst, src, bytes);
}

}  // namespace kolo::bench
