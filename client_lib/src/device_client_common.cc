#include <cerrno>
#include <cstdlib>

#include "device_client.h"

namespace kolo {

ThreadStream& threadStream() {
  thread_local ThreadStream s;
  return s;
}

StatusOr<uint64_t> parseDeviceArenaMb(const char* value) {
  if (value == nullptr || value[0] == '\0') return uint64_t{0};
  errno = 0;
  char* end = nullptr;
  unsigned long long mb = std::strtoull(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || value[0] == '-' || mb > (64ull << 10)) {
    return invalidArgument("KOLO_DEVICE_ARENA_MB is '" + std::string(value) +
                           "'; it must be a whole number of MiB from 0 (no device arena) to 65536");
  }
  return static_cast<uint64_t>(mb) << 20;
}

}  // namespace kolo
