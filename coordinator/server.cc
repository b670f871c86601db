#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "coordinator/core.h"
#include "coordinator/ha/etcd_client.h"
#include "coordinator/ha/leader_election.h"
#include "coordinator/persist/etcd_sink.h"
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
StatusOr<std::string> readToken(const std::string& path, const std::string& flag) {
  ASSIGN_OR_RETURN(std::string text, readSmallFile(flag.c_str(), path));
  const char* ws = " \t\r\n";
  size_t first = text.find_first_not_of(ws);
  if (first == std::string::npos) return invalidArgument(flag + ": " + path + " is empty");
  std::string token = text.substr(first, text.find_last_not_of(ws) - first + 1);
  if (token.find_first_of(ws) != std::string::npos || token.size() < 16) {
    return invalidArgument(flag + ": " + path +
                           " must hold one token of at least 16 characters without spaces");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    log::get("coord")->warn("{} is readable by group or others (mode {:o}); chmod 600 it", path,
                            st.st_mode & 0777);
  }
  return token;
}

// Issue 47, attack 6: a fixed unprivileged port served in plain text can be
// bound by any local user while this coordinator is down, and the agents
// then send it their secrets and job tokens. (Port 0, kolorun's private
// coordinator, is picked at random for one job.)
void warnIfSquattable(const ServerOptions& o) {
  std::string host;
  int port = 0;
  if (!o.tls_cert_file.empty() || !splitHostPort(o.listen, &host, &port).isOk()) return;
  if (port == 0 || port < 1024) return;
  log::get("coord")->warn(
      "serving plain text on port {}: while this coordinator is down, any local user can bind "
      "the port and collect what agents send (agent secrets, job tokens); use TLS (--tls-cert "
      "with the agents' --coordinator-ca) or a port below 1024 (docs/security.md, \"Attacks on "
      "the coordinator\")",
      port);
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

Status checkMembershipTimes(const ServerOptions& options) {
  if (options.membership.lease_ms <= 0) return invalidArgument("lease-ms must be positive");
  if (options.membership.heartbeat_interval_ms <= 0 ||
      options.membership.heartbeat_interval_ms >= options.membership.lease_ms) {
    return invalidArgument("heartbeat-interval-ms (" +
                           std::to_string(options.membership.heartbeat_interval_ms) +
                           ") must be positive and below lease-ms (" +
                           std::to_string(options.membership.lease_ms) + ")");
  }
  return okStatus();
}

// Where the state lives: etcd (reachable within --etcd-connect-timeout-ms),
// a journal in --state-dir (loaded into *loaded), or neither (memory only).
Status openStateStore(const ServerOptions& options, std::unique_ptr<persist::Journal>* journal,
                      persist::LoadedState* loaded, std::unique_ptr<ha::EtcdClient>* etcd) {
  if (!options.etcd_endpoints.empty()) {
    if (!options.state_dir.empty()) {
      return invalidArgument(
          "--state-dir and --etcd-endpoints are mutually exclusive: the state "
          "is kept either in a directory or in etcd");
    }
    ha::EtcdOptions eo;
    eo.endpoints = options.etcd_endpoints;
    ASSIGN_OR_RETURN(*etcd, ha::EtcdClient::create(eo));
    log::get("coord")->info("waiting for etcd at {} (at most {} ms)", (*etcd)->endpointsText(),
                            options.etcd_connect_timeout_ms);
    RETURN_IF_ERROR(
        (*etcd)->waitReachable(std::chrono::milliseconds(options.etcd_connect_timeout_ms)));
  }
  if (!options.state_dir.empty()) {
    persist::JournalOptions jo;
    jo.dir = options.state_dir;
    jo.compact_records = std::max<uint64_t>(options.compact_records, 1);
    jo.compact_bytes = std::max<uint64_t>(options.compact_bytes, 1);
    ASSIGN_OR_RETURN(*journal, persist::Journal::open(jo, loaded));
  }
  return okStatus();
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
                                     std::unique_ptr<ha::EtcdClient> etcd, std::string auth_token)
    : options_(options), journal_(std::move(journal)), etcd_(std::move(etcd)), loop_("coord-loop") {
  persist::RecordSink* sink = journal_.get();
  if (etcd_ != nullptr) {
    persist::EtcdSinkOptions so;
    so.prefix = options.etcd_prefix;
    so.compact_records = std::max<uint64_t>(options.compact_records, 1);
    etcd_sink_ = std::make_unique<persist::EtcdSink>(etcd_.get(), so);
    sink = etcd_sink_.get();
    gate_ = std::make_unique<ha::LeaderGate>();
  }
  core_ = std::make_unique<Core>(&loop_, options.membership, clock, sink, options.watch_limits);
  core_->setCoalesceJobRecords(true);
  core_->setQuotas(options.quotas);
  service_ = std::make_unique<CoordinatorService>(&loop_, core_.get(), &shutting_down_,
                                                  std::move(auth_token), gate_.get(),
                                                  options.watch_writer_threads);
}

void CoordinatorServer::setHealth(bool serving) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (server_ == nullptr || shutting_down_.load()) return;
  if (auto* health = server_->GetHealthCheckService()) {
    // The overall service "" says the process is alive (liveness probes must
    // not restart a standby); kolo.coord.Coordinator says it serves (leader).
    health->SetServingStatus(true);
    health->SetServingStatus("kolo.coord.Coordinator", serving);
  }
}

// Starts the Core on the loop; a recovered state (journal or etcd) is
// restored first, every agent with a fresh lease as after a restart, and
// written back as one fresh snapshot.
Status CoordinatorServer::startCore(std::shared_ptr<persist::PersistedState> state, bool recovered,
                                    std::chrono::milliseconds timeout) {
  Core* core = core_.get();
  auto started = loop_.call<bool>(
      [core, state, recovered] {
        if (recovered) {
          core->restoreOnLoop(*state);
          core->sink()->compact(core->persistedStateOnLoop());
        }
        core->startOnLoop();
        return true;
      },
      timeout);
  return started.status();
}

Status CoordinatorServer::becomeLeader(int64_t create_revision) {
  auto logger = log::get("coord.ha");
  auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(persist::LoadedState loaded, etcd_sink_->load());
  etcd_sink_->arm(options_.etcd_prefix + "leader", create_revision, loaded.last_seq,
                  [this](const Status& st) { leadershipLost(st); });
  bool recovered = loaded.last_seq > 0;
  auto state = std::make_shared<persist::PersistedState>(std::move(loaded.state));
  if (shutting_down_.load()) return aborted("shutting down");
  RETURN_IF_ERROR(startCore(state, recovered, std::chrono::seconds(5)));
  if (lost_.load()) return aborted("leadership lost while loading the state");
  gate_->setLeaderAddress(options_.advertise_address);
  gate_->setLeading(true);
  setHealth(true);
  logger->info(
      "leading: serving on {} with the state from etcd {} ({} agents, each with a fresh {} ms "
      "lease, {} jobs, {} keys; loaded in {} ms)",
      address_, options_.etcd_prefix, state->agents.size(), options_.membership.lease_ms,
      state->jobs.size(), state->kv.size(),
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  return okStatus();
}

void CoordinatorServer::leadershipLost(const Status& why) {
  if (lost_.exchange(true)) return;
  // Stop serving at once; the process exits (main) and comes back as a standby.
  if (gate_ != nullptr) {
    gate_->setLeading(false);
    gate_->setLeaderAddress("");
  }
  setHealth(false);
  log::get("coord.ha")
      ->critical("no longer the leader ({}): answering as a standby and exiting", why.message());
  if (options_.on_leadership_lost) options_.on_leadership_lost(why);
}

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::start(const ServerOptions& options,
                                                                      const Clock* clock) {
  std::string host;
  int requested_port = 0;
  RETURN_IF_ERROR(splitHostPort(options.listen, &host, &requested_port));
  RETURN_IF_ERROR(checkMembershipTimes(options));

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   serverCredentials(options));
  std::string auth_token = options.auth_token;
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(auth_token, readToken(options.auth_token_file, "--auth-token-file"));
  }
  std::string operator_token = options.operator_token;
  if (!options.operator_token_file.empty()) {
    ASSIGN_OR_RETURN(operator_token,
                     readToken(options.operator_token_file, "--operator-token-file"));
  }
  auto logger = log::get("coord");
  if (!auth_token.empty() && options.tls_cert_file.empty()) {
    logger->warn(
        "a bearer token is required but TLS is off: the token crosses the network in "
        "clear text (use --tls-cert/--tls-key)");
  }
  warnIfSquattable(options);

  std::unique_ptr<persist::Journal> journal;
  persist::LoadedState loaded;
  std::unique_ptr<ha::EtcdClient> etcd;
  RETURN_IF_ERROR(openStateStore(options, &journal, &loaded, &etcd));
  bool recovered = journal != nullptr && loaded.last_seq > 0;
  auto state = std::make_shared<persist::PersistedState>(std::move(loaded.state));

  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer(
      options, clock, std::move(journal), std::move(etcd), std::move(auth_token)));
  s->service_->setOperatorToken(std::move(operator_token));
  s->loop_.start();
  // With etcd the Core starts when this coordinator is elected (becomeLeader).
  if (s->etcd_ == nullptr) RETURN_IF_ERROR(s->startCore(state, recovered, std::chrono::seconds(30)));
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
  // Thousands of agents each send a small message a second. With BDP
  // probing every message read starts a PING round trip and its timer (at
  // 4096 agents 46-50% of a core for heartbeats, 26-31% without); channelz
  // counts every message. Neither is worth it for a control plane.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
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
  bool wildcard = host == "0.0.0.0" || host.empty() || host == "[::]";
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  s->port_ = bound_port;
  s->address_ = host + ":" + std::to_string(bound_port);
  s->setHealth(s->etcd_ == nullptr);  // a standby is NOT_SERVING until elected
  if (s->etcd_ != nullptr) {
    Status st = s->startElection(host, wildcard);
    if (!st.isOk()) {
      s->shutdown(std::chrono::milliseconds(0));
      return st;
    }
  }
  s->logServing(wildcard);
  return s;
}

// Campaigns for leadership in etcd under the advertised address (the
// listening one, or this host's name for a wildcard); the Core starts when
// this coordinator is elected (becomeLeader).
Status CoordinatorServer::startElection(const std::string& host, bool wildcard) {
  if (options_.advertise_address.empty()) {
    char name[256] = {};
    std::string h = host;
    if (wildcard && ::gethostname(name, sizeof(name) - 1) == 0) h = name;
    options_.advertise_address = h + ":" + std::to_string(port_);
  }
  ha::ElectionOptions eo;
  eo.key = options_.etcd_prefix + "leader";
  eo.value = options_.advertise_address;
  eo.ttl = std::chrono::milliseconds(options_.election_ttl_ms > 0 ? options_.election_ttl_ms
                                                                  : options_.membership.lease_ms);
  CoordinatorServer* self = this;
  ha::ElectionCallbacks cb;
  cb.elected = [self](int64_t revision) { return self->becomeLeader(revision); };
  cb.lost = [self](const Status& why) { self->leadershipLost(why); };
  cb.renewed = [self](int64_t serve_until_ms) { self->gate_->setServeUntil(serve_until_ms); };
  // The standby answer names the leader the election thread last read.
  cb.leader_seen = [self](const std::string& leader) {
    if (!self->lost_.load()) self->gate_->setLeaderAddress(leader);
  };
  election_ = std::make_unique<ha::LeaderElection>(etcd_.get(), eo, std::move(cb));
  return election_->start();
}

// What it listens on, and (for a wildcard) the local address it was reached
// at in tests, so the log never claims loopback only.
void CoordinatorServer::logServing(bool wildcard) const {
  const ServerOptions& options = options_;
  const std::string listening = wildcard ? "every interface, port " + std::to_string(port_) +
                                               " (local address " + address_ + ")"
                                         : address_;
  log::get("coord")->info(
      "serving on {} (lease {} ms, heartbeat every {} ms, {} ms on a stream; {}{}; {})", listening,
      options.membership.lease_ms, options.membership.heartbeat_interval_ms,
      options.membership.streamHeartbeatIntervalMs(),
      options.tls_cert_file.empty() ? "plain text" : "TLS",
      options.tls_client_ca_file.empty() ? "" : " with client certificates",
      !options.etcd_endpoints.empty()
          ? "state in etcd " + etcd_->endpointsText() + " " + options.etcd_prefix +
                ", advertised as " + options.advertise_address + " (standby until elected)"
      : options.state_dir.empty() ? "state in memory only"
                                  : "state journaled in " + options.state_dir);
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
  service_->endHeartbeatStreams(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
  // 2. Stop gRPC: in-flight calls get `grace`, then they are cancelled.
  if (server_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      if (auto* health = server_->GetHealthCheckService()) health->Shutdown();
    }
    logger->debug("shutdown: health service stopped");
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    logger->debug("shutdown: gRPC server stopped");
    server_.reset();
  }
  // 3. Nothing posts to the loop any more.
  loop_.stop();
  // 4. Everything journaled so far reaches the disk (or etcd).
  if (journal_ != nullptr) journal_->close();
  if (etcd_sink_ != nullptr) etcd_sink_->close();
  // 5. Resign: revoking the lease deletes the election key, so a standby
  // takes over at once instead of after the TTL.
  if (election_ != nullptr) election_->stop();
  logger->info("shut down");
}

}  // namespace kolo::coordinator
