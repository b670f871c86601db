#include "common/tcp_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/fd.h"

namespace kolo {

int tcpConnectError(const std::string& address, std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return EINVAL;
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr)
    return EHOSTUNREACH;
  int err = ETIMEDOUT;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    UniqueFd fd(
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
      err = 0;
      break;
    }
    if (errno != EINPROGRESS) {
      err = errno;
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
      err = ETIMEDOUT;
      continue;
    }
    int so = 0;
    socklen_t len = sizeof so;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len);
    err = so;
    if (err == 0) break;
  }
  ::freeaddrinfo(res);
  return err;
}

}  // namespace kolo
