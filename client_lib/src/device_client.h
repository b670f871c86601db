// libkolo's side of the device path (docs/gpu.md, "The device data path").
//
// A process that sets KOLO_DEVICE_ARENA_MB before kolo_init asks the agent
// for a device arena on its current CUDA device: it creates its in_ready
// interprocess events and sends their handles in Hello; the agent answers
// with the arena's fd (VMM, imported here) and its out_ready handles. A
// device tensor is then copied into a slot of that arena on the caller's
// stream (cudaMemcpyAsync, cudaMemcpyDefault), in_ready[e] is recorded after
// it, and the descriptor carries kSubmitFlagDevice and e. At completion the
// caller's stream waits on out_ready[e] and copies the result out; the slot
// and e are reused once a plain event recorded after that copy has passed.
// No host synchronisation anywhere.
//
// Built with CUDA or the host emulation: device_client_device.cc, over the
// device seam (agent/gpu/device_api.h; KOLO_DEVICE=host-emulated selects the
// emulation, test builds only); without either: device_client_none.cc
// (never ready; device tensors are refused with the reason). Nothing here
// touches CUDA unless the process asked (KOLO_DEVICE_ARENA_MB > 0), so the
// host path is unchanged and libkolo loads without a driver.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace kolo {

namespace ipc {
class Hello;
class Welcome;
}  // namespace ipc

// KOLO_DEVICE_ARENA_MB: 0/unset = no device arena (pure; tested).
StatusOr<uint64_t> parseDeviceArenaMb(const char* value);

// The calling thread's CUDA stream for device collectives (kolo_set_stream
// in the C ABI, docs/gpu.md): used by a device op whose OpArgs.stream is
// NULL. device -1: any (the device arena's). Thread-local, so it needs no
// lock and no connection.
struct ThreadStream {
  int device = -1;
  void* stream = nullptr;
};
ThreadStream& threadStream();

class DeviceClient {
 public:
  using Clock = std::chrono::steady_clock;
  struct Staged {
    uint64_t offset = 0;  // in the device arena
    uint32_t event = 0;   // the event pair
    // Zero copy (kolo_device_alloc): `offset` is the caller's own buffer in
    // the device arena; no slot is taken, nothing is copied out, and only
    // the event pair retires.
    bool resident = false;
  };

  static std::unique_ptr<DeviceClient> create();
  virtual ~DeviceClient() = default;

  // Before Hello: when asked, fills the Hello's device fields (or records
  // why it cannot and asks for nothing).
  virtual void prepareHello(ipc::Hello* h) = 0;
  // After Welcome: imports the arena (`fd`, when granted) and opens the
  // agent's events, or records the agent's device_error.
  virtual void attach(const ipc::Welcome& w, UniqueFd fd) = 0;

  virtual bool asked() const = 0;  // KOLO_DEVICE_ARENA_MB > 0
  virtual bool ready() const = 0;  // a device arena is mapped
  // Why not ready (for the refusal of a device tensor).
  virtual std::string why() const = 0;
  // Whether `p` is device (or managed) memory; only called when asked().
  virtual bool isDevicePointer(const void* p) = 0;
  // The CUDA device ordinal of device memory `p` (-1: host, managed or
  // unknown); only called for a pointer isDevicePointer() accepted.
  virtual int pointerDevice(const void* p) = 0;
  // The CUDA device of the device arena (-1 when not ready()).
  virtual int device() const = 0;

  // Takes a slot of `slot_bytes` (at least `bytes`) and an event pair
  // (waiting for retiring ones until `deadline`), enqueues the copy of
  // `bytes` from `src` to the slot's offset `in_at` on `stream` and records
  // in_ready. TimedOut when nothing frees up in time; InProgress (with the
  // reason) when only ops still in flight hold what it needs: the caller
  // drains completions and asks again.
  virtual StatusOr<Staged> stageIn(const void* src, uint64_t bytes, uint64_t slot_bytes,
                                   uint64_t in_at, void* stream, Clock::time_point deadline) = 0;
  // At completion (or when the op is dropped): `stream` waits on out_ready
  // (always: after an agent error the agent may still write the slot), when
  // `copy` the `bytes` at the slot's offset `result_at` are copied to `dst`;
  // the slot and the event pair retire behind a plain event on `stream`,
  // unless `hold`: then the slot stays (a library-owned device result,
  // address()) until retire().
  virtual Status finish(const Staged& s, void* dst, uint64_t result_at, uint64_t bytes,
                        void* stream, bool copy, bool hold) = 0;
  // A held slot (finish with `hold`) retires behind a plain event on `stream`.
  virtual void retire(const Staged& s, void* stream) = 0;
  // The device address of the slot's offset `at` (this process's mapping).
  virtual void* address(const Staged& s, uint64_t at) const = 0;

  // More event pairs (docs/gpu.md, "More than 64 device ops in flight"):
  // whether every pair is in flight and more may be asked for (fewer than
  // gpu::kMaxDeviceEventPairs, and the agent never refused).
  virtual bool eventsExhausted() = 0;
  // New in_ready events (as many again as there are, at most 512 a frame),
  // their handles for the DeviceEvents frame; kept apart until
  // attachEvents (the agent's out_ready handles of DeviceEventsGranted)
  // numbers them after the existing pairs, or dropNewEvents (refused: no
  // more growth, the submissions wait for pairs as before).
  virtual StatusOr<std::string> newEvents() = 0;
  virtual Status attachEvents(const std::string& agent_handles) = 0;
  virtual void dropNewEvents() = 0;
  virtual uint32_t eventPairs() = 0;

  // One copy-in launch per group (docs/gpu.md, "Device Tensor Fusion"): the
  // calling thread's next `members` stageIn calls on `stream` whose source
  // is device memory only take their slot and pair; the last one enqueues
  // every copy as one batched copy and records every in_ready before it
  // returns (so before the group's last member is published: the agent
  // holds a group's members until the last arrives, and waits on in_ready
  // only then). endBatch() flushes what is left (a group that failed half
  // way) and ends it. The number of batched copy launches of the last flush.
  virtual void beginBatch(void* stream, size_t members) = 0;
  virtual Status endBatch() = 0;
  virtual int lastBatchLaunches() const = 0;

  // Zero copy (kolo_device_alloc / kolo_device_free, device_client_resident.cc;
  // docs/gpu.md, "Zero copy"). The defaults refuse: a libkolo without a
  // device path.
  // A buffer of `bytes` inside the device arena, owned by the caller.
  virtual StatusOr<void*> allocResident(uint64_t bytes);
  // Gives it back; its space is reused once `stream` has passed this point.
  virtual Status freeResident(void* p, void* stream);
  // The arena offset of [p, p + bytes) when it lies inside one live
  // allocResident buffer, else nullopt.
  virtual std::optional<uint64_t> residentOffset(const void* p, uint64_t bytes) const;
  // Takes an event pair for an op on the resident buffer at `offset`, copies
  // `bytes` from `copy_from` into it first when not null (out of place), and
  // records in_ready on `stream`. InProgress / TimedOut as stageIn.
  virtual StatusOr<Staged> stageResident(uint64_t offset, const void* copy_from, uint64_t bytes,
                                         void* stream, Clock::time_point deadline);
  // Device copies libkolo enqueued so far (copy-in, copy-out, the out of
  // place copy of a resident op): the tests' proof that zero copy copies nothing.
  virtual uint64_t copiesEnqueued() const { return 0; }
};

}  // namespace kolo
