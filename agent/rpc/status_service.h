// gRPC `Agent` service (proto/agent.proto): handlers post to the agent loop
// and wait (bounded) for a snapshot; they never touch loop state directly.
// With --rpc-auth-token-file, the calls that change the agent (Drain,
// Timeline) need the bearer token; the read-only ones stay open.
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
