// What the VMM test sends its peer process (kolo_gpu_test_peer) with the
// arena fd, and what the peer answers.
#pragma once

#include <cstddef>

#include "agent/gpu/device.h"

namespace kolo::gpu::testing {

enum class PeerMode : int {
  // Import, wait (on the device) for the agent's event, copy the first half
  // of the arena onto the second half with the batched copy kernel, answer.
  kCopyAfterEvent = 1,
  // Import and map, answer, then die without unmapping anything.
  kDieMapped = 2,
};

struct ArenaOffer {
  PeerMode mode;
  int device;
  size_t bytes;
  IpcEventHandleBytes ready;  // recorded by the agent after its writes
};

struct PeerReply {
  int ok;              // 1 = done
  char error[240];     // Status text otherwise
};

}  // namespace kolo::gpu::testing
