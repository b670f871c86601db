#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <cstdlib>

#include "common/log.h"
#include "coordinator/core.h"
#include "coordinator/service.h"

namespace kolo::coordinator {

Status splitHostPort(const std::string& address, std::string* host, int* port) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return invalidArgument("listen address '" + address + "' is not host:port");
  }
  std::string port_text = address.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || p < 0 || p > 65535) {
    return invalidArgument("listen address '" + address + "': bad port '" + port_text + "'");
  }
  *host = address.substr(0, colon);
  *port = static_cast<int>(p);
  return okStatus();
}

CoordinatorServer::CoordinatorServer(const ServerOptions& options, const Clock* clock)
    : options_(options), loop_("coord-loop") {
  core_ = std::make_unique<Core>(&loop_, options.membership, clock);
  service_ = std::make_unique<CoordinatorService>(&loop_, core_.get(), &shutting_down_);
}

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::start(const ServerOptions& options,
                                                                      const Clock* clock) {
  std::string host;
  int requested_port = 0;
  RETURN_IF_ERROR(splitHostPort(options.listen, &host, &requested_port));
  if (options.membership.lease_ms <= 0) return invalidArgument("lease-ms must be positive");
  if (options.membership.heartbeat_interval_ms <= 0 ||
      options.membership.heartbeat_interval_ms >= options.membership.lease_ms) {
    return invalidArgument("heartbeat-interval-ms (" +
                           std::to_string(options.membership.heartbeat_interval_ms) +
                           ") must be positive and below lease-ms (" +
                           std::to_string(options.membership.lease_ms) + ")");
  }

  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer(options, clock));
  s->loop_.start();
  Core* core = s->core_.get();
  auto started = s->loop_.call<bool>(
      [core] {
        core->startOnLoop();
        return true;
      },
      std::chrono::seconds(5));
  if (!started.isOk()) return started.status();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same port
  // would silently share it. Fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || bound_port == 0) {
    s->server_.reset();
    s->shutdown(std::chrono::milliseconds(0));
    return unavailable("cannot listen on " + options.listen +
                       " (address in use, or not an address of this host?)");
  }
  if (auto* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus("kolo.coord.Coordinator", true);
  }
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  s->port_ = bound_port;
  s->address_ = host + ":" + std::to_string(bound_port);
  log::get("coord")->info("serving on {} (lease {} ms, heartbeat every {} ms)", s->address_,
                          options.membership.lease_ms, options.membership.heartbeat_interval_ms);
  return s;
}

CoordinatorServer::~CoordinatorServer() { shutdown(std::chrono::milliseconds(500)); }

void CoordinatorServer::shutdown(std::chrono::milliseconds grace) {
  if (shut_down_.exchange(true)) return;
  shutting_down_.store(true);
  auto logger = log::get("coord");
  logger->info("shutting down");
  // 1. End streams and KV waits and refuse new ones, so handlers return promptly.
  Core* core = core_.get();
  auto ended = loop_.call<bool>(
      [core] {
        core->shutdownOnLoop();
        return true;
      },
      std::chrono::seconds(1));
  if (!ended.isOk()) logger->warn("shutdown: {}", ended.status().message());
  // 2. Stop gRPC: in-flight calls get `grace`, then they are cancelled.
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService()) health->Shutdown();
    logger->debug("shutdown: health service stopped");
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    logger->debug("shutdown: gRPC server stopped");
    server_.reset();
  }
  // 3. Nothing posts to the loop any more.
  loop_.stop();
  logger->info("shut down");
}

}  // namespace kolo::coordinator
