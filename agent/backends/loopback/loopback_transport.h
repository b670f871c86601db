// The loopback transport: ranks that are backends of one process exchange
// messages through a shared in-memory hub, so the point-to-point engine and
// the collective algorithms (collective.cc) run without sockets or UCX,
// in unit tests (tests/backend/loopback_test.cc). Not a backend the agent
// offers (createBackend does not know it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"

namespace kolo {

// The ranks' mailboxes. Thread-safe: each rank's progress thread delivers
// into the others' and takes its own.
class LoopbackHub {
 public:
  struct Message {
    uint64_t seq = 0;
    int src = 0;
    uint32_t step = 0;
    uint32_t chunk = 0;
    std::vector<std::byte> data;
  };

  explicit LoopbackHub(int size) : mail_(size), wake_(size, -1) {}
  int size() const { return static_cast<int>(mail_.size()); }

  // `wake_fd` (an eventfd) is written whenever mail arrives for `rank`.
  void attach(int rank, int wake_fd);
  void detach(int rank);
  void deliver(int dst, Message m);
  std::deque<Message> take(int rank);
  bool hasMail(int rank) const;

 private:
  void wakeLocked(int rank) const;

  mutable std::mutex mu_;
  std::vector<std::deque<Message>> mail_;
  std::vector<int> wake_;
};

struct LoopbackTransportOptions {
  std::shared_ptr<LoopbackHub> hub;  // shared by every rank of the group; its size is the group's
};

// A backend over the loopback transport (the P2pBackend engine, as tcp and
// ucx use it); `kv` is not used. Blocking until every rank of the hub has
// started (one barrier), as the other factories.
StatusOr<std::unique_ptr<Backend>> createLoopbackBackend(const BackendOptions& options, KvStore& kv,
                                                         LoopbackTransportOptions transport);

}  // namespace kolo
