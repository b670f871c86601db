// MetricsHttpServer: the daemons' Prometheus endpoint (cpp-httplib).
//
//   GET /metrics   Registry::render(), "text/plain; version=0.0.4"
//   GET /healthz   200 "ok" (or 503 and the reason, from the health check)
//
// It runs on its own threads (an accept thread "metrics-http" and a small
// named worker pool); it only reads the registry's atomics, so it never
// touches a daemon's loop. stop() is bounded: idle keep-alive connections
// are dropped within a second and a slow client cannot hold a worker for
// more than the I/O timeout (2 s).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/metrics.h"
#include "common/status.h"

namespace httplib {
class Server;
}

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
  std::unique_ptr<httplib::Server> server_;
  struct ThreadDone;                  // the accept thread's end (for stop())
  std::shared_ptr<ThreadDone> done_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
  bool started_ = false;
};

}  // namespace kolo::metrics
