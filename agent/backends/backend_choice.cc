#include "agent/backends/backend_choice.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <system_error>

namespace kolo {

namespace {
constexpr std::string_view kMagic = "kolo-backend1";

bool isBackendName(const std::string& s) { return s == "ucx" || s == "tcp"; }

// The RDMA devices under `dir`, sorted (none when it does not exist).
std::vector<std::string> rdmaDevices(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

bool isBackendSetting(const std::string& setting) {
  return setting == "auto" || isBackendName(setting);
}

BackendOffer localBackendOffer(const std::string& setting, bool ucx_compiled,
                               const std::string& rdma_dir) {
  if (!ucx_compiled) return {setting, "tcp", "built without UCX"};
  std::vector<std::string> devices = rdmaDevices(rdma_dir);
  if (devices.empty()) return {setting, "tcp", "no RDMA device"};
  return {setting, "ucx", "RDMA device " + devices.front()};
}

StatusOr<BackendChoice> agreeBackend(const std::vector<BackendOffer>& offers) {
  if (offers.empty()) return invalidArgument("no agent's backend offer");
  // An agent that names a backend decides; all that name one must agree.
  int forced = -1;
  for (size_t r = 0; r < offers.size(); ++r) {
    const std::string& s = offers[r].setting;
    if (s == "auto") continue;
    if (forced < 0) {
      forced = static_cast<int>(r);
    } else if (s != offers[forced].setting) {
      return invalidArgument("the agents disagree on the backend: agent rank " +
                             std::to_string(forced) + " is set to " + offers[forced].setting +
                             ", agent rank " + std::to_string(r) + " to " + s +
                             " (set the same `backend` on every node, or auto)");
    }
  }
  if (forced >= 0) {
    return BackendChoice{offers[forced].setting, "set by agent rank " + std::to_string(forced)};
  }
  for (size_t r = 0; r < offers.size(); ++r) {
    if (offers[r].offer != "ucx") {
      return BackendChoice{"tcp", "auto: agent rank " + std::to_string(r) + " offers tcp (" +
                                      offers[r].reason + ")"};
    }
  }
  return BackendChoice{
      "ucx", "auto: every agent has RDMA (" + offers.front().reason + " on agent rank 0)"};
}

std::string encodeBackendOffer(const BackendOffer& o) {
  return std::string(kMagic) + " " + o.setting + " " + o.offer + " " + o.reason;
}

StatusOr<BackendOffer> decodeBackendOffer(const std::string& line) {
  std::istringstream in(line);
  std::string magic;
  BackendOffer o;
  in >> magic >> o.setting >> o.offer;
  if (magic != kMagic || !isBackendSetting(o.setting) || !isBackendName(o.offer)) {
    return invalidArgument("malformed backend offer '" + line.substr(0, 80) + "'");
  }
  std::getline(in >> std::ws, o.reason);
  return o;
}

StatusOr<BackendChoice> agreeBackendOverKv(KvStore& kv, const std::string& prefix, int rank,
                                           int size, const BackendOffer& mine,
                                           std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return invalidArgument("agent rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  RETURN_IF_ERROR(kv.put(prefix + "/" + std::to_string(rank), encodeBackendOffer(mine)));
  std::vector<BackendOffer> offers(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      offers[r] = mine;
      continue;
    }
    auto line = kv.get(prefix + "/" + std::to_string(r), timeout);
    if (!line.isOk()) {
      return peerFailure("agent rank " + std::to_string(r) +
                         " unreachable: no backend offer from it within " +
                         std::to_string(timeout.count()) + " ms (" + line.status().message() + ")");
    }
    ASSIGN_OR_RETURN(offers[r], decodeBackendOffer(line.value()));
  }
  return agreeBackend(offers);
}

}  // namespace kolo
