// Faults the host emulation injects (KOLO_DEVICE_EMU_FAULTS, read once per
// process, comma-separated; docs/gpu.md, "The host emulation"):
//   delay-us=N    every stream task starts N us late (a slow device)
//   fail-launch   every reduction launch fails (cudaErrorLaunchFailure)
//   fail-record   every event record fails (cudaErrorInvalidResourceHandle)
//   sticky        after the first reduction launch every call fails
//                 (cudaErrorIllegalAddress, sticky as on a real GPU)
//   hang-events   this process's events never complete (a peer whose
//                 device never reaches its records)
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace kolo::gpu::emu {

struct Faults {
  int64_t delay_us = 0;
  bool fail_launch = false;
  bool fail_record = false;
  bool sticky = false;
  bool hang_events = false;
};

// Pure: the text of KOLO_DEVICE_EMU_FAULTS.
StatusOr<Faults> parseFaults(const std::string& text);
// This process's (an unparsable value is logged and ignored).
const Faults& faults();

// The sticky error, once a fault set it: every later call returns it.
Status stickyError();
void setStickyError();

// The texts, as the CUDA implementation words them (cuda_status.cc).
Status injectedLaunchFailure();
Status injectedRecordFailure();

}  // namespace kolo::gpu::emu
