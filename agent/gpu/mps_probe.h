// Whether the CUDA MPS control daemon is up on this node (docs/gpu.md,
// "CUDA MPS"): its pipe directory and a real connect() to the `control`
// unix socket in it, with a short deadline. No CUDA call; any thread.
#pragma once

#include <chrono>
#include <string>

namespace kolo::gpu {

enum class MpsState { kUnknown, kUp, kDown };

const char* mpsStateName(MpsState s);  // "unknown", "up", "down"

struct MpsProbe {
  MpsState state = MpsState::kUnknown;
  std::string pipe_dir;
  std::string reason;  // why down or unknown, e.g. "no control socket in /run/kolo-mps"
};

// The pipe directory CUDA's MPS clients in this process use:
// CUDA_MPS_PIPE_DIRECTORY when set and not empty, else /tmp/nvidia-mps.
std::string defaultMpsPipeDirectory();

// Probes `pipe_dir`: up when `pipe_dir/control` accepts a connection within
// `deadline`; down with a reason when the directory or the socket is missing
// or the connection is refused; unknown when it did not answer in time.
MpsProbe probeMps(const std::string& pipe_dir,
                  std::chrono::milliseconds deadline = std::chrono::milliseconds(100));

}  // namespace kolo::gpu
