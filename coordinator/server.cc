#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "coordinator/core.h"
#include "coordinator/persist/journal.h"
#include "coordinator/service.h"

namespace kolo::coordinator {

namespace {

StatusOr<std::string> readSmallFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalidArgument(what + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) return invalidArgument(what + ": cannot read " + path);
  std::string text = ss.str();
  if (text.size() > 1024 * 1024) return invalidArgument(what + ": " + path + " is too large");
  return text;
}

StatusOr<std::string> readPem(const std::string& what, const std::string& path) {
  ASSIGN_OR_RETURN(std::string pem, readSmallFile(what, path));
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return invalidArgument(what + ": " + path + " holds no PEM block (-----BEGIN ...)");
  }
  return pem;
}

// The bearer token: the file's content without surrounding whitespace.
StatusOr<std::string> readToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, readSmallFile("--auth-token-file", path));
  const char* ws = " \t\r\n";
  size_t first = text.find_first_not_of(ws);
  if (first == std::string::npos)
    return invalidArgument("--auth-token-file: " + path + " is empty");
  std::string token = text.substr(first, text.find_last_not_of(ws) - first + 1);
  if (token.find_first_of(ws) != std::string::npos || token.size() < 16) {
    return invalidArgument("--auth-token-file: " + path +
                           " must hold one token of at least 16 characters without spaces");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    log::get("coord")->warn("{} is readable by group or others (mode {:o}); chmod 600 it", path,
                            st.st_mode & 0777);
  }
  return token;
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const ServerOptions& o) {
  bool tls = !o.tls_cert_file.empty() || !o.tls_key_file.empty();
  if (!tls) {
    if (!o.tls_client_ca_file.empty()) {
      return invalidArgument("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
    return invalidArgument("--tls-cert and --tls-key go together");
  }
  ASSIGN_OR_RETURN(std::string cert, readPem("--tls-cert", o.tls_cert_file));
  ASSIGN_OR_RETURN(std::string key, readPem("--tls-key", o.tls_key_file));
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!o.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, readPem("--tls-client-ca", o.tls_client_ca_file));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

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

CoordinatorServer::CoordinatorServer(const ServerOptions& options, const Clock* clock,
                                     std::unique_ptr<persist::Journal> journal,
                                     std::string auth_token)
    : options_(options), journal_(std::move(journal)), loop_("coord-loop") {
  core_ = std::make_unique<Core>(&loop_, options.membership, clock, journal_.get(),
                                 options.watch_limits);
  core_->setCoalesceJobRecords(true);
  service_ = std::make_unique<CoordinatorService>(&loop_, core_.get(), &shutting_down_,
                                                  std::move(auth_token));
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

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   serverCredentials(options));
  std::string auth_token = options.auth_token;
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(auth_token, readToken(options.auth_token_file));
  }
  auto logger = log::get("coord");
  if (!auth_token.empty() && options.tls_cert_file.empty()) {
    logger->warn(
        "a bearer token is required but TLS is off: the token crosses the network in "
        "clear text (use --tls-cert/--tls-key)");
  }

  std::unique_ptr<persist::Journal> journal;
  persist::LoadedState loaded;
  if (!options.state_dir.empty()) {
    persist::JournalOptions jo;
    jo.dir = options.state_dir;
    jo.compact_records = std::max<uint64_t>(options.compact_records, 1);
    ASSIGN_OR_RETURN(journal, persist::Journal::open(jo, &loaded));
  }
  bool recovered = journal != nullptr && loaded.last_seq > 0;
  auto state = std::make_shared<persist::PersistedState>(std::move(loaded.state));

  std::unique_ptr<CoordinatorServer> s(
      new CoordinatorServer(options, clock, std::move(journal), std::move(auth_token)));
  s->loop_.start();
  Core* core = s->core_.get();
  auto started = s->loop_.call<bool>(
      [core, state, recovered] {
        if (recovered) {
          core->restoreOnLoop(*state);
          // Start from one fresh snapshot and an empty journal.
          core->sink()->compact(core->persistedStateOnLoop());
        }
        core->startOnLoop();
        return true;
      },
      std::chrono::seconds(30));
  if (!started.isOk()) return started.status();
  if (recovered) {
    logger->info("recovered {} agents (each with a fresh {} ms lease), {} jobs, {} keys from {}",
                 state->agents.size(), options.membership.lease_ms, state->jobs.size(),
                 state->kv.size(), options.state_dir);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same port
  // would silently share it. Fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(options.listen, credentials, &bound_port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || bound_port == 0) {
    s->server_.reset();
    s->shutdown(std::chrono::milliseconds(0));
    return unavailable("cannot listen on " + options.listen +
                       " (address in use, not an address of this host, or a TLS certificate/key "
                       "gRPC cannot use?)");
  }
  if (auto* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus("kolo.coord.Coordinator", true);
  }
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  s->port_ = bound_port;
  s->address_ = host + ":" + std::to_string(bound_port);
  logger->info("serving on {} (lease {} ms, heartbeat every {} ms; {}{}; {})", s->address_,
               options.membership.lease_ms, options.membership.heartbeat_interval_ms,
               options.tls_cert_file.empty() ? "plain text" : "TLS",
               options.tls_client_ca_file.empty() ? "" : " with client certificates",
               options.state_dir.empty() ? "state in memory only"
                                         : "state journaled in " + options.state_dir);
  return s;
}

CoordinatorServer::~CoordinatorServer() { shutdown(std::chrono::milliseconds(500)); }

StatusOr<std::pair<coord::ListAgentsReply, coord::ListJobsReply>>
CoordinatorServer::listAgentsAndJobs(std::chrono::milliseconds timeout) {
  Core* core = core_.get();
  return loop_.call<std::pair<coord::ListAgentsReply, coord::ListJobsReply>>(
      [core] { return std::make_pair(core->listAgentsOnLoop(), core->listJobsOnLoop()); }, timeout);
}

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
  // 4. Everything journaled so far reaches the disk.
  if (journal_ != nullptr) journal_->close();
  logger->info("shut down");
}

}  // namespace kolo::coordinator
