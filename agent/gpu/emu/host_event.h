// The host emulation's events (docs/gpu.md, "The host emulation"). Every
// event is a slot {recorded, completed} in this process's event table, a
// memfd, so another process can map it: an interprocess handle names
// (pid, fd, table id, slot) and is opened through /proc/<pid>/fd/<fd>.
// CUDA's semantics: record(s) numbers the record at enqueue time and s
// marks it completed when it gets there; query() looks at the latest
// record; streamWait(s) captures the latest record at enqueue time and
// s's worker waits for that one (a later record does not move it).
#pragma once

#include <memory>

#include "agent/gpu/device_api.h"

namespace kolo::gpu::emu {

StatusOr<std::unique_ptr<DevEvent>> createHostEvent(bool interprocess);
StatusOr<std::unique_ptr<DevEvent>> openHostEvent(const IpcEventBytes& handle);

}  // namespace kolo::gpu::emu
