// CoordinatorServer: the composition root of kolo-coordinator. It owns the
// loop thread, the state (Core), the gRPC service and server (with
// grpc.health.v1), and shuts them down in order. Embeddable: kolorun can
// run a coordinator in-process with start().
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "common/status.h"
#include "coordinator/ha/leader_gate.h"
#include "coordinator/membership/clock.h"
#include "coordinator/membership/membership.h"
#include "coordinator/quotas.h"
#include "coordinator/watch_hub.h"

namespace grpc {
class Server;
}

namespace kolo::coordinator {

class Core;
class CoordinatorService;
namespace persist {
class Journal;
class EtcdSink;
class RecordSink;
struct PersistedState;
}  // namespace persist
namespace ha {
class EtcdClient;
class LeaderElection;
}  // namespace ha

struct ServerOptions {
  std::string listen = "0.0.0.0:7470";  // host:port; port 0 picks a free one
  MembershipOptions membership;
  // WatchJob streams served at once (RESOURCE_EXHAUSTED past them).
  WatchLimits watch_limits;
  // Tenant quotas (issue 47): watch streams per token and peer, jobs, keys.
  Quotas quotas;
  // Threads that write the Worlds a change pushes (0: min(8, max(2, cores))).
  int watch_writer_threads = 0;

  // Durability: empty = in memory only. Otherwise the state is journaled in
  // this directory and recovered from it at start (coordinator/persist/).
  std::string state_dir;
  uint64_t compact_records = 10000;  // journal records between snapshots
  uint64_t compact_bytes = uint64_t{64} << 20;  // or journal bytes between snapshots

  // High availability (coordinator/ha/, docs/coordinator.md "High
  // availability on etcd"): non-empty = the state is kept in etcd under
  // `etcd_prefix` instead of a state dir, and the coordinators sharing that
  // prefix elect one leader; the others answer UNAVAILABLE "standby: ...".
  std::vector<std::string> etcd_endpoints;
  std::string etcd_prefix = "/kolo/default/";
  int64_t election_ttl_ms = 0;              // 0: membership.lease_ms
  std::string advertise_address;            // "": listen host (hostname if wildcard) + bound port
  int64_t etcd_connect_timeout_ms = 10000;  // etcd unreachable at start: give up after this
  // Called once (any thread) when this coordinator led and stopped leading:
  // it already answers as a standby; kolo-coordinator then exits 3.
  std::function<void(const Status&)> on_leadership_lost;

  // Transport security (PEM files). tls_cert + tls_key: serve TLS only.
  // tls_client_ca too: mutual TLS, every client must present a certificate
  // signed by that CA.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Bearer token required (metadata "authorization: Bearer <token>") on the
  // mutating calls RegisterAgent, JoinJob, LeaveJob, KvPut. Read from the
  // file at start (surrounding whitespace trimmed); `auth_token` is used
  // when no file is given (embedding). Empty: no token required.
  std::string auth_token_file;
  std::string auth_token;
  // The operator credential (issue 47): RegisterAgent carrying it as the
  // metadata "x-kolo-operator-token" may register a live agent's id
  // without that agent's secret (ending the old incarnation's jobs at once).
  // Read from the file at start; `operator_token` when no file is given.
  // Empty: only the agent's own secret re-registers a live id.
  std::string operator_token_file;
  std::string operator_token;
};

class CoordinatorServer {
 public:
  // Binds, starts serving, and marks the health service SERVING.
  static StatusOr<std::unique_ptr<CoordinatorServer>> start(
      const ServerOptions& options, const Clock* clock = SystemClock::get());
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // The bound address as clients should dial it: the listen host (a wildcard
  // host becomes 127.0.0.1) and the actual port.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // What ListAgents and ListJobs return, read on the loop (bounded wait):
  // the coordinator's own /metrics gauges, whatever its port asks for (TLS,
  // client certificates).
  StatusOr<std::pair<coord::ListAgentsReply, coord::ListJobsReply>> listAgentsAndJobs(
      std::chrono::milliseconds timeout);

  // With etcd: whether this coordinator leads now (always true without).
  bool isLeader() const { return gate_ == nullptr || gate_->leading(); }

  // Ends watch streams and KV waits, stops accepting RPCs, cancels what is
  // still running after `grace`, stops the loop. Idempotent; thread-safe.
  void shutdown(std::chrono::milliseconds grace);

 private:
  CoordinatorServer(const ServerOptions& options, const Clock* clock,
                    std::unique_ptr<persist::Journal> journal, std::unique_ptr<ha::EtcdClient> etcd,
                    std::string auth_token);
  // Election callbacks (election threads).
  Status becomeLeader(int64_t create_revision);
  Status startCore(std::shared_ptr<persist::PersistedState> state, bool recovered,
                   std::chrono::milliseconds timeout);
  void leadershipLost(const Status& why);
  void setHealth(bool serving);
  Status startElection(const std::string& host, bool wildcard);
  void logServing(bool wildcard) const;

  ServerOptions options_;
  std::unique_ptr<persist::Journal> journal_;  // null: in memory only; outlives core_
  std::unique_ptr<ha::EtcdClient> etcd_;       // null: no etcd
  std::unique_ptr<persist::EtcdSink> etcd_sink_;
  std::unique_ptr<ha::LeaderGate> gate_;  // null: no etcd (always serving)
  std::unique_ptr<ha::LeaderElection> election_;
  std::atomic<bool> lost_{false};
  std::mutex health_mu_;
  EventLoop loop_;
  std::unique_ptr<Core> core_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> shut_down_{false};
  std::string address_;
  int port_ = 0;
};

// Splits "host:port" ("[::1]:7470" too). InvalidArgument if malformed.
Status splitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace kolo::coordinator
