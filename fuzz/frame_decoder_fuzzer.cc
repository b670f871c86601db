// Fuzzes the agent socket's frame decoder (common/frame.h) and the parsing of
// each payload as an ipc::ClientFrame, the first thing the agent does with
// bytes from a trainer process.
//
// Input: byte 0 picks how the rest is cut into feed() calls (a socket
// delivers arbitrary pieces); the rest is the stream. Checked against a
// reference decoder: the payloads popped are a prefix of the reference's,
// all of them when the stream is well formed, and a malformed header
// poisons the decoder for good.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/log.h"
#include "fuzz/fuzz_util.h"
#include "kolo/proto/ipc.pb.h"

namespace {

struct Reference {
  std::vector<std::string> payloads;
  bool malformed = false;
};

Reference referenceDecode(const char* p, size_t n) {
  Reference r;
  size_t pos = 0;
  while (n - pos >= 8) {
    uint32_t magic = 0;
    uint32_t len = 0;
    std::memcpy(&magic, p + pos, 4);
    std::memcpy(&len, p + pos + 4, 4);
    if (magic != kolo::kFrameMagic || len > kolo::kMaxFrameBytes) {
      r.malformed = true;
      break;
    }
    if (n - pos - 8 < len) break;
    r.payloads.emplace_back(p + pos + 8, len);
    pos += 8 + len;
  }
  return r;
}

void parsePayload(const std::string& payload) {
  kolo::ipc::ClientFrame frame;
  if (!frame.ParseFromString(payload)) return;
  // What parsed must survive a round trip.
  std::string again;
  FUZZ_CHECK(frame.SerializeToString(&again));
  kolo::ipc::ClientFrame reparsed;
  FUZZ_CHECK(reparsed.ParseFromString(again));
  FUZZ_CHECK(reparsed.msg_case() == frame.msg_case());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kolo::fuzz::quietInit();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  unsigned cut = data[0];
  const char* stream = reinterpret_cast<const char*>(data + 1);
  size_t n = size - 1;
  Reference ref = referenceDecode(stream, n);

  kolo::FrameDecoder dec;
  std::vector<std::string> got;
  bool poisoned = false;
  size_t pos = 0;
  unsigned step = 0;
  while (pos < n) {
    // Piece sizes cycle through 1..(cut%31+1) and the occasional large one.
    size_t piece =
        (cut & 0x80) != 0 && step % 5 == 4 ? 4096 : 1 + (step * 7 + cut) % (cut % 31 + 1);
    piece = std::min(piece, n - pos);
    ++step;
    kolo::Status st = dec.feed(stream + pos, piece);
    pos += piece;
    if (!st.isOk()) {
      poisoned = true;
      FUZZ_CHECK(!dec.feed("x", 1).isOk());  // stays poisoned
      std::string payload;
      FUZZ_CHECK(!dec.next(&payload));
      break;
    }
    std::string payload;
    while (dec.next(&payload)) {
      FUZZ_CHECK(payload.size() <= kolo::kMaxFrameBytes);
      parsePayload(payload);
      got.push_back(payload);
    }
  }
  FUZZ_CHECK(got.size() <= ref.payloads.size());
  for (size_t i = 0; i < got.size(); ++i) FUZZ_CHECK(got[i] == ref.payloads[i]);
  FUZZ_CHECK(poisoned == ref.malformed);
  if (!ref.malformed) FUZZ_CHECK(got.size() == ref.payloads.size());
  // Payloads cut off with the poisoning still go through the parser.
  for (size_t i = got.size(); i < ref.payloads.size(); ++i) parsePayload(ref.payloads[i]);
  return 0;
}
