// MetricsHttpServer: the daemons' Prometheus endpoint.
//
//   GET /metrics   Registry::render(), "text/plain; version=0.0.4"
//   GET /healthz   200 "ok" (or 503 and the reason, from the health check)
//
// One thread ("metrics-http") polls the listening socket and every
// connection, non-blocking; it only reads the registry's atomics, so it
// never touches a daemon's loop. No client can hold it (docs/security.md,
// "Health and metrics under slow clients"): a request must arrive whole
// within 2 s of connecting and its answer leave within 2 s more, headers
// are at most 8 KiB, and with 64 connections open the oldest is closed for
// a new one, so a probe (Kubernetes' liveness, Prometheus) is answered at
// once whatever slow clients hold. One request per connection
// (`Connection: close`). stop() returns within a poll period.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/metrics.h"
#include "common/status.h"

namespace kolo::metrics {

// "host:port", "[v6]:port" or ":port" (= all interfaces, 0.0.0.0); port 0
// picks a free one. InvalidArgument when it does not parse.
struct ListenAddress {
  std::string host;
  int port = 0;
};
StatusOr<ListenAddress> parseListenAddress(const std::string& address);

class MetricsHttpServer {
 public:
  // Health check for /healthz, called on a server thread: it must be
  // thread-safe (read atomics, not loop state). OK: 200 "ok"; an error:
  // 503 with the status text. Without one /healthz always answers 200.
  using HealthCheck = std::function<Status()>;

  // `registry` must outlive the server.
  MetricsHttpServer(const Registry& registry, std::string listen_address,
                    HealthCheck health = nullptr);
  ~MetricsHttpServer();  // stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds (synchronously: an address in use fails here, with Unavailable)
  // and starts serving. Once only.
  Status start();
  // Stops accepting, lets in-flight requests finish and joins the threads.
  // Idempotent.
  void stop();

  // The bound port (the real one when asked for port 0); 0 before start().
  int port() const { return port_; }
  // "host:port" as bound, e.g. "127.0.0.1:41234".
  std::string boundAddress() const;

 private:
  const Registry& registry_;
  std::string listen_address_;
  HealthCheck health_;
  struct Conn;
  void serve();
  void answer(Conn& c);
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop()
  std::thread thread_;
  std::string host_;
  int port_ = 0;
  bool started_ = false;
};

}  // namespace kolo::metrics
