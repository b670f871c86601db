// Merges several agents' timeline files into one Chrome trace for the whole
// job (`kolo timeline merge`). Each file's first event is its clock anchor
// (kClockAnchorName: the file's monotonic time and the wall-clock time at
// the same instant, and the agent's label), so files from different hosts
// line up on wall-clock time; every agent's rows keep their own processes,
// named "<label>: <tensor>". A file written by an agent that was killed is
// read as far as it is valid.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace kolo::timeline {

struct MergeStats {
  size_t files = 0;
  size_t events = 0;
};

// Reads `inputs`, writes the merged trace ({"traceEvents": [...]}) to
// `output`. Timestamps are shifted so the earliest event is at 0.
StatusOr<MergeStats> mergeTraceFiles(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace kolo::timeline
