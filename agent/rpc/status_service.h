// gRPC `Agent` service (proto/agent.proto): handlers post to the agent loop
// and wait (bounded) for a snapshot; they never touch loop state directly.
// The calls that change the agent or write files (Drain, Timeline) need the
// --rpc-auth-token-file bearer token, or, when none is set, a loopback peer
// (admin_auth.h); the read-only ones stay open.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "common/config_tls.h"

namespace kolo {

class Agent;
// The service; its token comes from agent.options().rpc_security.
std::unique_ptr<grpc::Service> makeStatusService(Agent& agent);
// Plain text, TLS or mutual TLS per --rpc-tls-cert/--rpc-tls-key/--rpc-tls-client-ca.
std::shared_ptr<grpc::ServerCredentials> statusServiceCredentials(const GrpcServerSecurity& s);

}  // namespace kolo
