// Unix domain socket helpers for the agent's local IPC.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace kolo {

// Creates the parent directory if needed, removes a stale socket file, binds,
// chmods to `mode` (and chgrp to `group` when non-empty) and listens.
// A socket-group value: a group name, or a numeric gid.
StatusOr<gid_t> resolveGroup(const std::string& group);
StatusOr<UniqueFd> listenUnix(const std::string& path, mode_t mode, const std::string& group);
// Connects (blocking). Errors name the path.
StatusOr<UniqueFd> connectUnix(const std::string& path);
Status setNonBlocking(int fd);
// Connects to `path` and closes again: 0 when something listens there, else
// the errno of connect (ENAMETOOLONG for a path too long).
int probeUnix(const std::string& path);
// Why connecting to the agent socket `path` failed with `err`, for people:
// "permission denied: the socket belongs to group kolo (mode 0660); join
// group kolo and log in again", "no such file: ...", "nothing is listening: ...".
std::string explainSocketError(const std::string& path, int err);

struct PeerCred {
  pid_t pid = -1;
  uid_t uid = 0;
  gid_t gid = 0;
};
StatusOr<PeerCred> peerCredentials(int fd);

// mkdir -p
Status makeDirs(const std::string& path, mode_t mode);

}  // namespace kolo
