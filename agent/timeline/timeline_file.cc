#include "agent/timeline/timeline_file.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace kolo::timeline {

namespace {

// Components of a path, without empty ones and ".".
std::vector<std::string> components(std::string_view p) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t slash = p.find('/', pos);
    std::string_view c = p.substr(pos, slash == std::string_view::npos ? p.npos : slash - pos);
    if (!c.empty() && c != ".") out.emplace_back(c);
    if (slash == std::string_view::npos) break;
    pos = slash + 1;
  }
  return out;
}

bool hasPrefix(const std::vector<std::string>& path, const std::vector<std::string>& prefix) {
  if (prefix.size() > path.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (path[i] != prefix[i]) return false;
  }
  return true;
}

std::string joined(const std::string& root, const std::vector<std::string>& parts, size_t n) {
  std::string s = root == "/" ? "" : root;
  for (size_t i = 0; i < n && i < parts.size(); ++i) s += "/" + parts[i];
  return s.empty() ? "/" : s;
}

}  // namespace

StatusOr<ConfinedFile> openTimelineFile(const std::string& dir, const std::string& requested) {
  if (requested.empty()) return invalidArgument("timeline: empty file name");
  if (dir.empty()) {
    return invalidArgument("timelines are off on this agent: no timeline directory is set (" +
                           std::string(kTimelineDirKnob) + ")");
  }
  const std::string where = " (this agent writes timelines only inside " + dir + ", set by " +
                            std::string(kTimelineDirKnob) + ")";
  auto refuse = [&](const std::string& why) {
    return permissionDenied("timeline path '" + requested + "' " + why + where);
  };
  if (requested.find('\0') != std::string::npos) return refuse("holds a NUL byte");

  char real_buf[PATH_MAX];
  if (::realpath(dir.c_str(), real_buf) == nullptr) {
    return errnoStatus("timeline: the timeline directory " + dir + " (" +
                           std::string(kTimelineDirKnob) + ") cannot be used",
                       errno);
  }
  const std::string real_dir = real_buf;
  std::vector<std::string> parts = components(requested);
  for (const auto& c : parts) {
    if (c == "..") return refuse("has a '..' component");
  }
  if (requested.front() == '/') {
    // Below the directory as configured or as resolved; what follows is
    // then opened relative to it, link by link.
    std::vector<std::string> as_set = components(dir), as_real = components(real_dir);
    if (dir.front() == '/' && hasPrefix(parts, as_set)) {
      parts.erase(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(as_set.size()));
    } else if (hasPrefix(parts, as_real)) {
      parts.erase(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(as_real.size()));
    } else {
      return refuse("is outside the timeline directory");
    }
  }
  if (parts.empty()) return refuse("names the directory itself, not a file in it");

  UniqueFd cur(::open(real_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cur.valid())
    return errnoStatus("timeline: cannot open the timeline directory " + real_dir, errno);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    UniqueFd next(
        ::openat(cur.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) {
      const int err = errno;
      const std::string sub = joined(real_dir, parts, i + 1);
      if (err == ELOOP || err == ENOTDIR)
        return refuse("goes through " + sub + ", a symbolic link or not a directory");
      return errnoStatus("timeline: cannot open " + sub, err);
    }
    cur = std::move(next);
  }
  const std::string& leaf = parts.back();
  const std::string path = joined(real_dir, parts, parts.size());
  UniqueFd fd(::openat(cur.get(), leaf.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640));
  if (fd.valid()) return ConfinedFile{std::move(fd), path};
  if (errno != EEXIST) return errnoStatus("timeline: cannot create " + path, errno);

  // It exists: only a regular file with no other name is reused.
  struct stat before {};
  if (::fstatat(cur.get(), leaf.c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0) {
    return errnoStatus("timeline: cannot inspect " + path, errno);
  }
  if (S_ISLNK(before.st_mode)) return refuse("is a symbolic link");
  if (!S_ISREG(before.st_mode)) return refuse("exists and is not a regular file");
  if (before.st_nlink != 1) return refuse("exists and has other hard links");
  // O_NONBLOCK: should a FIFO be swapped in, the open does not wait for a reader.
  fd.reset(::openat(cur.get(), leaf.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP) return refuse("is a symbolic link");
    return errnoStatus("timeline: cannot open " + path, errno);
  }
  struct stat after {};
  if (::fstat(fd.get(), &after) != 0) return errnoStatus("timeline: cannot inspect " + path, errno);
  if (!S_ISREG(after.st_mode) || after.st_dev != before.st_dev || after.st_ino != before.st_ino ||
      after.st_nlink != 1) {
    return refuse("changed while it was opened");
  }
  if (::ftruncate(fd.get(), 0) != 0) return errnoStatus("timeline: cannot truncate " + path, errno);
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return ConfinedFile{std::move(fd), path};
}

StatusOr<TraceFile> TraceFile::create(const std::string& dir, const std::string& requested) {
  ASSIGN_OR_RETURN(ConfinedFile cf, openTimelineFile(dir, requested));
  TraceFile f(std::move(cf.fd), std::move(cf.path));
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
