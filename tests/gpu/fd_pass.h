// Test helpers: one message (fixed-size bytes) plus at most one fd over a
// Unix socket with SCM_RIGHTS, as the agent passes arenas to its clients;
// bounded waits.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace kolo::gpu::testing {

inline Status sendWithFd(int sock, const void* data, size_t len, int fd) {
  msghdr msg = {};
  iovec iov = {const_cast<void*>(data), len};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(len)) return errnoStatus("sendmsg", errno);
  return okStatus();
}

// Receives one message of exactly `len` bytes (SOCK_SEQPACKET) and the fd
// that came with it, if any; TimedOut after `timeout`.
inline Status recvWithFd(int sock, void* data, size_t len, UniqueFd* fd,
                         std::chrono::milliseconds timeout) {
  pollfd p = {sock, POLLIN, 0};
  const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (r == 0) return timedOut("no message within " + std::to_string(timeout.count()) + " ms");
  if (r < 0) return errnoStatus("poll", errno);
  msghdr msg = {};
  iovec iov = {data, len};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return errnoStatus("recvmsg", errno);
  if (n == 0) return unavailable("peer closed the socket");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd != nullptr) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c), sizeof(int));
      fd->reset(got);
    }
  }
  if (static_cast<size_t>(n) != len)
    return internalError("short message: " + std::to_string(n) + " of " + std::to_string(len));
  return okStatus();
}

}  // namespace kolo::gpu::testing
