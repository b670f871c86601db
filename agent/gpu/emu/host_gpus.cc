#include "agent/gpu/emu/host_gpus.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace kolo::gpu::emu {

StatusOr<EmuGpus> parseEmuGpus(const char* gpus, const char* p2p) {
  EmuGpus g;
  if (gpus != nullptr && *gpus != '\0') {
    const std::string s = gpus;
    char* end = nullptr;
    const long n = std::strtol(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != '\0' || n < 1 || n > kMaxEmuGpus) {
      return invalidArgument("KOLO_DEVICE_EMU_GPUS='" + s + "': a number of emulated GPUs in 1.." +
                             std::to_string(kMaxEmuGpus));
    }
    g.count = static_cast<int>(n);
  }
  if (p2p != nullptr && *p2p != '\0') {
    const std::string s = p2p;
    if (s == "all") {
      g.p2p = true;
    } else if (s == "none") {
      g.p2p = false;
    } else {
      return invalidArgument("KOLO_DEVICE_EMU_P2P='" + s + "': all or none");
    }
  }
  return g;
}

const StatusOr<EmuGpus>& emuGpus() {
  static const StatusOr<EmuGpus>* g = new StatusOr<EmuGpus>(
      parseEmuGpus(std::getenv("KOLO_DEVICE_EMU_GPUS"), std::getenv("KOLO_DEVICE_EMU_P2P")));
  return *g;
}

namespace {
thread_local int t_device = 0;

struct State {
  std::mutex mu;
  std::map<const void*, int> streams;
  std::set<std::pair<int, int>> peers;
};
State& state() {
  static State* s = new State;  // used until exit
  return *s;
}
}  // namespace

int currentDevice() { return t_device; }
void setCurrentDevice(int device) { t_device = device; }

void tagStream(const void* stream, int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().streams[stream] = device;
}
void untagStream(const void* stream) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().streams.erase(stream);
}
int streamDevice(const void* stream) {
  if (stream == nullptr) return t_device;
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().streams.find(stream);
  return it == state().streams.end() ? t_device : it->second;
}

bool peerEnabled(int device, int peer) {
  if (device == peer) return true;
  std::lock_guard<std::mutex> lock(state().mu);
  return state().peers.count({device, peer}) != 0;
}
void enablePeer(int device, int peer) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().peers.insert({device, peer});
}

}  // namespace kolo::gpu::emu
