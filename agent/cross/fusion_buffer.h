// A fusion buffer across agents: one staging block that holds parts of
// several tensors at fixed offsets, packed before a backend collective and
// read or unpacked after it. CrossJob's fused allreduces (pack chunk by
// chunk, gaps zeroed; each tensor then read in place through a view) and
// its fused allgathers / reducescatters (cross_fuse_blocks.cc: one part per
// tensor and agent, packed and unpacked by agent) share it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kolo {

class FusionBuffer {
 public:
  struct Part {
    std::string name;      // the tensor's
    void* data = nullptr;  // the part's bytes in the tensor's own buffer
    uint64_t offset = 0;   // where the part lies in the fusion buffer
    uint64_t bytes = 0;
    int agent = -1;              // whose block it is (allgather, reducescatter); -1: none
    std::shared_ptr<void> keep;  // holds `data` alive while the buffer is in use
  };

  // `bytes` used, out of a block of at least `alloc_bytes` from the staging
  // pool (one size for every buffer lets the pool hand the same blocks back).
  FusionBuffer(uint64_t bytes, uint64_t alloc_bytes);

  // Parts in increasing offset order, not overlapping.
  void add(Part part) { parts_.push_back(std::move(part)); }
  const std::vector<Part>& parts() const { return parts_; }
  char* data() { return buf_.get(); }
  uint64_t size() const { return bytes_; }
  // The block itself: a view of a part's result stays valid while it is held.
  const std::shared_ptr<char>& block() const { return buf_; }

  // Copies into the buffer the parts' bytes that fall in [begin, end),
  // zeroing everything else there (alignment gaps, the tail).
  void packRange(uint64_t begin, uint64_t end);
  // Copies whole parts in (pack) or out (unpack), those `which` selects.
  void packParts(const std::function<bool(const Part&)>& which);
  void unpackParts(const std::function<bool(const Part&)>& which);

 private:
  std::shared_ptr<char> buf_;
  uint64_t bytes_;
  std::vector<Part> parts_;
};

}  // namespace kolo
