// How one job generation's device tensors cross agents (issue 41; docs/gpu.md,
// "Device tensors across agents"): this agent publishes its capability
// record under the job KV, reads every agent's with the backend timeout,
// makes the choice every agent makes from the same records
// (gpu::chooseDeviceCross), logs it once, and, when it is NCCL, creates the
// generation's NCCL communicator (the nccl backend under
// gpu::ncclKeyPrefix(generation), non-blocking init bounded by the timeout).
// Blocking: run it on a worker thread, never the agent's loop.
//
// The agent runs it on setup_pool_ for every generation of a job over
// several agents (Agent::startCrossOnLoop), before its trainers learn the
// world; the CrossJob holds the choice and the communicator.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"
#include "agent/gpu/device_cross.h"

namespace kolo {

struct DeviceCrossRequest {
  std::string job;  // for the log line and error texts
  uint64_t generation = 0;
  int cross_rank = 0;  // this agent
  int cross_size = 1;  // the job's agents in this generation
  gpu::DeviceCrossMode mode = gpu::DeviceCrossMode::kAuto;
  gpu::DeviceCrossCapability mine;
  std::chrono::milliseconds timeout{30000};  // the backend timeout: the records and NCCL's init
  // No local trainer has a device arena (so this agent runs no device op
  // of the job): publish the record so that the others need not wait for
  // it, read nothing, answer staging.
  bool publish_only = false;
};

class Job;
// The request for `job`'s current generation on this agent: its record from
// the build and its local trainers' device arenas (localDeviceCapability).
// Loop thread.
DeviceCrossRequest deviceCrossRequestFor(const Job& job, gpu::DeviceCrossMode mode,
                                         std::chrono::milliseconds timeout);

struct DeviceCrossSetup {
  gpu::DeviceCrossChoice choice;
  std::unique_ptr<Backend> nccl;  // the generation's communicator, with kNccl
};

// The choice (and with NCCL the communicator). NCCL chosen but its
// communicator not created (a peer did not join, NCCL refused) is kFail
// with `NCCL communicator of job J generation G not created: <why>`, so
// the job's device ops fail with the cause instead of taking another route
// than the other agents. InvalidArgument for a bad request.
StatusOr<DeviceCrossSetup> setUpDeviceCross(const DeviceCrossRequest& req, KvStore& kv);

}  // namespace kolo
