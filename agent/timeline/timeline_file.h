// The timeline's file: a Chrome trace in the {"traceEvents": [...]} form,
// valid JSON after every append. The file always ends with the closing tail
// "\n]}\n"; each append writes the new events followed by a fresh tail with
// ONE pwrite at the offset where the old tail began, so a reader (or a
// process killed between appends) always finds a complete document.
// (A kill that lands inside a multi-page pwrite can tear that one write;
// the writer keeps writes to one syscall per flush to make this window
// as small as the kernel allows.)
// Used by the timeline's writer thread only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace kolo::timeline {

class TraceFile {
 public:
  static constexpr std::string_view kHeader = "{\"traceEvents\": [\n";
  static constexpr std::string_view kTail = "\n]}\n";

  // Creates (truncates) `path` and writes an empty, valid trace.
  static StatusOr<TraceFile> create(const std::string& path);

  // Appends complete JSON objects (one per element, no separators).
  Status append(const std::vector<std::string>& events);
  const std::string& path() const { return path_; }
  uint64_t bytes() const { return data_end_ + kTail.size(); }

 private:
  TraceFile(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  Status writeAt(std::string_view data, uint64_t offset);

  UniqueFd fd_;
  std::string path_;
  uint64_t data_end_ = 0;  // where the tail starts
  bool any_event_ = false;
};

}  // namespace kolo::timeline
