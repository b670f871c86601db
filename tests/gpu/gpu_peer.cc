// kolo_gpu_test_peer <socket-fd>: the "trainer" side of vmm_test.cc, a
// separate process (exec'd, so it starts with a fresh CUDA state). Receives
// an ArenaOffer and the arena fd over the socket, imports and maps the arena
// and does what the mode says.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/gpu/batched_copy.h"
#include "agent/gpu/device.h"
#include "agent/gpu/vmm_arena.h"
#include "tests/gpu/fd_pass.h"
#include "tests/gpu/vmm_protocol.h"

using namespace kolo;
using namespace kolo::gpu;
using namespace kolo::gpu::testing;

namespace {

void reply(int sock, const Status& s) {
  PeerReply r = {};
  r.ok = s.isOk() ? 1 : 0;
  std::snprintf(r.error, sizeof(r.error), "%s", s.toString().c_str());
  (void)sendWithFd(sock, &r, sizeof(r), -1);
}

Status run(int sock) {
  ArenaOffer offer = {};
  UniqueFd fd;
  RETURN_IF_ERROR(recvWithFd(sock, &offer, sizeof(offer), &fd, std::chrono::seconds(60)));
  if (!fd.valid()) return internalError("no fd came with the offer");
  ASSIGN_OR_RETURN(auto arena, ImportedDeviceArena::import(fd.get(), offer.bytes, offer.device));
  fd.reset();  // the mapping keeps the memory alive
  if (offer.mode == PeerMode::kDieMapped) {
    reply(sock, okStatus());
    std::_Exit(3);  // no unmap, no context teardown
  }
  ASSIGN_OR_RETURN(auto ready, InterprocessEvent::open(offer.ready));
  ASSIGN_OR_RETURN(auto stream, Stream::create());
  RETURN_IF_ERROR(ready.streamWait(stream.get()));
  char* base = static_cast<char*>(arena->data());
  const size_t half = arena->size() / 2;
  ASSIGN_OR_RETURN(int launches, batchedCopy({{base, base + half, half}}, stream.get()));
  (void)launches;
  RETURN_IF_ERROR(stream.synchronize(60000));
  return okStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <socket-fd>\n", argv[0]);
    return 2;
  }
  const int sock = std::atoi(argv[1]);
  Status s = run(sock);
  reply(sock, s);
  return s.isOk() ? 0 : 1;
}
