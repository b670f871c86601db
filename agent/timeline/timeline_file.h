// The timeline's file: a Chrome trace in the {"traceEvents": [...]} form,
// valid JSON after every append. The file always ends with the closing tail
// "\n]}\n"; each append writes the new events followed by a fresh tail with
// ONE pwrite at the offset where the old tail began, so a reader (or a
// process killed between appends) always finds a complete document.
// (A kill that lands inside a multi-page pwrite can tear that one write;
// the writer keeps writes to one syscall per flush to make this window
// as small as the kernel allows.)
//
// Where it may be: the file name comes from whoever starts the timeline (a
// trainer on the agent's socket, `kolo timeline start` over gRPC, the
// agent's own --timeline-filename), and the agent may run as root, so the
// file is always created inside one configured directory (--timeline-dir):
// see openTimelineFile().
// Used by the timeline's writer thread only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace kolo::timeline {

// The knob that sets the directory, for messages.
inline constexpr std::string_view kTimelineDirKnob = "--timeline-dir (KOLO_TIMELINE_DIR)";

struct ConfinedFile {
  UniqueFd fd;
  std::string path;  // the directory's real path + the name inside it
};

// Opens `requested` for writing, confined to `dir`:
//  - a relative name is taken inside `dir`; an absolute one must name a
//    file below `dir` (as configured, or its real path);
//  - no ".." component; no symbolic link is followed below `dir` (each
//    subdirectory is opened with O_NOFOLLOW from its parent's descriptor,
//    so a link swapped in meanwhile is not followed either);
//  - a new file is created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0640 (less
//    the umask); an existing one must be a regular file with one link, and
//    is truncated only after the descriptor was checked to be that file.
// Subdirectories are not created. A refusal is PERMISSION_DENIED and its
// text names the directory and the knob; an empty name or an empty `dir`
// (timelines off) is INVALID_ARGUMENT.
StatusOr<ConfinedFile> openTimelineFile(const std::string& dir, const std::string& requested);

class TraceFile {
 public:
  static constexpr std::string_view kHeader = "{\"traceEvents\": [\n";
  static constexpr std::string_view kTail = "\n]}\n";

  // Creates (or truncates) `requested` inside `dir` (openTimelineFile) and
  // writes an empty, valid trace. path() is where the file is.
  static StatusOr<TraceFile> create(const std::string& dir, const std::string& requested);

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
