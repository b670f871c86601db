// The NCCL emulation's transport (docs/gpu.md, "The NCCL emulation"): TCP
// over loopback between the ranks of one emulated communicator, a full
// mesh of connections set up at init; every collective is compiled into
// point-to-point transfers that progress together (poll), framed with their
// size so a mismatch between the ranks is an error, not garbage. Every wait
// polls in short slices and gives up when `cancelled()` says so (the
// communicator aborted, the stream destroyed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace kolo::nccl::emu {

using Cancelled = std::function<bool()>;

// A listening socket on 127.0.0.1, any port.
StatusOr<UniqueFd> listenLoopback(uint16_t* port);
// Connects to 127.0.0.1:port; retries refused connections until cancelled.
StatusOr<UniqueFd> connectLoopback(uint16_t port, const Cancelled& cancelled);
// Accepts one connection; waits until cancelled.
StatusOr<UniqueFd> acceptOne(int listen_fd, const Cancelled& cancelled);
// Whole buffers, blocking in slices until done, cancelled or the peer gone.
Status sendAll(int fd, const void* p, size_t n, const Cancelled& cancelled);
Status recvAll(int fd, void* p, size_t n, const Cancelled& cancelled);

struct Transfer {
  int peer;
  void* data;  // const for sends
  size_t bytes;
};

// Runs every send and receive to completion together; per peer in the order
// given (the other side lists them in the same order). fds[peer] is the
// connection to that peer (-1 for `me`: transfers to self are matched in
// order and copied). PeerFailure naming the peer when it closed or the sizes
// disagree; Aborted when cancelled.
Status exchange(const std::vector<int>& fds, int me, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& recvs, const Cancelled& cancelled);

}  // namespace kolo::nccl::emu
