#include "agent/backends/kv_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/fd.h"

namespace kolo {

using Clock = std::chrono::steady_clock;

Status InMemoryKvStore::put(const std::string& key, std::string_view value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::string(value);
  }
  cv_.notify_all();
  return okStatus();
}

StatusOr<std::string> InMemoryKvStore::get(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto found = [&] { return values_.count(key) != 0; };
  if (!cv_.wait_for(lock, timeout, found)) {
    return timedOut("key '" + key + "' did not appear within " + std::to_string(timeout.count()) +
                    " ms");
  }
  return values_[key];
}

std::string FileKvStore::fileNameForKey(const std::string& key) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  // Never "", "." or a name that looks like one of our hidden temporary files.
  if (out.empty() || out[0] == '.') return "%" + out;
  return out;
}

namespace {

Status writeAll(int fd, std::string_view data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("write " + path, errno);
    }
    off += static_cast<size_t>(n);
  }
  return okStatus();
}

// Reads the whole file; a missing file is not an error but `*exists = false`.
Status readFile(const std::string& path, bool* exists, std::string* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      *exists = false;
      return okStatus();
    }
    return errnoStatus("open " + path, errno);
  }
  *exists = true;
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("read " + path, errno);
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  return okStatus();
}

}  // namespace

Status FileKvStore::put(const std::string& key, std::string_view value) {
  const std::string name = fileNameForKey(key);
  const std::string path = dir_ + "/" + name;
  const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." + name;
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return errnoStatus("create " + tmp, errno);
    RETURN_IF_ERROR(writeAll(fd.get(), value, tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errnoStatus("rename " + tmp + " -> " + path, err);
  }
  return okStatus();
}

StatusOr<std::string> FileKvStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string name = fileNameForKey(key);
  const std::string path = dir_ + "/" + name;
  const auto deadline = Clock::now() + timeout;
  // Watch before the first look so a rename between the look and the wait is not missed.
  UniqueFd ino(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!ino.valid()) return errnoStatus("inotify_init1", errno);
  if (::inotify_add_watch(ino.get(), dir_.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE) < 0) {
    return errnoStatus("inotify_add_watch " + dir_, errno);
  }
  std::string value;
  for (;;) {
    bool exists = false;
    RETURN_IF_ERROR(readFile(path, &exists, &value));
    if (exists) return value;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return timedOut("key '" + key + "' did not appear in " + dir_ + " within " +
                      std::to_string(timeout.count()) + " ms");
    }
    pollfd pfd{ino.get(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(left.count()) + 1);
    if (rc < 0 && errno != EINTR) return errnoStatus("poll inotify", errno);
    char drain[4096];
    while (::read(ino.get(), drain, sizeof drain) > 0) {
    }
  }
}

}  // namespace kolo
