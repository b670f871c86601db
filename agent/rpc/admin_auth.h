// Who may make the agent's admin calls over gRPC: Drain and Timeline, the
// calls that change the agent or make it write a file.
//
//  - With --rpc-auth-token-file the call must carry the metadata
//    "authorization: Bearer <token>", from every peer, loopback included
//    (on a shared node the trainers' users reach loopback too). The token
//    is compared in constant time.
//  - Without a token only loopback peers are admitted (127.0.0.0/8, ::1,
//    ::ffff:127.0.0.0/104, or a Unix socket), and a refusal says so.
//
// The read-only calls (GetStatus, ListJobs, GetJob, Metrics, health) stay
// open. Pure functions: tests feed them peers and metadata directly.
#pragma once

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>
#include <string_view>

namespace kolo {

// True for a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000",
// "ipv6:%5B::1%5D:5000", "unix:/path") on this host's loopback.
bool isLoopbackPeer(std::string_view grpc_peer);

// Compares without returning early on the first difference.
bool constantTimeEquals(std::string_view a, std::string_view b);

// The decision for one admin call named `call` ("Drain"): OK, or
// UNAUTHENTICATED (token missing or wrong) / PERMISSION_DENIED (no token
// configured and the peer is not loopback) with a text that says what to
// do. `authorization` is the call's "authorization" metadata, if any.
grpc::Status checkAdminCall(std::string_view call, const std::string& required_token,
                            const std::optional<std::string>& authorization, std::string_view peer);

}  // namespace kolo
