// The NCCL emulation's loopback transport (emu_wire.h).
#include "agent/backends/nccl/emu/emu_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace kolo::nccl::emu {
namespace {

constexpr int kSliceMs = 20;

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

void tune(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Waits for `events` on fd in one slice: >0 ready, 0 not yet, <0 error.
int waitFd(int fd, short events) {
  pollfd p{fd, events, 0};
  const int r = ::poll(&p, 1, kSliceMs);
  if (r < 0 && errno != EINTR) return -1;
  return r > 0 ? 1 : 0;
}

Status closedBy(int peer) {
  return peerFailure("remote process exited or there was a network error (rank " +
                     std::to_string(peer) + "'s connection closed)");
}

// One direction of one peer: a queue of frames (8-byte size, then the data).
struct Lane {
  std::vector<Transfer> q;
  size_t idx = 0;
  size_t done = 0;  // bytes of the current frame, header included
  uint64_t header = 0;
  bool pending() const { return idx < q.size(); }
  void next() { ++idx, done = 0; }
};

// Moves as much of the lane's current frame as the socket takes now.
Status progressSend(int fd, int peer, Lane& l) {
  while (l.pending()) {
    const Transfer& t = l.q[l.idx];
    l.header = t.bytes;
    const bool in_header = l.done < sizeof(l.header);
    const char* p = in_header ? reinterpret_cast<const char*>(&l.header) + l.done
                              : static_cast<const char*>(t.data) + (l.done - sizeof(l.header));
    const size_t left = in_header ? sizeof(l.header) - l.done : t.bytes + sizeof(l.header) - l.done;
    if (left == 0) {
      l.next();
      continue;
    }
    const ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return okStatus();
      return closedBy(peer);
    }
    l.done += static_cast<size_t>(n);
  }
  return okStatus();
}

Status progressRecv(int fd, int peer, Lane& l) {
  while (l.pending()) {
    const Transfer& t = l.q[l.idx];
    const bool in_header = l.done < sizeof(l.header);
    char* p = in_header ? reinterpret_cast<char*>(&l.header) + l.done
                        : static_cast<char*>(t.data) + (l.done - sizeof(l.header));
    const size_t left = in_header ? sizeof(l.header) - l.done : t.bytes + sizeof(l.header) - l.done;
    if (!in_header && l.header != t.bytes) {
      return peerFailure("rank " + std::to_string(peer) + " sent " + std::to_string(l.header) +
                         " bytes where " + std::to_string(t.bytes) +
                         " were expected (the ranks posted different collectives)");
    }
    if (left == 0) {
      l.next();
      continue;
    }
    const ssize_t n = ::recv(fd, p, left, 0);
    if (n == 0) return closedBy(peer);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return okStatus();
      return closedBy(peer);
    }
    l.done += static_cast<size_t>(n);
  }
  return okStatus();
}

Status copySelf(int me, const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs) {
  std::vector<const Transfer*> s, r;
  for (const Transfer& t : sends)
    if (t.peer == me) s.push_back(&t);
  for (const Transfer& t : recvs)
    if (t.peer == me) r.push_back(&t);
  if (s.size() != r.size()) return invalidArgument("a send to self without its receive (or back)");
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i]->bytes != r[i]->bytes)
      return invalidArgument("send and receive to self differ in size");
    if (s[i]->bytes > 0 && s[i]->data != r[i]->data)
      std::memmove(r[i]->data, s[i]->data, s[i]->bytes);
  }
  return okStatus();
}

}  // namespace

StatusOr<UniqueFd> listenLoopback(uint16_t* port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return errnoStatus("socket", errno);
  sockaddr_in a = loopback(0);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return errnoStatus("bind 127.0.0.1", errno);
  if (::listen(fd.get(), 64) != 0) return errnoStatus("listen", errno);
  socklen_t len = sizeof(a);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return errnoStatus("getsockname", errno);
  *port = ntohs(a.sin_port);
  return fd;
}

StatusOr<UniqueFd> connectLoopback(uint16_t port, const Cancelled& cancelled) {
  for (;;) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return errnoStatus("socket", errno);
    sockaddr_in a = loopback(port);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      tune(fd.get());
      return fd;
    }
    if (errno != ECONNREFUSED && errno != EINTR)
      return errnoStatus("connect 127.0.0.1:" + std::to_string(port), errno);
    if (cancelled()) return aborted("cancelled while connecting");
    std::this_thread::sleep_for(std::chrono::milliseconds(kSliceMs));
  }
}

StatusOr<UniqueFd> acceptOne(int listen_fd, const Cancelled& cancelled) {
  for (;;) {
    const int r = waitFd(listen_fd, POLLIN);
    if (r < 0) return errnoStatus("poll", errno);
    if (r > 0) {
      UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (fd.get() >= 0) {
        tune(fd.get());
        return fd;
      }
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        return errnoStatus("accept", errno);
    }
    if (cancelled()) return aborted("cancelled while accepting");
  }
}

Status sendAll(int fd, const void* p, size_t n, const Cancelled& cancelled) {
  Lane l;
  l.q.push_back(Transfer{0, const_cast<void*>(p), n});
  l.done = sizeof(l.header);  // raw bytes, no frame header
  while (l.pending()) {
    RETURN_IF_ERROR(progressSend(fd, 0, l));
    if (!l.pending()) break;
    if (cancelled()) return aborted("cancelled");
    if (waitFd(fd, POLLOUT) < 0) return errnoStatus("poll", errno);
  }
  return okStatus();
}

Status recvAll(int fd, void* p, size_t n, const Cancelled& cancelled) {
  Lane l;
  l.q.push_back(Transfer{0, p, n});
  l.done = sizeof(l.header);
  l.header = n;
  while (l.pending()) {
    RETURN_IF_ERROR(progressRecv(fd, 0, l));
    if (!l.pending()) break;
    if (cancelled()) return aborted("cancelled");
    if (waitFd(fd, POLLIN) < 0) return errnoStatus("poll", errno);
  }
  return okStatus();
}

Status exchange(const std::vector<int>& fds, int me, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& recvs, const Cancelled& cancelled) {
  RETURN_IF_ERROR(copySelf(me, sends, recvs));
  const int n = static_cast<int>(fds.size());
  std::vector<Lane> out(n), in(n);
  for (const Transfer& t : sends)
    if (t.peer != me) out[t.peer].q.push_back(t);
  for (const Transfer& t : recvs)
    if (t.peer != me) in[t.peer].q.push_back(t);
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<int> peers;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      RETURN_IF_ERROR(progressSend(fds[p], p, out[p]));
      RETURN_IF_ERROR(progressRecv(fds[p], p, in[p]));
      short ev = 0;
      if (out[p].pending()) ev |= POLLOUT;
      if (in[p].pending()) ev |= POLLIN;
      if (ev != 0) {
        pfds.push_back(pollfd{fds[p], ev, 0});
        peers.push_back(p);
      }
    }
    if (pfds.empty()) return okStatus();
    if (cancelled()) return aborted("cancelled");
    if (::poll(pfds.data(), pfds.size(), kSliceMs) < 0 && errno != EINTR)
      return errnoStatus("poll", errno);
    for (size_t i = 0; i < pfds.size(); ++i) {
      // A hang-up with nothing left to read is the peer gone.
      if ((pfds[i].revents & (POLLERR | POLLHUP)) != 0 && (pfds[i].revents & POLLIN) == 0)
        return closedBy(peers[i]);
    }
  }
}

}  // namespace kolo::nccl::emu
