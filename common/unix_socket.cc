#include "common/unix_socket.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kolo {

Status makeDirs(const std::string& path, mode_t mode) {
  if (path.empty()) return okStatus();
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
      return errnoStatus("cannot create directory " + cur, errno);
    }
  }
  return okStatus();
}

static Status fillAddr(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr->sun_path)) {
    return invalidArgument("socket path too long (" + std::to_string(path.size()) +
                           " bytes, limit " + std::to_string(sizeof(addr->sun_path) - 1) +
                           "): " + path);
  }
  std::memcpy(addr->sun_path, path.c_str(), path.size());
  return okStatus();
}

StatusOr<gid_t> resolveGroup(const std::string& group) {
  if (!group.empty() && group.find_first_not_of("0123456789") == std::string::npos &&
      group.size() < 10) {
    return static_cast<gid_t>(std::stoul(group));  // a numeric gid, named in /etc/group or not
  }
  struct group* g = ::getgrnam(group.c_str());
  if (g == nullptr) {
    return invalidArgument("unknown group for the agent socket: '" + group +
                           "' (socket-group takes a group name from /etc/group or a numeric "
                           "gid; create it with `sudo groupadd " +
                           group + "`)");
  }
  return g->gr_gid;
}

namespace {

// Removes the socket file it was given unless released: a listener that
// failed half-way leaves nothing behind (issue 45).
class UnlinkUnlessReleased {
 public:
  explicit UnlinkUnlessReleased(std::string path) : path_(std::move(path)) {}
  ~UnlinkUnlessReleased() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

}  // namespace

StatusOr<UniqueFd> listenUnix(const std::string& path, mode_t mode, const std::string& group) {
  sockaddr_un addr;
  RETURN_IF_ERROR(fillAddr(path, &addr));
  // The group first: an unknown one fails before anything is created.
  gid_t gid = static_cast<gid_t>(-1);
  if (!group.empty()) {
    ASSIGN_OR_RETURN(gid, resolveGroup(group));
  }
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(makeDirs(path.substr(0, slash), 0755));
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errnoStatus("socket", errno);
  // A stale file from a previous run: refuse if something still listens there.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return invalidArgument(path + " exists and is not a socket");
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return unavailable("another agent is already listening on " + path);
    }
    ::unlink(path.c_str());
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return errnoStatus("bind " + path, errno);
  }
  UnlinkUnlessReleased cleanup(path);
  if (::chmod(path.c_str(), mode) != 0) return errnoStatus("chmod " + path, errno);
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return errnoStatus("chgrp " + path + " to group " + group, errno);
  }
  if (::listen(fd.get(), 128) != 0) return errnoStatus("listen " + path, errno);
  cleanup.release();
  return fd;
}

StatusOr<UniqueFd> connectUnix(const std::string& path) {
  sockaddr_un addr;
  RETURN_IF_ERROR(fillAddr(path, &addr));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoStatus("socket", errno);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    if (errno == EINTR) continue;
    return errnoStatus("connect " + path, errno);
  }
}

int probeUnix(const std::string& path) {
  sockaddr_un addr;
  if (!fillAddr(path, &addr).isOk()) return ENAMETOOLONG;
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

namespace {

std::string groupName(gid_t gid) {
  struct group* g = ::getgrgid(gid);
  return g != nullptr ? std::string(g->gr_name) : std::to_string(gid);
}

std::string octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

std::string explainSocketError(const std::string& path, int err) {
  struct stat st;
  switch (err) {
    case EACCES:
    case EPERM: {
      if (::stat(path.c_str(), &st) == 0) {
        std::string g = groupName(st.st_gid);
        if (st.st_gid == 0 || (st.st_mode & 0060) != 0060) {
          // Joining root (or a group without rw) is no fix: the agent runs
          // without its socket-group, or a failed start left the file.
          return "permission denied: the socket belongs to group " + g + " with mode " +
                 octal(st.st_mode) +
                 ": no users' group may use it; the agent was started "
                 "without socket-group (or a failed start left the file). Ask the node's "
                 "administrator to set socket-group in /etc/kolo/agent.conf and restart "
                 "kolo-agent (docs/security.md, \"Agent (node-local)\")";
        }
        return "permission denied: the socket belongs to group " + g + " (mode " +
               octal(st.st_mode) + "); join group " + g + " (sudo usermod -aG " + g +
               " $USER) and log in again";
      }
      std::string dir = path.substr(0, path.rfind('/'));
      if (!dir.empty() && ::stat(dir.c_str(), &st) == 0) {
        std::string g = groupName(st.st_gid);
        return "permission denied: cannot enter " + dir + " (group " + g + ", mode " +
               octal(st.st_mode) + "); join group " + g + " (sudo usermod -aG " + g +
               " $USER) and log in again";
      }
      return "permission denied; join the group of the agent socket and log in again";
    }
    case ENOENT:
      return "no such file: no kolo-agent has created its socket there (is kolo-agent running? "
             "systemctl status kolo-agent)";
    case ECONNREFUSED:
      return "nothing is listening: the socket file is left from a kolo-agent that no longer runs";
    case ENOTSOCK:
      return "not a socket";
    case ENAMETOOLONG:
      return "the path is too long for a Unix socket (limit " +
             std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes)";
    default:
      return std::strerror(err);
  }
}

Status setNonBlocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL, 0);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return errnoStatus("fcntl", errno);
  return okStatus();
}

StatusOr<PeerCred> peerCredentials(int fd) {
  struct ucred c;
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) {
    return errnoStatus("SO_PEERCRED", errno);
  }
  return PeerCred{c.pid, c.uid, c.gid};
}

}  // namespace kolo
