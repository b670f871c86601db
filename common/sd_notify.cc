#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/fd.h"

namespace kolo {

namespace {

std::string_view notifySocketFromEnv() {
  const char* s = std::getenv("NOTIFY_SOCKET");
  return s == nullptr ? std::string_view() : std::string_view(s);
}

// "STATUS=" followed by `status` on one line.
std::string statusLine(std::string_view status) {
  std::string line = "STATUS=";
  for (char c : status) line += (c == '\n' || c == '\r') ? ' ' : c;
  return line;
}

std::string withStatus(std::string_view head, std::string_view status) {
  std::string msg(head);
  if (!status.empty()) {
    msg += '\n';
    msg += statusLine(status);
  }
  return msg;
}

}  // namespace

bool sdNotifyEnabled() { return !notifySocketFromEnv().empty(); }

Status sdNotifyTo(std::string_view address, std::string_view state) {
  if (address.empty()) return invalidArgument("sd_notify: empty socket address");
  if (address.front() != '/' && address.front() != '@') {
    // systemd also knows vsock: addresses (VMs); kolo daemons never run that way.
    return invalidArgument("sd_notify: unsupported NOTIFY_SOCKET '" + std::string(address) +
                           "' (expected an absolute path or '@abstract')");
  }
  sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (address.size() > sizeof(addr.sun_path) - 1) {
    return invalidArgument("sd_notify: socket address too long (" +
                           std::to_string(address.size()) + " bytes): " + std::string(address));
  }
  std::memcpy(addr.sun_path, address.data(), address.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  if (address.front() == '@') {
    addr.sun_path[0] = '\0';  // abstract namespace: no terminating NUL, exact length
  } else {
    len += 1;  // include the terminating NUL of a path
  }

  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoStatus("sd_notify: socket", errno);
  ssize_t n;
  do {
    n = ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&addr), len);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errnoStatus("sd_notify: send to " + std::string(address), errno);
  if (static_cast<size_t>(n) != state.size()) {
    return internalError("sd_notify: short datagram to " + std::string(address));
  }
  return okStatus();
}

Status sdNotify(std::string_view state) {
  std::string_view address = notifySocketFromEnv();
  if (address.empty()) return okStatus();
  return sdNotifyTo(address, state);
}

Status sdNotifyReady(std::string_view status) { return sdNotify(withStatus("READY=1", status)); }

Status sdNotifyStopping(std::string_view status) {
  return sdNotify(withStatus("STOPPING=1", status));
}

Status sdNotifyStatus(std::string_view status) { return sdNotify(statusLine(status)); }

}  // namespace kolo
