#include "agent/timeline/timeline_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace kolo::timeline {

StatusOr<TraceFile> TraceFile::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus("timeline: cannot open " + path, errno);
  TraceFile f(UniqueFd(fd), path);
  std::string initial;
  initial.append(kHeader).append(kTail);
  RETURN_IF_ERROR(f.writeAt(initial, 0));
  f.data_end_ = kHeader.size();
  return f;
}

Status TraceFile::writeAt(std::string_view data, uint64_t offset) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd_.get(), data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("timeline: cannot write " + path_, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return okStatus();
}

Status TraceFile::append(const std::vector<std::string>& events) {
  if (events.empty()) return okStatus();
  std::string buf;
  size_t want = kTail.size();
  for (const auto& e : events) want += e.size() + 2;
  buf.reserve(want);
  bool any = any_event_;
  for (const auto& e : events) {
    if (any) buf.append(",\n");
    buf.append(e);
    any = true;
  }
  size_t data_len = buf.size();
  buf.append(kTail);
  RETURN_IF_ERROR(writeAt(buf, data_end_));
  data_end_ += data_len;
  any_event_ = true;
  return okStatus();
}

}  // namespace kolo::timeline
