#include "agent/gpu/device_cross.h"

#include <sstream>

namespace kolo::gpu {

StatusOr<DeviceCrossMode> parseDeviceCrossMode(const std::string& text) {
  if (text == "auto") return DeviceCrossMode::kAuto;
  if (text == "nccl") return DeviceCrossMode::kNccl;
  if (text == "staged") return DeviceCrossMode::kStaged;
  return invalidArgument("--device-cross must be auto, nccl or staged (got '" + text + "')");
}

const char* deviceCrossModeName(DeviceCrossMode m) {
  switch (m) {
    case DeviceCrossMode::kAuto:
      return "auto";
    case DeviceCrossMode::kNccl:
      return "nccl";
    case DeviceCrossMode::kStaged:
      return "staged";
  }
  return "?";
}

DeviceCrossCapability localDeviceCapability(bool nccl_built, const std::vector<int>& grant_gpus,
                                            const std::string& no_grant_why) {
  DeviceCrossCapability c;
  c.nccl = nccl_built;
  if (!nccl_built) c.lacks = "built without NCCL";
  std::string gpu_lack;
  if (grant_gpus.empty()) {
    gpu_lack = no_grant_why.empty() ? "no trainer of the job has a device arena on this agent"
                                    : no_grant_why;
  } else {
    for (int g : grant_gpus) {
      if (g != grant_gpus.front()) {
        gpu_lack = "the job's trainers on this agent use different GPUs (" +
                   std::to_string(grant_gpus.front()) + " and " + std::to_string(g) + ")";
        break;
      }
    }
  }
  if (gpu_lack.empty()) {
    c.gpu = grant_gpus.front();
  } else {
    c.lacks += (c.lacks.empty() ? "" : "; ") + gpu_lack;
  }
  return c;
}

std::string encodeCapability(const DeviceCrossCapability& c) {
  return "nccl=" + std::string(c.nccl ? "1" : "0") + " gpu=" + std::to_string(c.gpu) +
         " lacks=" + c.lacks;
}

StatusOr<DeviceCrossCapability> decodeCapability(const std::string& text) {
  DeviceCrossCapability c;
  const std::string bad = "malformed device capability '" + text + "'";
  if (text.rfind("nccl=", 0) != 0 || text.size() < 6) return invalidArgument(bad);
  if (text[5] != '0' && text[5] != '1') return invalidArgument(bad);
  c.nccl = text[5] == '1';
  size_t g = text.find(" gpu=", 6);
  size_t l = text.find(" lacks=", 6);
  if (g != 6 || l == std::string::npos || l <= g + 5) return invalidArgument(bad);
  const std::string gpu = text.substr(g + 5, l - g - 5);
  size_t used = 0;
  try {
    c.gpu = std::stoi(gpu, &used);
  } catch (...) {
    return invalidArgument(bad);
  }
  if (used != gpu.size() || c.gpu < -1) return invalidArgument(bad);
  c.lacks = text.substr(l + 7);
  return c;
}

std::string deviceCapabilityKey(uint64_t generation, int cross_rank) {
  return "g" + std::to_string(generation) + "/devcap/" + std::to_string(cross_rank);
}

std::string ncclKeyPrefix(uint64_t generation) {
  return "g" + std::to_string(generation) + "/nccl";
}

DeviceCrossChoice chooseDeviceCross(DeviceCrossMode mode,
                                    const std::vector<std::optional<DeviceCrossCapability>>& caps) {
  DeviceCrossChoice c;
  if (mode == DeviceCrossMode::kStaged) {
    c.kind = DeviceCrossChoiceKind::kStaged;
    c.why = "device tensors cross agents by host staging: --device-cross=staged";
    return c;
  }
  // The first agent (by cross rank) that cannot run NCCL names the reason.
  std::string lack;
  for (size_t r = 0; r < caps.size() && lack.empty(); ++r) {
    const std::string agent = "agent " + std::to_string(r);
    if (!caps[r]) {
      lack = agent + " did not publish its device capability within the backend timeout";
    } else if (!caps[r]->nccl) {
      lack = agent + " has no NCCL" + (caps[r]->lacks.empty() ? "" : " (" + caps[r]->lacks + ")");
    } else if (caps[r]->gpu < 0) {
      lack = agent + " has no GPU for the job" +
             (caps[r]->lacks.empty() ? "" : " (" + caps[r]->lacks + ")");
    }
  }
  if (caps.size() < 2 && lack.empty()) lack = "the job has fewer than two agents";
  if (lack.empty()) {
    c.kind = DeviceCrossChoiceKind::kNccl;
    c.why = std::string("device tensors cross agents over NCCL: every one of the ") +
            std::to_string(caps.size()) +
            " agents has NCCL and a GPU (--device-cross=" + deviceCrossModeName(mode) + ")";
    return c;
  }
  if (mode == DeviceCrossMode::kNccl) {
    c.kind = DeviceCrossChoiceKind::kFail;
    c.why = "--device-cross=nccl but NCCL is not viable for this job: " + lack;
    return c;
  }
  c.kind = DeviceCrossChoiceKind::kStaged;
  c.why = "device tensors cross agents by host staging: " + lack;
  return c;
}

}  // namespace kolo::gpu
