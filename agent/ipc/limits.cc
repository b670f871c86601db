#include "agent/ipc/limits.h"

#include <algorithm>

#include "common/dtype.h"

namespace kolo {

namespace {

Status tooLong(const char* field, size_t bytes, size_t limit) {
  return invalidArgument(std::string("Hello: ") + field + " of " + std::to_string(bytes) +
                         " bytes is longer than the limit of " + std::to_string(limit) + " bytes");
}

template <typename T>
Status outOfRange(const char* field, T value, T lo, T hi, const char* knob = nullptr) {
  std::string s = std::string("Hello: ") + field + " " + std::to_string(value) +
                  " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (knob != nullptr) s += std::string(" (limit set by --") + knob + ")";
  return invalidArgument(s);
}

}  // namespace

Status checkHelloBounds(const ipc::Hello& h, const AgentLimits& l) {
  if (h.job_id().empty()) return invalidArgument("Hello: job id is empty (KOLO_JOB_ID)");
  if (h.job_id().size() > kMaxJobIdBytes)
    return tooLong("job id", h.job_id().size(), kMaxJobIdBytes);
  if (h.token().size() > kMaxTokenBytes) return tooLong("token", h.token().size(), kMaxTokenBytes);
  if (h.hostname().size() > kMaxHostnameBytes)
    return tooLong("hostname", h.hostname().size(), kMaxHostnameBytes);
  if (h.gpu_uuid().size() > kMaxGpuUuidBytes)
    return tooLong("gpu_uuid", h.gpu_uuid().size(), kMaxGpuUuidBytes);
  const size_t max_events = size_t{kMaxDeviceEvents} * 64;
  if (h.device_events().size() > max_events)
    return tooLong("device_events", h.device_events().size(), max_events);
  if (h.local_size() < 1 || h.local_size() > l.max_local_size) {
    return outOfRange("local_size", h.local_size(), 1, l.max_local_size, "max-local-size");
  }
  if (h.local_rank() < 0 || h.local_rank() >= h.local_size()) {
    return invalidArgument("local rank " + std::to_string(h.local_rank()) +
                           " is not in [0, local size " + std::to_string(h.local_size()) + ")");
  }
  if (h.world_size() > kMaxWorldSize)
    return outOfRange("world_size", h.world_size(), h.local_size(), kMaxWorldSize);
  if (h.min_size() < 0 || h.min_size() > kMaxWorldSize)
    return outOfRange("min_size", h.min_size(), 0, kMaxWorldSize);
  if (h.max_size() < 0 || h.max_size() > kMaxWorldSize)
    return outOfRange("max_size", h.max_size(), 0, kMaxWorldSize);
  if (h.elastic_timeout_ms() > kMaxElasticTimeoutMs) {
    return outOfRange("elastic_timeout_ms", h.elastic_timeout_ms(), int64_t{0},
                      kMaxElasticTimeoutMs);
  }
  if (h.arena_bytes() > l.max_arena_bytes) {
    return outOfRange("arena_bytes", h.arena_bytes(), uint64_t{0}, l.max_arena_bytes,
                      "max-arena-mb");
  }
  if (h.device_arena_bytes() > l.max_device_arena_bytes) {
    return outOfRange("device_arena_bytes", h.device_arena_bytes(), uint64_t{0},
                      l.max_device_arena_bytes, "max-device-arena-mb");
  }
  if (h.device_arena_bytes() > 0 && (h.cuda_device() < -1 || h.cuda_device() >= kMaxCudaDevice)) {
    return outOfRange("cuda_device", h.cuda_device(), -1, kMaxCudaDevice - 1);
  }
  return okStatus();
}

uint64_t bytesInFlightLimit(const AgentLimits& l, uint64_t arena_bytes) {
  return l.max_bytes_in_flight > 0 ? l.max_bytes_in_flight : arena_bytes;
}

Status checkSubmitQuota(const RankQuota& used, uint64_t bytes, uint64_t arena_bytes,
                        const AgentLimits& l, int rank, const std::string& job_id) {
  if (used.names >= l.max_names_in_flight) {
    return unavailable(
        "rank " + std::to_string(rank) + " of job " + job_id + " has " +
        std::to_string(used.names) + " collectives in flight on this agent (limit " +
        std::to_string(l.max_names_in_flight) +
        ", --max-names-in-flight): wait for some to complete before submitting more");
  }
  const uint64_t limit = bytesInFlightLimit(l, arena_bytes);
  if (bytes > limit || used.bytes > limit - bytes) {
    return unavailable("rank " + std::to_string(rank) + " of job " + job_id + " would have " +
                       std::to_string(used.bytes + bytes) +
                       " bytes in flight on this agent (limit " + std::to_string(limit) +
                       " bytes, --max-bytes-in-flight-mb" +
                       (l.max_bytes_in_flight > 0 ? "" : "=0: the size of its arenas") +
                       "): wait for some collectives to complete before submitting more");
  }
  return okStatus();
}

uint64_t tableBytesPerName(int local_size) {
  return 1024 + 64 * static_cast<uint64_t>(local_size > 0 ? local_size : 1);
}

Status checkUidTableQuota(uint64_t used, uint64_t cost, const AgentLimits& l, uid_t uid) {
  if (cost > l.max_table_bytes_per_uid || used > l.max_table_bytes_per_uid - cost) {
    return unavailable(
        "uid " + std::to_string(uid) + " holds " + std::to_string(used >> 10) +
        " KiB of the agent's tensor table in collectives in flight (limit " +
        std::to_string(l.max_table_bytes_per_uid >> 20) +
        " MiB over all its connections, --max-table-mb-per-uid): wait for some to complete "
        "before submitting more");
  }
  return okStatus();
}

}  // namespace kolo
