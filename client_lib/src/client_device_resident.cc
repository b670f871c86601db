// Zero copy on the device (docs/gpu.md, "Zero copy on the device"):
// kolo_device_alloc / kolo_device_free, and the submission of an allreduce
// or broadcast whose tensor lives in such a buffer. The buffer is a block of
// the rank's device arena, which the agent maps too, so the agent reduces in
// place there: no copy into a slot before, none out after. Out of place, the
// input is copied into the (resident) output on the stream first, once.
#include <cstdio>
#include <cstring>

#pragma GCC visibility push(default)
#include "kolo/kolo_c.h"
#pragma GCC visibility pop

#include "agent/gpu/device_ipc.h"
#include "c_api_internal.h"
#include "client.h"
#include "client_text.h"

namespace kolo {

// --- DeviceClient's defaults: a libkolo without a device path ---------------

StatusOr<void*> DeviceClient::allocResident(uint64_t) {
  return unavailable("kolo_device_alloc: this rank has no device arena (" + why() + ")");
}
Status DeviceClient::freeResident(void*, void*) {
  return unavailable("kolo_device_free: this rank has no device arena (" + why() + ")");
}
std::optional<uint64_t> DeviceClient::residentOffset(const void*, uint64_t) const {
  return std::nullopt;
}
StatusOr<DeviceClient::Staged> DeviceClient::stageResident(uint64_t, const void*, uint64_t, void*,
                                                           Clock::time_point) {
  return unavailable(why());
}

// --- Client ------------------------------------------------------------------

StatusOr<void*> Client::deviceAlloc(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usableLocked());
  }
  return device_->allocResident(bytes);
}

Status Client::deviceFree(void* ptr, void* stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto at = device_->residentOffset(ptr, 1)) {
      for (const auto& [h, op] : ops_) {
        if (op.state != OpState::kDone && op.device && op.staged.resident &&
            op.staged.offset == *at) {
          return invalidArgument("kolo_device_free: the buffer is in use by the " +
                                 std::string(collectiveName(op.collective)) + " of device tensor " +
                                 client_text::quoteName(op.name) + ", still in flight");
        }
      }
    }
  }
  return device_->freeResident(ptr, stream);
}

Status Client::prepareResident(const OpArgs& a, uint64_t bytes, uint64_t at,
                               const std::string& what, Clock::time_point deadline, SubmitDesc* d,
                               Op* op) {
  void* const stream = deviceStream(a);
  void* const target = a.output != nullptr ? a.output : const_cast<void*>(a.input);
  const void* copy_from = a.input != nullptr && a.input != target ? a.input : nullptr;
  auto staged = stageDraining(
      [&] { return device_->stageResident(at, copy_from, bytes, stream, deadline); }, deadline);
  if (!staged.isOk())
    return Status(staged.status().code(), what + ": " + staged.status().message());
  // The descriptor of an in place device op (prepareDevice's non-layout
  // case), whose slot is the caller's buffer.
  SlotRequest r = slotRequest(a, bytes);
  r.has_output = false;
  SlotPlan plan;
  plan.slot_bytes = bytes;
  plan.input = SlotPiece{0, bytes, true};
  plan.result = plan.input;
  plan.result_bytes = bytes;
  *d = describeSubmit(r, plan, staged->offset);
  d->out_offset = d->out_bytes = 0;
  gpu::markDevice(d, staged->event);
  op->bytes = bytes;
  op->device = true;
  op->device_result_at = 0;
  op->staged = *staged;
  op->stream = stream;
  return okStatus();
}

}  // namespace kolo

// --- C ABI (revision 3) --------------------------------------------------------

using kolo::Code;
using kolo::capi::current;
using kolo::capi::fail;
using kolo::capi::notInitialized;
using kolo::capi::report;

extern "C" {

kolo_status_t kolo_device_alloc(size_t bytes, void** ptr){
    KOLO_C_GUARD("kolo_device_alloc",
                 {
                   if (ptr == nullptr)
                     return fail(Code::kInvalidArgument, "kolo_device_alloc: ptr is NULL");
                   *ptr = nullptr;
                   auto c = current();
                   if (!c) return notInitialized();
                   auto p = c->deviceAlloc(bytes);
                   if (!p.isOk()) return fail(p.status());
                   *ptr = *p;
                   return KOLO_OK;
                 })}

kolo_status_t kolo_device_free(void* ptr) {
  KOLO_C_GUARD("kolo_device_free", {
    if (ptr == nullptr) return KOLO_OK;
    auto c = current();
    if (!c) return notInitialized();
    return report(c->deviceFree(ptr, kolo::threadStream().stream));
  })
}

void* kolo_device_alloc_stream(size_t bytes, int device, void* stream) {
  (void)stream;  // the buffer is usable on any stream at once
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  kolo_status_t st = KOLO_OK;
  try {
    auto c = current();
    if (!c) {
      st = notInitialized();
    } else if (device >= 0 && c->deviceReady() && device != c->deviceOrdinal()) {
      st = fail(Code::kInvalidArgument,
                "kolo_device_alloc_stream: CUDA device " + std::to_string(device) +
                    " asked for, but this rank's device arena is on CUDA device " +
                    std::to_string(c->deviceOrdinal()));
    } else {
      auto r = c->deviceAlloc(bytes);
      st = r.isOk() ? KOLO_OK : fail(r.status());
      if (r.isOk()) p = *r;
    }
  } catch (const std::exception& e) {
    st = kolo::capi::internal("kolo_device_alloc_stream", &e);
  } catch (...) {
    st = kolo::capi::internal("kolo_device_alloc_stream", nullptr);
  }
  // An allocator hook (torch's CUDAPluggableAllocator) has no error text to
  // pass on: the caller sees NULL (out of memory), stderr says why.
  if (st != KOLO_OK) std::fprintf(stderr, "kolo: %s\n", kolo_last_error());
  return p;
}

void kolo_device_free_stream(void* ptr, size_t bytes, int device, void* stream) {
  (void)bytes;
  (void)device;
  if (ptr == nullptr) return;
  try {
    auto c = current();
    kolo::Status s = c ? c->deviceFree(ptr, stream) : kolo::capi::notInitializedStatus();
    if (!s.isOk()) {
      (void)fail(s);
      std::fprintf(stderr, "kolo: %s\n", s.message().c_str());
    }
  } catch (...) {
    (void)kolo::capi::internal("kolo_device_free_stream", nullptr);
  }
}

}  // extern "C"
