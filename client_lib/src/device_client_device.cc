// DeviceClient over the device seam (device_client.h, agent/gpu/device_api.h;
// docs/gpu.md): the same protocol on CUDA and on the host emulation
// (KOLO_DEVICE=host-emulated, test builds only).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "agent/gpu/device_api.h"
#include "agent/gpu/device_ipc.h"
#include "arena_allocator.h"
#include "device_client.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {

constexpr uint32_t kEventPairs = kMaxDeviceEvents;

// Makes `device` current on this (the caller's) thread for the scope and
// restores the caller's device after: libkolo must not move a trainer's
// thread to another GPU behind its back.
class DeviceScope {
 public:
  DeviceScope(gpu::DeviceApi& api, int device) : api_(api) {
    auto cur = api.currentDevice();
    prev_ = cur.isOk() ? *cur : -1;
    if (prev_ != device) st_ = api.setDevice(device);
  }
  ~DeviceScope() {
    if (prev_ >= 0 && st_.isOk()) (void)api_.setDevice(prev_);
  }
  const Status& status() const { return st_; }

 private:
  gpu::DeviceApi& api_;
  int prev_ = -1;
  Status st_;
};

// KOLO_DEVICE: unset or "cuda" (the default), "host-emulated" (tests).
Status selectFromEnv() {
  const char* env = std::getenv("KOLO_DEVICE");
  if (env == nullptr || *env == '\0') return okStatus();
  ASSIGN_OR_RETURN(gpu::DeviceKind kind, gpu::parseDeviceKind(env));
  return gpu::selectDeviceApi(kind);
}

// The calling thread's group copy-in (DeviceClient::beginBatch).
struct CopyBatch {
  bool on = false;
  void* stream = nullptr;
  size_t left = 0;
  std::vector<gpu::CopySegment> segs;
  std::vector<uint32_t> events;  // in_ready to record after the copy
};
thread_local CopyBatch t_batch;

class SeamDeviceClient final : public DeviceClient {
 public:
  SeamDeviceClient() {
    auto b = parseDeviceArenaMb(std::getenv("KOLO_DEVICE_ARENA_MB"));
    if (!b.isOk()) {
      asked_ = true;
      why_ = b.status().message();
      return;
    }
    bytes_ = *b;
    asked_ = bytes_ > 0;
    why_ = asked_ ? "the kolo agent did not answer the request for a device arena"
                  : "this process asked for none: set KOLO_DEVICE_ARENA_MB before kolo_init";
    if (!asked_) return;  // no device API touched at all
    Status sel = selectFromEnv();
    if (!sel.isOk()) {
      why_ = "KOLO_DEVICE: " + sel.message();
      bytes_ = 0;
      return;
    }
    api_ = gpu::deviceApi();
    if (api_ == nullptr) {
      why_ = "this libkolo was built without CUDA (KOLO_WITH_CUDA=OFF)";
      bytes_ = 0;
    }
  }

  ~SeamDeviceClient() override {
    // Our copies may still run on the callers' streams: let them finish
    // (bounded) before the arena is unmapped.
    if (!arena_) return;
    DeviceScope scope(*api_, device_);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    auto pending = [](gpu::DevEvent& e) { return e.query().code() == Code::kInProgress; };
    for (size_t i = 0; i < done_.size(); ++i) {  // copy-ins (in_) and copy-outs (done_)
      while ((pending(*done_[i]) || pending(*in_[i])) && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  void prepareHello(ipc::Hello* h) override {
    if (!asked_ || bytes_ == 0) return;
    Status st = createEvents(h);
    if (!st.isOk()) {
      why_ = "this process cannot use the device path: " + st.message();
      in_.clear();
      return;
    }
    h->set_device_arena_bytes(bytes_);
  }

  void attach(const ipc::Welcome& w, UniqueFd fd) override {
    if (in_.empty()) return;
    if (w.device_arena_bytes() == 0 || !fd.valid()) {
      why_ = w.device_error().empty() ? "the kolo agent granted no device arena" : w.device_error();
      return;
    }
    Status st = importArena(w, fd.get());
    if (!st.isOk()) {
      why_ = "mapping the device arena from the kolo agent failed: " + st.message();
      arena_.reset();
      out_.clear();
      return;
    }
    alloc_ = std::make_unique<ArenaAllocator>(0, arena_->size());
  }

  bool asked() const override { return asked_; }
  bool ready() const override { return alloc_ != nullptr; }
  std::string why() const override { return why_; }
  bool isDevicePointer(const void* p) override {
    return api_ != nullptr && api_->pointerInfo(p).device;
  }
  int pointerDevice(const void* p) override {
    return api_ != nullptr ? api_->pointerInfo(p).ordinal : -1;
  }
  int device() const override { return ready() ? device_ : -1; }

  StatusOr<Staged> stageIn(const void* src, uint64_t bytes, uint64_t slot_bytes, uint64_t in_at,
                           void* stream, Clock::time_point deadline) override;
  Status finish(const Staged& s, void* dst, uint64_t result_at, uint64_t bytes, void* stream,
                bool copy, bool hold) override;
  void retire(const Staged& s, void* stream) override;
  void* address(const Staged& s, uint64_t at) const override { return slot(s.offset + at); }
  bool eventsExhausted() override {
    std::lock_guard<std::mutex> lock(mu_);
    sweepLocked();
    return ready() && !no_growth_ && pool_.inUse() == pool_.size() &&
           pool_.size() < gpu::kMaxDeviceEventPairs;
  }
  StatusOr<std::string> newEvents() override;
  Status attachEvents(const std::string& agent_handles) override;
  void dropNewEvents() override {
    std::lock_guard<std::mutex> lock(mu_);
    new_in_.clear();
    new_done_.clear();
    no_growth_ = true;
  }
  void beginBatch(void* stream, size_t members) override {
    t_batch = CopyBatch{};
    t_batch.on = ready() && members > 1;
    t_batch.stream = stream;
    t_batch.left = members;
  }
  Status endBatch() override {
    Status st = flushBatch();
    t_batch = CopyBatch{};
    return st;
  }
  int lastBatchLaunches() const override { return last_launches_.load(); }
  uint32_t eventPairs() override {
    std::lock_guard<std::mutex> lock(mu_);
    return pool_.size();
  }

  StatusOr<void*> allocResident(uint64_t bytes) override;
  Status freeResident(void* p, void* stream) override;
  std::optional<uint64_t> residentOffset(const void* p, uint64_t bytes) const override;
  StatusOr<Staged> stageResident(uint64_t offset, const void* copy_from, uint64_t bytes,
                                 void* stream, Clock::time_point deadline) override;
  uint64_t copiesEnqueued() const override { return copies_.load(std::memory_order_relaxed); }

 private:
  Status createEvents(ipc::Hello* h) {
    ASSIGN_OR_RETURN(int n, api_->deviceCount());
    (void)n;
    ASSIGN_OR_RETURN(device_, api_->currentDevice());
    RETURN_IF_ERROR(api_->setDevice(device_));
    ASSIGN_OR_RETURN(std::string uuid, api_->deviceUuid(device_));
    h->set_cuda_device(device_);
    h->set_gpu_uuid(uuid);
    std::string handles;
    // Never moved once made (stageIn and finish index them unlocked while
    // attachEvents appends).
    in_.reserve(gpu::kMaxDeviceEventPairs);
    done_.reserve(gpu::kMaxDeviceEventPairs);
    out_.reserve(gpu::kMaxDeviceEventPairs);
    for (uint32_t i = 0; i < kEventPairs; ++i) {
      ASSIGN_OR_RETURN(auto e, api_->createEvent(true));
      ASSIGN_OR_RETURN(gpu::IpcEventBytes hb, e->exportHandle());
      handles.append(reinterpret_cast<const char*>(hb.data()), hb.size());
      in_.push_back(std::move(e));
      ASSIGN_OR_RETURN(auto d, api_->createEvent(false));
      done_.push_back(std::move(d));
    }
    h->set_device_events(handles);
    return okStatus();
  }

  Status importArena(const ipc::Welcome& w, int fd) {
    ASSIGN_OR_RETURN(uint32_t n, gpu::countEventHandles(w.device_events().size()));
    if (n != in_.size()) {
      return internalError("the agent sent " + std::to_string(n) + " event handles for our " +
                           std::to_string(in_.size()));
    }
    ASSIGN_OR_RETURN(arena_, api_->importArena(fd, w.device_arena_bytes(), device_));
    for (uint32_t i = 0; i < n; ++i) {
      gpu::IpcEventBytes hb;
      std::memcpy(hb.data(), w.device_events().data() + i * hb.size(), hb.size());
      ASSIGN_OR_RETURN(auto e, api_->openEvent(hb));
      out_.push_back(std::move(e));
    }
    return okStatus();
  }

  // Takes a slot and an event pair, or says why not (InProgress: ops in
  // flight hold them).
  StatusOr<Staged> takeLocked(uint64_t bytes, bool* retry);
  // An event pair alone (a resident op), or why not (as takeLocked).
  StatusOr<uint32_t> takePairLocked(bool* retry);
  // Waits (bounded by `deadline`) for what `take` needs to free up.
  template <typename Take>
  StatusOr<Staged> takeUntil(Take take, Clock::time_point deadline);
  // Gives back the slots and event pairs whose copy-out has passed, and
  // the freed resident buffers whose stream passed their free.
  void sweepLocked() {
    while (!retiring_.empty()) {
      const Staged& s = retiring_.front();
      if (done_[s.event]->query().code() == Code::kInProgress) break;
      if (!s.resident) alloc_->free(s.offset);  // a resident buffer stays the caller's
      pool_.release(s.event);
      retiring_.pop_front();
    }
    while (!freed_.empty() && freed_.front().second->query().code() != Code::kInProgress) {
      alloc_->free(freed_.front().first);
      freed_.pop_front();
    }
  }
  char* slot(uint64_t offset) const { return static_cast<char*>(arena_->data()) + offset; }

  gpu::DeviceApi* api_ = nullptr;
  bool asked_ = false;
  uint64_t bytes_ = 0;
  std::string why_;
  int device_ = 0;
  std::vector<std::unique_ptr<gpu::DevEvent>> in_;    // ours, exported
  std::vector<std::unique_ptr<gpu::DevEvent>> out_;   // the agent's, opened
  std::vector<std::unique_ptr<gpu::DevEvent>> done_;  // copy-out passed, per pair
  std::unique_ptr<gpu::DevArena> arena_;

  mutable std::mutex mu_;
  std::unique_ptr<ArenaAllocator> alloc_;
  gpu::EventSlotPool pool_{kEventPairs};
  std::deque<Staged> retiring_;  // in finish order
  bool leaked_ = false;
  // Pairs asked for (newEvents) and not yet granted; no_growth_ once refused.
  std::vector<std::unique_ptr<gpu::DevEvent>> new_in_, new_done_;
  bool no_growth_ = false;
  std::atomic<int> last_launches_{0};

  // The batch's copies as one batched copy, then its in_ready records
  // (each recorded even after a failed copy: the agent's wait must not
  // pass on an earlier record; the op fails with the copy's error).
  Status flushBatch() {
    if (t_batch.events.empty()) return okStatus();
    DeviceScope scope(*api_, device_);
    Status st = scope.status();
    if (st.isOk()) {
      auto n = api_->batchedCopy(t_batch.segs.data(), t_batch.segs.size(), t_batch.stream);
      st = n.status();
      if (n.isOk()) last_launches_ = *n;
    }
    for (uint32_t e : t_batch.events) {
      Status rec = in_[e]->record(t_batch.stream);
      if (st.isOk()) st = rec;
    }
    t_batch.segs.clear();
    t_batch.events.clear();
    return st;
  }

  // Zero copy: live kolo_device_alloc buffers (offset -> bytes asked) and
  // freed ones waiting for their stream (offset, event recorded at the free).
  std::map<uint64_t, uint64_t> resident_;
  uint64_t resident_bytes_ = 0;  // their rounded sizes
  std::deque<std::pair<uint64_t, std::unique_ptr<gpu::DevEvent>>> freed_;
  std::atomic<uint64_t> copies_{0};
};

StatusOr<std::string> SeamDeviceClient::newEvents() {
  DeviceScope scope(*api_, device_);
  RETURN_IF_ERROR(scope.status());
  uint32_t have = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    have = pool_.size();
  }
  const uint32_t n = std::min({have, 512u, gpu::kMaxDeviceEventPairs - have});
  std::vector<std::unique_ptr<gpu::DevEvent>> ins, dones;
  std::string handles;
  for (uint32_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(auto e, api_->createEvent(true));
    ASSIGN_OR_RETURN(gpu::IpcEventBytes hb, e->exportHandle());
    handles.append(reinterpret_cast<const char*>(hb.data()), hb.size());
    ins.push_back(std::move(e));
    ASSIGN_OR_RETURN(auto d, api_->createEvent(false));
    dones.push_back(std::move(d));
  }
  std::lock_guard<std::mutex> lock(mu_);
  new_in_ = std::move(ins);
  new_done_ = std::move(dones);
  return handles;
}

Status SeamDeviceClient::attachEvents(const std::string& agent_handles) {
  DeviceScope scope(*api_, device_);
  RETURN_IF_ERROR(scope.status());
  ASSIGN_OR_RETURN(uint32_t n,
                   gpu::countEventHandles(agent_handles.size(), gpu::kMaxDeviceEventPairs));
  std::vector<std::unique_ptr<gpu::DevEvent>> outs;
  for (uint32_t i = 0; i < n; ++i) {
    gpu::IpcEventBytes hb;
    std::memcpy(hb.data(), agent_handles.data() + i * hb.size(), hb.size());
    ASSIGN_OR_RETURN(auto e, api_->openEvent(hb));
    outs.push_back(std::move(e));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (n != new_in_.size()) {
    return internalError("the agent granted " + std::to_string(n) + " event pairs for our " +
                         std::to_string(new_in_.size()));
  }
  for (uint32_t i = 0; i < n; ++i) {
    in_.push_back(std::move(new_in_[i]));
    done_.push_back(std::move(new_done_[i]));
    out_.push_back(std::move(outs[i]));
  }
  new_in_.clear();
  new_done_.clear();
  pool_.grow(n);
  return okStatus();
}

StatusOr<DeviceClient::Staged> SeamDeviceClient::takeLocked(uint64_t bytes, bool* retry) {
  *retry = false;
  sweepLocked();
  auto e = pool_.acquire();
  if (e) {
    auto off = alloc_->allocate(bytes);
    if (off) return Staged{*off, *e};
    pool_.release(*e);
    if (retiring_.empty()) {
      return Status(Code::kInProgress,
                    "its " + std::to_string(bytes) + " bytes do not fit in the device arena (" +
                        std::to_string(alloc_->capacity()) + " bytes, " +
                        std::to_string(alloc_->usedBytes()) + " held by ops in flight)");
    }
  } else if (retiring_.empty()) {
    return Status(Code::kInProgress, "all " + std::to_string(pool_.size()) +
                                         " device event pairs are held by ops in flight");
  }
  *retry = true;
  return Status(Code::kInProgress, "retiring");
}

StatusOr<DeviceClient::Staged> SeamDeviceClient::stageIn(const void* src, uint64_t bytes,
                                                         uint64_t slot_bytes, uint64_t in_at,
                                                         void* stream, Clock::time_point deadline) {
  if (!ready()) return unavailable(why_);
  DeviceScope scope(*api_, device_);
  RETURN_IF_ERROR(scope.status());
  slot_bytes = std::max(slot_bytes, in_at + bytes);
  if (slot_bytes > alloc_->capacity()) {
    return invalidArgument(
        "its " + std::to_string(slot_bytes) + " bytes are more than the whole device arena (" +
        std::to_string(alloc_->capacity()) + " bytes); raise KOLO_DEVICE_ARENA_MB");
  }
  ASSIGN_OR_RETURN(Staged s,
                   takeUntil([&](bool* retry) { return takeLocked(slot_bytes, retry); }, deadline));
  if (bytes > 0) copies_.fetch_add(1, std::memory_order_relaxed);
  if (t_batch.on && t_batch.left > 0 && stream == t_batch.stream && bytes > 0 &&
      api_->pointerInfo(src).device) {
    t_batch.segs.push_back({src, slot(s.offset + in_at), bytes});
    t_batch.events.push_back(s.event);
    if (--t_batch.left > 0) return s;
    Status st = flushBatch();  // the group's last member: every copy and record now
    if (!st.isOk()) {
      (void)finish(s, nullptr, 0, 0, stream, false, false);
      return st;
    }
    return s;
  }
  if (t_batch.on && t_batch.left > 0 && --t_batch.left == 0) {
    // The last member not batched (host memory, another stream): the
    // others' copies go first.
    Status fl = flushBatch();
    if (!fl.isOk()) {
      (void)finish(s, nullptr, 0, 0, stream, false, false);
      return fl;
    }
  }
  Status st = bytes == 0 ? okStatus() : api_->copyAsync(slot(s.offset + in_at), src, bytes, stream);
  if (st.isOk()) st = in_[s.event]->record(stream);
  if (!st.isOk()) {
    (void)finish(s, nullptr, 0, 0, stream, false, false);
    return st;
  }
  return s;
}

Status SeamDeviceClient::finish(const Staged& s, void* dst, uint64_t result_at, uint64_t bytes,
                                void* stream, bool copy, bool hold) {
  DeviceScope scope(*api_, device_);
  Status st = scope.status();
  // Always behind out_ready, copy or not: after an agent error the agent
  // stream may still write the slot (it records out_ready after anything
  // it enqueued), and a wait on a never-recorded event passes at once.
  Status waited = st.isOk() ? out_[s.event]->streamWait(stream) : st;
  if (st.isOk()) st = waited;
  if (st.isOk() && copy && bytes > 0 && !s.resident) {  // resident: the result is in place
    copies_.fetch_add(1, std::memory_order_relaxed);
    st = api_->copyAsync(dst, slot(s.offset + result_at), bytes, stream);
  }
  if (hold && waited.isOk()) return st;  // retire() gives it back
  Status rec = waited.isOk() ? done_[s.event]->record(stream) : waited;
  std::lock_guard<std::mutex> lock(mu_);
  if (rec.isOk()) {
    retiring_.push_back(s);
  } else {  // cannot order the reuse: never reuse them
    leaked_ = true;
  }
  return st;
}

void SeamDeviceClient::retire(const Staged& s, void* stream) {
  DeviceScope scope(*api_, device_);
  Status rec = scope.status().isOk() ? done_[s.event]->record(stream) : scope.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (rec.isOk()) {
    retiring_.push_back(s);
  } else {
    leaked_ = true;
  }
}

template <typename Take>
StatusOr<DeviceClient::Staged> SeamDeviceClient::takeUntil(Take take, Clock::time_point deadline) {
  for (;;) {
    bool retry = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto t = take(&retry);
      if (t.isOk() || !retry) return t;
    }
    if (Clock::now() >= deadline) {
      return timedOut(
          "waited for device arena space or an event pair until the op timeout (KOLO_OP_TIMEOUT); "
          "the copies of earlier results are still queued on their streams");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

#include "device_client_resident.inc"

}  // namespace

std::unique_ptr<DeviceClient> DeviceClient::create() {
  return std::make_unique<SeamDeviceClient>();
}

}  // namespace kolo
