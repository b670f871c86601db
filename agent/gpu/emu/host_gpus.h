// The host emulation's GPUs (docs/gpu.md, "Several GPUs per node"):
// KOLO_DEVICE_EMU_GPUS=N devices (1..16, default 1), each with its own
// ordinal and UUID, and whether they can access each other's memory
// (KOLO_DEVICE_EMU_P2P=all|none, default all). Per process: the calling
// thread's current device (cudaSetDevice), each stream's device (the one
// current at its creation, as CUDA), and the peer access enabled so far.
#pragma once

#include <string>

#include "common/status.h"

namespace kolo::gpu::emu {

constexpr int kMaxEmuGpus = 16;

struct EmuGpus {
  int count = 1;
  bool p2p = true;
};
// The two variables' values (nullptr or empty: the default). Pure.
StatusOr<EmuGpus> parseEmuGpus(const char* gpus, const char* p2p);
// This process's, read once; a bad value is the error of every device call.
const StatusOr<EmuGpus>& emuGpus();

int currentDevice();
void setCurrentDevice(int device);

void tagStream(const void* stream, int device);
void untagStream(const void* stream);
// The stream's device; the legacy default stream (nullptr) and an unknown
// one: the calling thread's current device.
int streamDevice(const void* stream);

bool peerEnabled(int device, int peer);
void enablePeer(int device, int peer);

}  // namespace kolo::gpu::emu
