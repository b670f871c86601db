// Fuzzes the decoder of the requests that agents allgather during cross-agent
// negotiation (agent/cross/negotiation_state.h decodeRequests), and what the
// negotiation does with a peer's announcements (NegotiationState::complete).
// A peer agent of another build, a bug or a corrupted transport controls
// these bytes.
//
// Input: byte 0 = options, then the bytes of one agent's announcements.
// Checks: a decoded list re-encodes to bytes that decode to the same list;
// complete() over a two-agent job answers each name at most once and never
// crashes, whatever the peer sent.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "agent/cross/negotiation_state.h"
#include "common/log.h"
#include "fuzz/fuzz_util.h"

namespace {

bool sameRequest(const kolo::CrossRequest& a, const kolo::CrossRequest& b) {
  return a.name == b.name && std::memcmp(&a.params, &b.params, sizeof a.params) == 0 &&
         a.first_rank == b.first_rank && a.error == b.error;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kolo::fuzz::quietInit();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  uint8_t options = data[0];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  auto decoded = kolo::decodeRequests(bytes);
  if (decoded.isOk()) {
    std::string again = kolo::encodeRequests(*decoded);
    auto redecoded = kolo::decodeRequests(again);
    FUZZ_CHECK(redecoded.isOk());
    FUZZ_CHECK(redecoded->size() == decoded->size());
    for (size_t i = 0; i < decoded->size(); ++i) {
      FUZZ_CHECK(sameRequest((*decoded)[i], (*redecoded)[i]));
    }
  }

  // Agent `rank` of a two-agent job; the peer's announcements are the input.
  int rank = options & 1;
  kolo::NegotiationState state(rank, 2, /*cache_capacity=*/(options >> 1) & 7);
  if ((options & 0x10) != 0 && decoded.isOk()) {
    // This agent has the same names ready (so they can complete), possibly
    // with its own parameters.
    for (const kolo::CrossRequest& r : *decoded) {
      kolo::CrossRequest mine = r;
      if ((options & 0x20) != 0) mine.params.dtype ^= 1;
      mine.error.clear();
      state.addLocal(mine);
    }
  }
  for (int cycle = 0; cycle < 2; ++cycle) {
    std::vector<uint8_t> reduced = state.cacheVector();
    std::vector<std::string> gathered(2);
    gathered[rank] = state.hasUnannounced() ? state.takeAnnouncements() : std::string();
    gathered[1 - rank] = bytes;
    if ((options & 0x40) != 0) reduced.assign(reduced.size(), 1);  // a peer claims every bit
    std::vector<kolo::CrossResponse> out = state.complete(reduced, &gathered);
    std::set<std::string> names;
    for (const kolo::CrossResponse& r : out) {
      FUZZ_CHECK(names.insert(r.name).second);  // each name answered once per cycle
    }
  }
  return 0;
}
