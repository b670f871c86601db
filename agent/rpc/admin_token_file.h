// The agent's admin token file, made by the agent itself where it is
// missing (--rpc-auth-token-create): a fresh random token, mode 0640, owned
// by the socket's group, so that the members of that group (and root) can
// read it and are the agent's admins, and nobody else is (issue 45).
#pragma once

#include <string>

#include "common/status.h"

namespace kolo {

// Creates `path` with a new token unless it exists (then nothing is
// changed). `group`: a group name or numeric gid ("" keeps the agent's).
Status createAdminTokenFileIfMissing(const std::string& path, const std::string& group);

}  // namespace kolo
