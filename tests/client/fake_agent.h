// A minimal in-process stand-in for kolo-agent, enough to test libkolo's
// side of the protocol: it listens on a Unix socket in a private temp dir,
// answers Hello with Welcome + a real memfd arena formatted like the agent
// formats it (ArenaHeader, both SPSC rings) + doorbell/completion eventfds,
// sends WorldInfo, and completes submissions (echo, or a test-given "reduce"
// applied in place) either at once or when the test says so.
// One client connection at a time; a new one is accepted after the previous
// one closes (re-init). Everything is torn down by the destructor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/frame.h"
#include "common/ipc_layout.h"
#include "common/shm.h"
#include "kolo/proto/ipc.pb.h"
#include "test_env.h"

namespace kolo::testing {

struct FakeAgentOptions {
  bool auto_complete = true;          // complete each submission as soon as it is read
  bool consume_submissions = true;    // false: never pop the submission ring
  int32_t welcome_code = 0;           // != 0: refuse the client
  std::string welcome_message;
  // The first `refusals` Hellos get a Refusal (as the real agent's when it is
  // out of descriptors) with this retry_after_ms, and the connection closes.
  int refusals = 0;
  int32_t refusal_retry_after_ms = 0;
  bool send_world = true;
  std::optional<std::pair<int32_t, std::string>> job_failed_instead_of_world;
  uint64_t default_arena_bytes = 16ull << 20;
  uint64_t max_bytes_in_flight = 0;   // Welcome.max_bytes_in_flight (0: none sent)
  ipc::WorldInfo world;               // defaults to rank 0 of 1
  // Applied to each submission's slot before completing it; null = echo.
  std::function<void(const SubmitDesc&, char* slot)> reduce;
};

class FakeAgent {
 public:
  explicit FakeAgent(FakeAgentOptions opts = {});
  ~FakeAgent();
  FakeAgent(const FakeAgent&) = delete;
  FakeAgent& operator=(const FakeAgent&) = delete;

  const std::string& socketPath() const { return socket_path_; }
  bool ok() const { return listening_; }

  // Bounded waits for what the client sent.
  bool waitForSubmissions(size_t n, std::chrono::milliseconds timeout);
  bool waitForHello(std::chrono::milliseconds timeout);
  bool waitForGoodbye(std::chrono::milliseconds timeout);
  std::vector<SubmitDesc> submissions() const;
  ipc::Hello lastHello() const;
  int connectionsAccepted() const;
  // A copy of `len` bytes at `offset` of the current arena, as the agent's
  // own mapping shows them (taken under the agent's lock, so that race
  // detectors see the order), and the data region's bounds (offsets).
  std::string readArena(uint64_t offset, size_t len) const;
  uint64_t dataOffset() const;
  uint64_t dataBytes() const;

  // Completes every submission read but not yet completed.
  void completeAll(int32_t code = 0, const std::string& message = "");
  void sendJobFailed(int32_t code, const std::string& message);
  // Closes the client's connection (as if the agent died).
  void dropConnection();

 private:
  struct Conn {
    UniqueFd sock;
    SharedRegion arena;
    UniqueFd doorbell;
    UniqueFd completion;
    SubmitRing submit;
    CompletionRing done;
    FrameDecoder decoder;
  };
  void run();
  void acceptOne();
  void serveReadable();
  void drainSubmissionsLocked();
  void completeLocked(const SubmitDesc& d, int32_t code, const std::string& message);
  void closeConnLocked();
  // Writes a frame and, once the arena exists, counts it in the header's
  // frames_sent as the agent does (libkolo reads its socket when it moves).
  void sendLocked(const google::protobuf::MessageLite& frame, const std::vector<int>& fds = {});

  FakeAgentOptions opts_;
  TempDir dir_;
  std::string socket_path_;
  bool listening_ = false;
  UniqueFd listen_fd_;
  UniqueFd stop_efd_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Conn> conn_;
  std::vector<SubmitDesc> received_;
  std::vector<SubmitDesc> held_;
  std::optional<ipc::Hello> hello_;
  int goodbyes_ = 0;
  int accepted_ = 0;
  int refused_ = 0;
};

}  // namespace kolo::testing
