// gRPC `Agent` service (proto/agent.proto): handlers post to the agent loop
// and wait (bounded) for a snapshot; they never touch loop state directly.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

namespace kolo {

class Agent;
std::unique_ptr<grpc::Service> makeStatusService(Agent& agent);

}  // namespace kolo
