// One bounded TCP connect, to tell "nothing listens" from "something
// listens but the RPC failed" (a TLS mismatch, say) in error messages.
#pragma once

#include <chrono>
#include <string>

namespace kolo {

// Whether a TCP connection to "host:port" ("[v6]:port") opens within
// `timeout`: 0, else the errno of the attempt (ETIMEDOUT for no answer,
// EHOSTUNREACH for a name that does not resolve, EINVAL for an address
// without a port).
int tcpConnectError(const std::string& address, std::chrono::milliseconds timeout);

}  // namespace kolo
