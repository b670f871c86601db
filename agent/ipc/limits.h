// Bounds on what a trainer sends the agent (docs/security.md, "Bounds and
// quotas on the socket"): every count, size and length in a Hello, and the
// per-rank quotas on collectives in flight. Pure functions: each refusal
// names the field, the value and the limit (and the knob, where there is one).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "agent/agent_config.h"
#include "common/ipc_layout.h"
#include "common/status.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

// Fixed bounds (not knobs: no honest trainer comes near them).
constexpr size_t kMaxJobIdBytes = 128;
constexpr size_t kMaxTokenBytes = 1024;
constexpr size_t kMaxHostnameBytes = 255;
constexpr size_t kMaxGpuUuidBytes = 64;
constexpr int32_t kMaxWorldSize = 1 << 24;
constexpr int32_t kMaxCudaDevice = 4096;
constexpr int64_t kMaxElasticTimeoutMs = int64_t{30} * 24 * 3600 * 1000;  // 30 days

// Every field of a Hello within its bound (the protocol version is checked
// before). Checks sizes only: tokens, jobs and ranks are the agent's.
Status checkHelloBounds(const ipc::Hello& h, const AgentLimits& limits);

// What one rank has in flight on this agent: collectives accepted into its
// job's table and not completed yet.
struct RankQuota {
  int64_t names = 0;
  uint64_t bytes = 0;
};

// The bytes one rank may hold in flight: --max-bytes-in-flight-mb, or when
// it is 0 the rank's arenas (`arena_bytes`, shared plus device). Sent to
// libkolo in Welcome.max_bytes_in_flight, which holds its submissions
// under it rather than have one refused.
uint64_t bytesInFlightLimit(const AgentLimits& limits, uint64_t arena_bytes);

// Whether one more collective of `bytes` fits rank `rank`'s quota;
// `arena_bytes` (its shared plus device arenas) is the bytes limit when
// --max-bytes-in-flight-mb is 0.
Status checkSubmitQuota(const RankQuota& used, uint64_t bytes, uint64_t arena_bytes,
                        const AgentLimits& limits, int rank, const std::string& job_id);

// What one collective in flight costs the agent's tensor table, charged
// against --max-table-mb-per-uid: measured, with margin, by
// HostileClient.NameTableMemoryIsBoundedPerUid (docs/security.md).
uint64_t tableBytesPerName(int local_size);

// Whether one more collective costing `cost` fits uid `uid`'s share of the
// tensor table (`used`: what its names in flight already cost).
Status checkUidTableQuota(uint64_t used, uint64_t cost, const AgentLimits& limits, uid_t uid);

}  // namespace kolo
