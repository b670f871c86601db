#include "agent/gpu/mps_probe.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/fd.h"

namespace kolo::gpu {

const char* mpsStateName(MpsState s) {
  switch (s) {
    case MpsState::kUp:
      return "up";
    case MpsState::kDown:
      return "down";
    case MpsState::kUnknown:
      break;
  }
  return "unknown";
}

std::string defaultMpsPipeDirectory() {
  const char* d = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return d != nullptr && *d != '\0' ? d : "/tmp/nvidia-mps";
}

namespace {

MpsProbe result(MpsState state, const std::string& dir, std::string reason) {
  MpsProbe p;
  p.state = state;
  p.pipe_dir = dir;
  p.reason = std::move(reason);
  return p;
}

}  // namespace

MpsProbe probeMps(const std::string& pipe_dir, std::chrono::milliseconds deadline) {
  struct stat st {};
  if (::stat(pipe_dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return result(MpsState::kDown, pipe_dir, "no pipe directory " + pipe_dir);
    return result(MpsState::kDown, pipe_dir,
                  "pipe directory " + pipe_dir + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode))
    return result(MpsState::kDown, pipe_dir, pipe_dir + " is not a directory");
  const std::string control = pipe_dir + "/control";
  if (::lstat(control.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return result(MpsState::kDown, pipe_dir, "no control socket in " + pipe_dir);
    return result(MpsState::kDown, pipe_dir, control + ": " + std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) return result(MpsState::kDown, pipe_dir, control + " is not a socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (control.size() >= sizeof(addr.sun_path)) {
    return result(MpsState::kUnknown, pipe_dir, "socket path too long to connect: " + control);
  }
  std::memcpy(addr.sun_path, control.c_str(), control.size() + 1);
  // A blocking connect bounded by SO_SNDTIMEO: a local unix connect answers
  // at once unless the daemon's backlog is full.
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid())
    return result(MpsState::kUnknown, pipe_dir, std::string("socket: ") + std::strerror(errno));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(deadline.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((deadline.count() % 1000) * 1000);
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return result(MpsState::kUp, pipe_dir, "");
  const int err = errno;
  if (err == ECONNREFUSED) {
    return result(MpsState::kDown, pipe_dir,
                  "connect refused on " + control + " (no control daemon listens)");
  }
  if (err == EAGAIN || err == EINPROGRESS || err == ETIMEDOUT) {
    return result(MpsState::kUnknown, pipe_dir,
                  "the control socket in " + pipe_dir + " did not accept within " +
                      std::to_string(deadline.count()) + " ms");
  }
  return result(MpsState::kDown, pipe_dir, "connect " + control + ": " + std::strerror(err));
}

}  // namespace kolo::gpu
