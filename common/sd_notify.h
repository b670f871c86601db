// A tiny, dependency-free sd_notify(3): tells the service manager about
// start-up and shutdown when a daemon runs as a systemd Type=notify unit.
//
// If $NOTIFY_SOCKET is set, each call sends one datagram to that AF_UNIX
// socket (a path, or an abstract name written with a leading '@'); without
// it every call is a no-op that returns OK, so daemons call these
// unconditionally. The message is newline-separated VAR=value assignments
// (see sd_notify(3)); STATUS= text has its newlines replaced by spaces so it
// cannot inject further assignments.
//
// Typical use in a daemon's main():
//   listen on every socket, then   sdNotifyReady("listening on /run/kolo/agent.sock");
//   on SIGTERM, before draining:    sdNotifyStopping();
// A failure is worth a warning in the log, never a reason to exit.
// Thread-safe: each call opens, sends on and closes its own socket.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace kolo {

// True when $NOTIFY_SOCKET is set and non-empty (running under a notify unit).
bool sdNotifyEnabled();

// Sends `state` ("READY=1\nSTATUS=...") verbatim to $NOTIFY_SOCKET.
// OK and does nothing when $NOTIFY_SOCKET is unset or empty.
Status sdNotify(std::string_view state);
// Same, to an explicit socket address ("/path" or "@abstract"); for tests and
// for callers that have already read and cleared the environment.
Status sdNotifyTo(std::string_view socket_address, std::string_view state);

// "READY=1", plus "STATUS=<status>" when `status` is not empty.
Status sdNotifyReady(std::string_view status = {});
// "STOPPING=1", plus "STATUS=<status>" when `status` is not empty.
Status sdNotifyStopping(std::string_view status = {});
// "STATUS=<status>" (shown by `systemctl status`).
Status sdNotifyStatus(std::string_view status);

}  // namespace kolo
