// Who serves a plain-text coordinator address on this host (issue 47, port
// squatting): while the coordinator is down any local user may bind its
// port and collect what agents send it (the agent secret, job tokens, the
// bearer token). Before every call that carries them over plain text, the
// agent looks up the process listening on that port of this host
// (/proc/net/tcp, /proc/net/tcp6) and sends nothing unless its owner is
// root, the agent's own user or --coordinator-uid. With TLS the
// certificate is the check instead; a coordinator on another host is not
// in this host's tables (TLS is the only check there: docs/security.md).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "common/status.h"

namespace kolo {

// The uid owning the TCP socket listening on `port` of this host at `host`
// (an IPv4 or IPv6 literal, or "localhost"), or listening on every address;
// nullopt when no socket of this host listens there (or `host` is not a
// literal of this host). `proc_net` is where tcp and tcp6 are read (tests).
std::optional<uid_t> localListenerUid(const std::string& host, int port,
                                      const std::string& proc_net = "/proc/net");

// OK when `address` ("host:port", "[v6]:port") is served by root, by this
// process's user or by `allowed_uid` (>= 0), or by no socket of this host;
// PermissionDenied naming the owner and the knobs otherwise.
Status checkPlainCoordinator(const std::string& address, int64_t allowed_uid,
                             const std::string& proc_net = "/proc/net");

}  // namespace kolo
