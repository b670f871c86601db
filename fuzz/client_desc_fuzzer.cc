// Fuzzes the agent's check of descriptors that a trainer process writes into
// its submission ring (agent/ipc/client_conn.cc ClientConn::validate), and
// the parsing of ipc::ClientFrame control frames.
//
// Input: the first sizeof(SubmitDesc) bytes are the descriptor as the agent
// reads it from shared memory (a hostile client controls every byte); the
// rest is parsed as a ClientFrame. A descriptor that validate() accepts must
// describe memory inside the arena's data region and, for an allreduce, a
// shape whose size in bytes (computed without overflow) is data_bytes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/ipc/client_conn.h"
#include "common/dtype.h"
#include "common/ipc_layout.h"
#include "common/log.h"
#include "fuzz/fuzz_util.h"
#include "kolo/proto/ipc.pb.h"

namespace {

constexpr uint64_t kArenaBytes = 1 << 20;

kolo::ClientConn* conn() {
  static kolo::ClientConn* c = [] {
    auto* x = new kolo::ClientConn(1, kolo::UniqueFd(), 0, 0);
    kolo::Status st = x->createArena(kArenaBytes, "kolo-fuzz-arena");
    if (!st.isOk()) {
      std::fprintf(stderr, "createArena: %s\n", st.message().c_str());
      std::abort();
    }
    return x;
  }();
  return c;
}

void checkAccepted(const kolo::SubmitDesc& d) {
  kolo::ArenaLayout layout = kolo::ArenaLayout::compute(kArenaBytes);
  FUZZ_CHECK(d.name_len >= 1 && d.name_len <= kolo::kMaxNameBytes);
  FUZZ_CHECK(d.ndim <= kolo::kMaxDims);
  FUZZ_CHECK(!std::isnan(d.prescale) && !std::isnan(d.postscale));
  auto inside = [&](uint64_t off, uint64_t len) {
    if (len == 0) return true;
    unsigned __int128 end = static_cast<unsigned __int128>(off) + len;
    return off >= layout.data_offset && end <= layout.data_offset + layout.data_bytes;
  };
  FUZZ_CHECK(inside(d.data_offset, d.data_bytes));
  FUZZ_CHECK(inside(d.out_offset, d.out_bytes));
  if (d.collective == static_cast<uint8_t>(kolo::CollectiveType::kAllreduce)) {
    // The exact size in bytes, saturated just above 2^64 (never a uint64).
    constexpr unsigned __int128 kTooBig = (static_cast<unsigned __int128>(1) << 64) + 1;
    unsigned __int128 bytes = kolo::dataTypeSize(static_cast<kolo::DataType>(d.dtype));
    for (int i = 0; i < d.ndim; ++i) {
      FUZZ_CHECK(d.shape[i] >= 0);
      if (d.shape[i] == 0) {
        bytes = 0;
        break;
      }
      bytes *= static_cast<uint64_t>(d.shape[i]);  // < 2^65 * 2^63: no overflow
      if (bytes > kTooBig) bytes = kTooBig;
    }
    FUZZ_CHECK(bytes == d.data_bytes);  // shape and size agree, without wrap-around
    // Out of place: an output region as large as the input, not overlapping it.
    if (d.out_bytes > 0 && d.out_offset != d.data_offset) {
      FUZZ_CHECK(d.out_bytes == d.data_bytes);
      FUZZ_CHECK(d.out_offset >= d.data_offset + d.data_bytes || d.data_offset >= d.out_offset + d.out_bytes);
    }
  }
  // Touch the first and last byte of each region as the executor would.
  volatile char sink = 0;
  if (d.data_bytes > 0) {
    sink = sink + conn()->slot(d.data_offset)[0] + conn()->slot(d.data_offset)[d.data_bytes - 1];
  }
  if (d.out_bytes > 0) {
    sink = sink + conn()->slot(d.out_offset)[0] + conn()->slot(d.out_offset)[d.out_bytes - 1];
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kolo::fuzz::quietInit();
  conn();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kolo::SubmitDesc d;
  std::memset(&d, 0, sizeof d);
  size_t take = std::min(size, sizeof d);
  std::memcpy(&d, data, take);
  if (take == sizeof d) {
    kolo::Status st = conn()->validate(d);
    if (st.isOk()) {
      checkAccepted(d);
    } else {
      FUZZ_CHECK(!st.message().empty());
    }
  }
  kolo::ipc::ClientFrame frame;
  if (size > take && frame.ParseFromArray(data + take, static_cast<int>(size - take))) {
    std::string again;
    FUZZ_CHECK(frame.SerializeToString(&again));
  }
  return 0;
}
