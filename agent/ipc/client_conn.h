// One connected trainer process: its socket, its shared arena (memfd),
// its rings and eventfds. Owned by the agent loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "agent/core/cross_memory.h"
#include "agent/core/device_runtime.h"
#include "common/fd.h"
#include "common/frame.h"
#include "common/ipc_layout.h"
#include "common/shm.h"
#include "common/status.h"

namespace google::protobuf {
class MessageLite;
}

namespace kolo {

class Job;

class ClientConn {
 public:
  ClientConn(uint64_t id, UniqueFd sock, pid_t pid, uid_t uid)
      : id_(id), sock_(std::move(sock)), pid_(pid), uid_(uid) {}

  uint64_t id() const { return id_; }
  int socketFd() const { return sock_.get(); }
  pid_t pid() const { return pid_; }
  uid_t uid() const { return uid_; }
  FrameDecoder& decoder() { return decoder_; }
  std::deque<UniqueFd>& receivedFds() { return received_fds_; }

  // Creates the arena and eventfds (on admission). Returns the fds to pass.
  Status createArena(uint64_t bytes, const std::string& label);
  bool hasArena() const { return arena_ != nullptr; }
  const std::shared_ptr<SharedRegion>& arena() const { return arena_; }
  uint64_t arenaBytes() const { return arena_ ? arena_->size() : 0; }
  // Its shared arena plus its device arena, if granted: the default of its
  // bytes quota (agent/ipc/limits.h).
  uint64_t allArenasBytes() const;
  int doorbellFd() const { return doorbell_.get(); }
  int completionFd() const { return completion_.get(); }

  // Validates a descriptor read from the ring against this arena.
  Status validate(const SubmitDesc& d) const;
  // The direct path's part of validate() (kSubmitFlagUserMemory).
  Status validateDirect(const SubmitDesc& d) const;
  // Pointer to a slot inside the arena (validated first).
  char* slot(uint64_t offset) const { return arena_->data() + offset; }
  // Whether [offset, +len) lies in the arena's data region.
  bool inData(uint64_t offset, uint64_t len) const;
  // Where the header of an allgather / alltoall (`bytes`: the int64 list or
  // matrix) is: ahead of the output region, or, for a device op, at
  // meta_offset in this arena (ipc_layout.h). nullptr when it is not inside
  // the arena's data region.
  const char* metaOf(const SubmitDesc& d, uint64_t bytes) const;

  // The rings keep their capacity and this side's index in agent memory
  // (common/spsc_ring.h). A trainer that moved the other index out of
  // bounds broke its rings: nothing more is read from or written to them,
  // ringError() says what was seen, and on_broken_ring runs once (the agent
  // then closes the connection and fails the trainer's job).
  bool popSubmission(SubmitDesc* out);
  bool hasSubmissions() const { return !broken() && !submit_.empty(); }
  bool broken() const { return submit_.corrupt() || completions_.corrupt(); }
  std::string ringError() const;
  std::function<void()> on_broken_ring;
  void clearDoorbell();
  // Queues a completion; it is written to the ring now or when there is room
  // (dropped once the ring is broken).
  void complete(uint64_t handle, const Status& st, int64_t aux = 0, uint64_t out_offset = 0,
                uint64_t out_bytes = 0);
  // Retries completions that did not fit; returns true if some remain.
  bool flushCompletions();
  // Writes the completion eventfd if the trainer sleeps waiting for it
  // (ArenaHeader::client_waiting; call after the completion's push).
  void signalClient();
  // ArenaHeader::agent_polling: whether the trainer may skip the doorbell
  // (loop thread; the caller fences before its last look at the rings).
  void setAgentPolling(bool polling);

  Status send(const google::protobuf::MessageLite& frame, const std::vector<int>& fds = {});

  // Job membership (set on admission).
  std::string job_id;
  int local_rank = -1;
  int32_t own_pid = 0;  // Hello.pid: the trainer's pid in its own PID namespace
  bool said_goodbye = false;
  uint64_t world_sent = 0;  // generation of the last WorldInfo sent
  uint64_t submitted = 0;
  uint64_t completed = 0;
  // Device path (docs/gpu.md): the grant, or why there is none when the
  // trainer asked for one (device_error; empty: it did not ask).
  std::shared_ptr<DeviceGrant> device;
  std::string device_error;
  // The peer's gid (SO_PEERCRED) and pidfd (SO_PEERPIDFD), taken at accept.
  gid_t gid = 0;
  UniqueFd peer_pidfd;
  // Direct user memory (docs/architecture.md): > 0 once the agent bound the
  // trainer's process (agent/core/cross_memory.h) and read its probe at
  // admission; descriptors with kSubmitFlagUserMemory are refused otherwise.
  uint64_t direct_min_bytes = 0;
  std::shared_ptr<const TrainerProcess> direct_proc;
  // Streamed copy-in (ipc_layout.h kSubmitFlagStreamed): > 0 once the
  // Welcome allowed it, from this many bytes; descriptors with the flag are
  // refused otherwise.
  uint64_t streamed_min_bytes = 0;
  // Split reduction (ipc_layout.h kSubmitFlagSplit): > 0 once the Welcome
  // allowed it, from this many bytes.
  uint64_t split_min_bytes = 0;
  // Bounds (agent/ipc/limits.h): when the connection was accepted (the
  // handshake timeout), and the collectives this rank has in flight
  // (handle -> payload bytes), counted against its quotas.
  std::chrono::steady_clock::time_point accepted_at = std::chrono::steady_clock::now();
  std::unordered_map<uint64_t, uint64_t> in_flight;
  uint64_t bytes_in_flight = 0;
  uint64_t table_cost =
      0;  // what each of its names in flight costs its uid's table quota (tableBytesPerName)
  // Completions that did not fit the completion ring (the trainer has not
  // read it). The agent takes no new submission from a trainer with
  // kMaxCompletionBacklog of them, so one that never reads its completions
  // costs the agent a bounded amount of memory (docs/security.md).
  static constexpr size_t kMaxCompletionBacklog = 8192;
  size_t completionBacklog() const { return overflow_.size(); }
  bool backlogFull() const { return overflow_.size() >= kMaxCompletionBacklog; }
  bool backlog_retry_armed = false;  // a timer retries the flush and the ring

 private:
  uint64_t id_;
  UniqueFd sock_;
  pid_t pid_;
  uid_t uid_;
  FrameDecoder decoder_;
  std::deque<UniqueFd> received_fds_;
  std::shared_ptr<SharedRegion> arena_;
  UniqueFd doorbell_;
  UniqueFd completion_;
  SubmitRing submit_;
  CompletionRing completions_;
  std::deque<CompletionDesc> overflow_;
  bool broken_reported_ = false;
  void checkRings();
  ArenaHeader* header() const;
};

}  // namespace kolo
