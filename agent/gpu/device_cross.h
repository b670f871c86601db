// How device tensors cross agents (docs/gpu.md, "Device tensors across
// agents: NCCL or host staging"): pure logic, built in every configuration
// and unit-tested without CUDA (tests/gpu/device_cross_test.cc).
//
// Every agent of a job publishes its capability in the job's KV store
// (deviceCapabilityKey), reads every agent's, and calls chooseDeviceCross
// with the same inputs, so all agents pick the same route.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace kolo::gpu {

// --device-cross (KOLO_DEVICE_CROSS).
enum class DeviceCrossMode { kAuto, kNccl, kStaged };
StatusOr<DeviceCrossMode> parseDeviceCrossMode(const std::string& text);
const char* deviceCrossModeName(DeviceCrossMode m);

// One agent's ability to run a job's device tensors over NCCL.
struct DeviceCrossCapability {
  bool nccl = false;  // this agent's build has NCCL and it loads
  int gpu = -1;       // the GPU of the job's local trainers (-1: none / not known)
  std::string lacks;  // when !nccl or gpu < 0: what is missing, in words
};
// This agent's record for a job: `nccl_built` (ncclBackendCompiled()), the
// CUDA ordinals of the job's local trainers' device arenas (empty: none has
// one, `no_grant_why` says why when known). NCCL wants one GPU per agent, so
// trainers on different GPUs mean no GPU for the job.
DeviceCrossCapability localDeviceCapability(bool nccl_built, const std::vector<int>& grant_gpus,
                                            const std::string& no_grant_why);
// The KV value ("nccl=1 gpu=0 lacks=..."): encode and decode (decode is
// InvalidArgument for anything not written by encode).
std::string encodeCapability(const DeviceCrossCapability& c);
StatusOr<DeviceCrossCapability> decodeCapability(const std::string& text);

// The job KV keys, per generation: "g<gen>/devcap/<cross_rank>" for the
// capabilities, "g<gen>/nccl" the NCCL communicator's bootstrap prefix.
std::string deviceCapabilityKey(uint64_t generation, int cross_rank);
std::string ncclKeyPrefix(uint64_t generation);

enum class DeviceCrossChoiceKind {
  kNccl,    // NCCL over the job's communicator
  kStaged,  // host staging over the host backend
  kFail,    // --device-cross=nccl but NCCL is not viable: device ops fail with `why`
};
struct DeviceCrossChoice {
  DeviceCrossChoiceKind kind = DeviceCrossChoiceKind::kStaged;
  std::string why;  // one line for the log (and the error text for kFail)
};
// `caps[r]`: cross rank r's capability, nullopt when it was not published
// within the backend timeout. Every agent calls it with the same vector.
DeviceCrossChoice chooseDeviceCross(DeviceCrossMode mode,
                                    const std::vector<std::optional<DeviceCrossCapability>>& caps);

}  // namespace kolo::gpu
