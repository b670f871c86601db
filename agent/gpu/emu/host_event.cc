#include "agent/gpu/emu/host_event.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "agent/gpu/emu/host_faults.h"
#include "agent/gpu/emu/host_stream.h"

namespace kolo::gpu::emu {

namespace {

constexpr uint32_t kSlots = 16384;
constexpr char kMagic[8] = {'k', 'o', 'l', 'o', '-', 'e', 'm', 'u'};

struct Slot {
  std::atomic<uint64_t> recorded;
  std::atomic<uint64_t> completed;
  uint64_t pad[2];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct TableHeader {
  uint64_t id;
  uint64_t pad[3];
};

struct Handle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t table_id;
  uint32_t slot;
};
static_assert(sizeof(Handle) <= kIpcEventHandleBytes);

constexpr size_t kTableBytes = sizeof(TableHeader) + kSlots * sizeof(Slot);

// One mapped table: this process's own (with its free list) or a peer's.
struct Table {
  uint64_t id = 0;
  int fd = -1;  // own table only
  char* base = nullptr;
  Slot* slot(uint32_t i) const { return reinterpret_cast<Slot*>(base + sizeof(TableHeader)) + i; }
};

struct Tables {
  std::mutex mu;
  Table own;
  std::vector<uint32_t> free;
  std::map<uint64_t, Table> peers;  // by table id, mapped until exit
};

Tables& tables() {
  static Tables* t = new Tables;  // used until exit
  return *t;
}

Status ownTableLocked(Tables& t) {
  if (t.own.base != nullptr) return okStatus();
  int fd = ::memfd_create("kolo-emu-events", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, kTableBytes) != 0)
    return internalError("memfd for emulated events failed");
  void* p = ::mmap(nullptr, kTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return internalError("mmap of the emulated event table failed");
  t.own.fd = fd;
  t.own.base = static_cast<char*>(p);
  t.own.id = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
  reinterpret_cast<TableHeader*>(p)->id = t.own.id;
  for (uint32_t i = kSlots; i > 0; --i) t.free.push_back(i - 1);
  return okStatus();
}

class HostEvent final : public DevEvent {
 public:
  HostEvent(Slot* s, bool ipc, bool own, uint32_t index)
      : s_(s), ipc_(ipc), own_(own), index_(index) {}
  ~HostEvent() override {
    if (!own_) return;
    Tables& t = tables();
    std::lock_guard<std::mutex> lock(t.mu);
    t.free.push_back(index_);
  }

  Status record(void* stream) override {
    RETURN_IF_ERROR(stickyError());
    if (faults().fail_record) return injectedRecordFailure();
    const uint64_t n = s_->recorded.fetch_add(1) + 1;
    if (faults().hang_events) return okStatus();  // never completes
    Slot* s = s_;
    HostStream::of(stream)->enqueue([s, n](const std::atomic<bool>&) {
      uint64_t cur = s->completed.load();
      while (cur < n && !s->completed.compare_exchange_weak(cur, n)) {
      }
    });
    return okStatus();
  }

  Status query() override {
    RETURN_IF_ERROR(stickyError());
    if (s_->completed.load() >= s_->recorded.load()) return okStatus();
    return Status(Code::kInProgress, "emulated device event pending");
  }

  Status streamWait(void* stream) override {
    RETURN_IF_ERROR(stickyError());
    const uint64_t target = s_->recorded.load();  // captured at enqueue time
    if (target == 0) return okStatus();
    Slot* s = s_;
    HostStream::of(stream)->enqueue([s, target](const std::atomic<bool>& stop) {
      while (s->completed.load() < target && !stop.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    return okStatus();
  }

  StatusOr<IpcEventBytes> exportHandle() override {
    if (!ipc_ || !own_) return internalError("exporting an event that is not interprocess");
    Handle h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.pid = static_cast<int32_t>(::getpid());
    Tables& t = tables();
    {
      std::lock_guard<std::mutex> lock(t.mu);
      h.fd = t.own.fd;
      h.table_id = t.own.id;
    }
    h.slot = index_;
    IpcEventBytes out{};
    std::memcpy(out.data(), &h, sizeof h);
    return out;
  }

 private:
  Slot* s_;
  bool ipc_;
  bool own_;
  uint32_t index_;
};

StatusOr<Table> mapPeerLocked(Tables& t, const Handle& h) {
  auto it = t.peers.find(h.table_id);
  if (it != t.peers.end()) return it->second;
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return invalidArgument(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle: the emulated event table of "
        "process " +
        std::to_string(h.pid) + " cannot be opened (" + std::strerror(errno) + ")");
  }
  void* p = ::mmap(nullptr, kTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return internalError("mmap of a peer's emulated event table failed");
  Table tab;
  tab.base = static_cast<char*>(p);
  tab.id = reinterpret_cast<TableHeader*>(p)->id;
  if (tab.id != h.table_id) {
    ::munmap(p, kTableBytes);
    return invalidArgument(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle: a stale emulated event "
        "handle (process " +
        std::to_string(h.pid) + " is gone)");
  }
  t.peers[tab.id] = tab;
  return tab;
}

}  // namespace

StatusOr<std::unique_ptr<DevEvent>> createHostEvent(bool interprocess) {
  RETURN_IF_ERROR(stickyError());
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  RETURN_IF_ERROR(ownTableLocked(t));
  if (t.free.empty())
    return unavailable("cudaEventCreate: cudaErrorMemoryAllocation: emulated events exhausted");
  const uint32_t i = t.free.back();
  t.free.pop_back();
  // Counters stay monotonic across reuse: a task of the slot's previous
  // event still queued cannot complete the new one's records.
  Slot* s = t.own.slot(i);
  return std::unique_ptr<DevEvent>(std::make_unique<HostEvent>(s, interprocess, true, i));
}

StatusOr<std::unique_ptr<DevEvent>> openHostEvent(const IpcEventBytes& bytes) {
  RETURN_IF_ERROR(stickyError());
  Handle h{};
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.slot >= kSlots) {
    return invalidArgument(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle: not an emulated event handle");
  }
  if (h.pid == static_cast<int32_t>(::getpid())) {
    return invalidArgument(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle: a process cannot open its own "
        "event handle");
  }
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  ASSIGN_OR_RETURN(Table tab, mapPeerLocked(t, h));
  return std::unique_ptr<DevEvent>(
      std::make_unique<HostEvent>(tab.slot(h.slot), true, false, h.slot));
}

}  // namespace kolo::gpu::emu
