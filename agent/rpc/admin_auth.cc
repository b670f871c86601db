#include "agent/rpc/admin_auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace kolo {

namespace {

// "%5B" -> "[" and "%5D" -> "]" (newer gRPC escapes the brackets).
std::string unescapeBrackets(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      std::string_view h = s.substr(i + 1, 2);
      if (h == "5B" || h == "5b") {
        out += '[';
        i += 2;
        continue;
      }
      if (h == "5D" || h == "5d") {
        out += ']';
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

bool ipv4Loopback(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  return (ntohl(a.s_addr) >> 24) == 127;
}

}  // namespace

bool isLoopbackPeer(std::string_view peer) {
  if (peer.rfind("unix:", 0) == 0 || peer.rfind("unix-abstract:", 0) == 0) return true;
  if (peer.rfind("ipv4:", 0) == 0) {
    std::string_view rest = peer.substr(5);
    return ipv4Loopback(std::string(rest.substr(0, rest.rfind(':'))));
  }
  if (peer.rfind("ipv6:", 0) == 0) {
    std::string rest = unescapeBrackets(peer.substr(5));
    if (rest.empty() || rest.front() != '[') return false;
    size_t close = rest.find(']');
    if (close == std::string::npos) return false;
    std::string host = rest.substr(1, close - 1);
    if (size_t zone = host.find('%'); zone != std::string::npos) host.resize(zone);
    in6_addr a{};
    if (::inet_pton(AF_INET6, host.c_str(), &a) != 1) return false;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

grpc::Status checkAdminCall(std::string_view call, const std::string& required_token,
                            const std::optional<std::string>& authorization,
                            std::string_view peer) {
  const std::string name(call);
  if (required_token.empty()) {
    if (isLoopbackPeer(peer)) return grpc::Status::OK;
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        name + " is an admin call: this agent has no --rpc-auth-token-file, so it accepts " + name +
            " only from loopback (127.0.0.1, ::1), not from " + std::string(peer) +
            "; run the command on the agent's host, or give the agent --rpc-auth-token-file and "
            "the client the token (kolo --agent-token-file)");
  }
  if (!authorization) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        name + " needs a bearer token: send the metadata 'authorization: Bearer <token>'");
  }
  if (!constantTimeEquals(*authorization, "Bearer " + required_token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the bearer token is not valid for this server");
  }
  return grpc::Status::OK;
}

}  // namespace kolo
