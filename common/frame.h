// Length-prefixed frames on the agent's Unix socket:
//   [magic u32 = kFrameMagic][length u32][length bytes of protobuf]
// File descriptors travel with SCM_RIGHTS on the same sendmsg as the header.
// A frame with a bad magic, or longer than kMaxFrameBytes, poisons the
// connection: the receiver drops it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace google::protobuf {
class MessageLite;
}

namespace kolo {

constexpr uint32_t kFrameMagic = 0x464c4f4b;  // "KOLF" little endian
constexpr uint32_t kMaxFrameBytes = 64 * 1024;
constexpr int kMaxFdsPerFrame = 8;

// Pure decoder: feed bytes, pop whole frames. No I/O (unit-testable).
class FrameDecoder {
 public:
  // Appends bytes; returns an error (and stays poisoned) on a bad header.
  Status feed(const char* data, size_t len);
  // Pops the next complete payload, if any.
  bool next(std::string* payload);
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  Status poisoned_;
};

std::string encodeFrameHeader(uint32_t len);

// Sends one frame (blocking; retries on EINTR/partial writes).
Status sendFrame(int fd, const google::protobuf::MessageLite& msg, const std::vector<int>& fds = {});

// Reads what is available from a non-blocking socket into the decoder and
// collects any passed descriptors. Returns Unavailable on orderly EOF, and
// InvalidArgument when more than kMaxFdsPerFrame descriptors wait unclaimed.
// Stops after about `max_bytes` (setting *more), so that a peer that writes
// without pause cannot keep the reader in here or grow the decoder
// without bound; the caller reads again on its next wake-up.
Status readAvailable(int fd, FrameDecoder* dec, std::deque<UniqueFd>* fds,
                     size_t max_bytes = SIZE_MAX, bool* more = nullptr);

// Blocking receive of exactly one frame with a deadline (client side).
Status recvFrame(int fd, std::chrono::steady_clock::time_point deadline, FrameDecoder* dec,
                 std::deque<UniqueFd>* fds, std::string* payload);

}  // namespace kolo
