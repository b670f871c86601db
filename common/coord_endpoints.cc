#include "common/coord_endpoints.h"

#include <algorithm>
#include <cctype>

namespace kolo {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Empty if `e` is host:port with a port 1..65535, else why not.
std::string checkEntry(std::string_view e) {
  if (e.empty()) return "is empty";
  size_t colon = e.rfind(':');
  if (colon == std::string_view::npos) return "is not host:port";
  std::string_view host = e.substr(0, colon), port = e.substr(colon + 1);
  if (host.empty()) return "has no host";
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return "is not host:port ([v6]:port for IPv6)";
  } else if (host.find(':') != std::string_view::npos) {
    return "is not host:port (write an IPv6 address as [v6]:port)";
  }
  for (char c : host) {
    if (std::isspace(static_cast<unsigned char>(c))) return "has a space in the host";
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return "has no port number";
  }
  int p = std::stoi(std::string(port));
  if (p < 1 || p > 65535) return "has port " + std::string(port) + ", not 1..65535";
  return "";
}

}  // namespace

StatusOr<std::vector<std::string>> parseCoordinatorList(std::string_view list,
                                                        std::string_view what) {
  std::vector<std::string> out;
  size_t start = 0, index = 1;
  while (true) {
    size_t comma = list.find(',', start);
    std::string_view entry = trim(list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    std::string why = checkEntry(entry);
    if (!why.empty()) {
      return invalidArgument(std::string(what) + " \"" + std::string(list) + "\": entry " +
                             std::to_string(index) + " (\"" + std::string(entry) + "\") " + why +
                             "; give host:port or a comma-separated list host:port,host:port");
    }
    if (std::find(out.begin(), out.end(), entry) != out.end()) {
      return invalidArgument(std::string(what) + " \"" + std::string(list) + "\": entry " +
                             std::to_string(index) + " (\"" + std::string(entry) +
                             "\") is listed twice");
    }
    out.emplace_back(entry);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
    ++index;
  }
  return out;
}

std::optional<std::string> leaderHint(std::string_view message) {
  constexpr std::string_view kMarker = "leader is at ";
  size_t at = message.find(kMarker);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = message.substr(at + kMarker.size());
  size_t end = 0;
  while (end < rest.size() && !std::isspace(static_cast<unsigned char>(rest[end])) &&
         rest[end] != ',' && rest[end] != ';' && rest[end] != ')') {
    ++end;
  }
  std::string_view addr = rest.substr(0, end);
  while (!addr.empty() && addr.back() == '.') addr.remove_suffix(1);  // end of a sentence
  if (!checkEntry(addr).empty()) return std::nullopt;
  return std::string(addr);
}

bool neverReachedLeader(std::string_view message) {
  if (message.rfind("standby:", 0) == 0) return true;
  // gRPC's texts for a connection that did not open.
  for (std::string_view s :
       {"failed to connect to all addresses", "Connection refused", "Failed to connect"}) {
    if (message.find(s) != std::string_view::npos) return true;
  }
  return false;
}

CoordEndpoints::CoordEndpoints(std::vector<std::string> addresses, Backoff backoff)
    : addresses_(std::move(addresses)), backoff_(backoff) {}

std::string CoordEndpoints::joined() const {
  std::string s;
  for (const auto& a : addresses_) s += (s.empty() ? "" : ", ") + a;
  return s;
}

std::string CoordEndpoints::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return addresses_[current_];
}

CoordEndpoints::Next CoordEndpoints::failed(const std::string& address, std::string_view message) {
  std::lock_guard<std::mutex> lock(mu_);
  Next next;
  if (address != addresses_[current_]) {  // someone moved on already
    next.address = addresses_[current_];
    next.switched = true;
    return next;
  }
  ++failures_;
  const size_t n = addresses_.size();
  size_t to = (current_ + 1) % n;
  if (auto hint = leaderHint(message); hint && *hint != address) {
    auto it = std::find(addresses_.begin(), addresses_.end(), *hint);
    if (it != addresses_.end()) {
      to = static_cast<size_t>(it - addresses_.begin());
      next.hinted = true;
    }
  }
  current_ = to;
  next.address = addresses_[to];
  next.switched =
      to != static_cast<size_t>(std::find(addresses_.begin(), addresses_.end(), address) -
                                addresses_.begin());
  if (failures_ % n == 0) {
    // A full round failed: wait before the next one, longer each round.
    uint64_t rounds = failures_ / n;
    auto wait = backoff_.initial;
    for (uint64_t i = 1; i < rounds && wait < backoff_.max; ++i) wait *= 2;
    next.wait = std::min(wait, backoff_.max);
  }
  return next;
}

void CoordEndpoints::succeeded(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  if (address == addresses_[current_]) failures_ = 0;
}

}  // namespace kolo
