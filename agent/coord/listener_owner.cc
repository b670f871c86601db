#include "agent/coord/listener_owner.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace kolo {

namespace {

// /proc/net/tcp prints each address as the bytes in memory order, read as
// 32-bit host-order words in hex: for IPv4 one word, for IPv6 four.
std::string procHex(const unsigned char* bytes, size_t n) {
  std::string out;
  char buf[9];
  for (size_t w = 0; w < n; w += 4) {
    uint32_t v;
    std::memcpy(&v, bytes + w, 4);
    std::snprintf(buf, sizeof buf, "%08X", v);
    out += buf;
  }
  return out;
}

struct Target {
  std::string v4, v6;  // procHex of the address in each family ("" when none)
};

std::optional<Target> targetOf(std::string host) {
  if (host == "localhost") host = "127.0.0.1";
  Target t;
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    t.v4 = procHex(reinterpret_cast<unsigned char*>(&a4), 4);
    // An IPv4 client also reaches a socket bound to ::ffff:a.b.c.d or ::.
    unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    std::memcpy(mapped + 12, &a4, 4);
    t.v6 = procHex(mapped, 16);
  } else if (::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    t.v6 = procHex(reinterpret_cast<unsigned char*>(&a6), 16);
  } else {
    return std::nullopt;
  }
  return t;
}

std::optional<uid_t> scan(const std::string& path, const std::string& want, size_t hex_len,
                          int port) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  const std::string any(hex_len, '0');
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state, queues, timer, retr;
    unsigned long uid = 0;
    if (!(f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid)) continue;
    if (state != "0A") continue;  // LISTEN
    size_t colon = local.find(':');
    if (colon != hex_len) continue;
    if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
    std::string addr = local.substr(0, colon);
    if (addr == want || addr == any) return static_cast<uid_t>(uid);
  }
  return std::nullopt;
}

}  // namespace

std::optional<uid_t> localListenerUid(const std::string& host, int port,
                                      const std::string& proc_net) {
  auto t = targetOf(host);
  if (!t) return std::nullopt;
  if (!t->v4.empty()) {
    if (auto u = scan(proc_net + "/tcp", t->v4, 8, port)) return u;
  }
  if (!t->v6.empty()) return scan(proc_net + "/tcp6", t->v6, 32, port);
  return std::nullopt;
}

Status checkPlainCoordinator(const std::string& address, int64_t allowed_uid,
                             const std::string& proc_net) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return okStatus();
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (...) {
    return okStatus();
  }
  auto owner = localListenerUid(host, port, proc_net);
  if (!owner) return okStatus();
  const uid_t me = ::geteuid();
  if (*owner == 0 || *owner == me ||
      (allowed_uid >= 0 && *owner == static_cast<uid_t>(allowed_uid))) {
    return okStatus();
  }
  return permissionDenied(
      "the coordinator address " + address + " is served by a process of uid " +
      std::to_string(*owner) + ", not root's, this agent's (uid " + std::to_string(me) +
      ") or --coordinator-uid's" +
      (allowed_uid >= 0 ? " (" + std::to_string(allowed_uid) + ")" : std::string()) +
      ": the agent sends it nothing over plain text (another user may have taken the port while "
      "the "
      "coordinator was down); give --coordinator-uid for a coordinator running as its own user, or "
      "use TLS "
      "(--coordinator-ca)");
}

}  // namespace kolo
