// The host backend a job's agents use among themselves, agreed before their
// first connection (`backend = auto`, the default; docs/backends.md,
// "Choosing the backend").
//
// Every agent of a generation publishes one line in the job's key-value
// store: its setting (auto, ucx or tcp) and what its node offers (ucx where
// UCX is built in and the node has an RDMA device, tcp otherwise). Every
// agent reads all lines and applies the same pure rule, so they all take the
// same backend or all fail with the same message:
//   - an agent that names a backend (ucx or tcp) decides for the job; two
//     that name different ones fail the job, naming both;
//   - otherwise ucx when every agent offers it (RDMA), else plain tcp (the
//     faster path without RDMA: one copy less than UCX over tcp), naming the
//     first agent that does not offer ucx.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "agent/backends/kv_store.h"
#include "common/status.h"

namespace kolo {

// One agent's line.
struct BackendOffer {
  std::string setting;  // "auto", "ucx" or "tcp": the agent's `backend` knob
  std::string offer;    // "ucx" or "tcp": the fastest this node offers
  std::string reason;   // why, e.g. "RDMA device mlx5_0" or "no RDMA device"
};

struct BackendChoice {
  std::string backend;  // "ucx" or "tcp"
  std::string reason;   // one line for logs and `kolo job`
};

// Whether `setting` is a valid value of the `backend` knob.
bool isBackendSetting(const std::string& setting);

// What this node offers: ucx when `ucx_compiled` and `rdma_dir` (normally
// /sys/class/infiniband) lists a device, tcp otherwise.
BackendOffer localBackendOffer(const std::string& setting, bool ucx_compiled,
                               const std::string& rdma_dir = "/sys/class/infiniband");

// The rule above over every agent's line, in agent rank order.
StatusOr<BackendChoice> agreeBackend(const std::vector<BackendOffer>& offers);

// The KV line of an offer and back (InvalidArgument for a malformed line).
std::string encodeBackendOffer(const BackendOffer& o);
StatusOr<BackendOffer> decodeBackendOffer(const std::string& line);

// Publishes `mine` under `prefix`/`rank`, reads every agent's line (each
// wait bounded by `timeout`; PeerFailure naming the agent that did not
// publish) and returns agreeBackend's answer.
StatusOr<BackendChoice> agreeBackendOverKv(KvStore& kv, const std::string& prefix, int rank,
                                           int size, const BackendOffer& mine,
                                           std::chrono::milliseconds timeout);

}  // namespace kolo
