#include "agent/rpc/admin_token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/fd.h"
#include "common/log.h"
#include "common/unix_socket.h"

namespace kolo {

namespace {

StatusOr<std::string> randomToken() {
  UniqueFd in(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return errnoStatus("open /dev/urandom", errno);
  unsigned char bytes[24];
  if (::read(in.get(), bytes, sizeof bytes) != static_cast<ssize_t>(sizeof bytes)) {
    return internalError("cannot read 24 random bytes from /dev/urandom");
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

}  // namespace

Status createAdminTokenFileIfMissing(const std::string& path, const std::string& group) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return okStatus();
  const std::string what = "--rpc-auth-token-create: ";
  gid_t gid = static_cast<gid_t>(-1);
  if (!group.empty()) {
    ASSIGN_OR_RETURN(gid, resolveGroup(group));
  }
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0)
    RETURN_IF_ERROR(makeDirs(path.substr(0, slash), 0755));
  ASSIGN_OR_RETURN(std::string token, randomToken());
  const std::string tmp = path + ".new";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return errnoStatus(what + "cannot create " + tmp, errno);
  if (gid != static_cast<gid_t>(-1) && ::fchown(fd.get(), static_cast<uid_t>(-1), gid) != 0) {
    return errnoStatus(what + "chgrp " + tmp + " to " + group, errno);
  }
  if (::fchmod(fd.get(), 0640) != 0) return errnoStatus(what + "chmod " + tmp, errno);
  const std::string line = token + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return errnoStatus(what + "write " + tmp, errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return errnoStatus(what + "rename to " + path, errno);
  log::get("agent.rpc")
      ->info("made the admin token file {} (mode 0640{}): its readers are this agent's admins",
             path, group.empty() ? "" : ", group " + group);
  return okStatus();
}

}  // namespace kolo
