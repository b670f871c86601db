#include "common/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/worker_pool.h"

namespace kolo::metrics {

namespace {

constexpr int kWorkers = 2;
// I/O bounds: they also bound stop() (a worker finishes its connection
// within them once the server stops).
constexpr int kKeepAliveSeconds = 1;
constexpr int kIoTimeoutSeconds = 2;

// httplib's connection queue on a kolo::WorkerPool, so the threads are
// named ("metrics-http-N"); shutdown() drains the queue and joins.
class NamedTaskQueue : public httplib::TaskQueue {
 public:
  explicit NamedTaskQueue(int threads)
      : pool_(std::make_unique<WorkerPool>("metrics-http", threads)) {}
  void enqueue(std::function<void()> fn) override { pool_->submit(std::move(fn)); }
  void shutdown() override { pool_.reset(); }

 private:
  std::unique_ptr<WorkerPool> pool_;
};

// SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would
// let a second server bind the same port silently.
void socketOptions(int sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

}  // namespace

struct MetricsHttpServer::ThreadDone {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

StatusOr<ListenAddress> parseListenAddress(const std::string& address) {
  auto bad = [&](const char* why) {
    return invalidArgument("metrics listen address '" + address + "': " + why +
                           " (expected host:port, [v6]:port or :port)");
  };
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  ListenAddress out;
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("unbalanced brackets");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad("an IPv6 address needs brackets");
  }
  out.host = host.empty() ? "0.0.0.0" : host;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad("the port is not a number");
  }
  out.port = std::stoi(port);
  if (out.port > 65535) return bad("the port is out of range");
  return out;
}

MetricsHttpServer::MetricsHttpServer(const Registry& registry, std::string listen_address,
                                     HealthCheck health)
    : registry_(registry), listen_address_(std::move(listen_address)), health_(std::move(health)) {}

MetricsHttpServer::~MetricsHttpServer() { stop(); }

std::string MetricsHttpServer::boundAddress() const {
  if (host_.find(':') != std::string::npos) return "[" + host_ + "]:" + std::to_string(port_);
  return host_ + ":" + std::to_string(port_);
}

Status MetricsHttpServer::start() {
  if (started_) return invalidArgument("metrics HTTP server already started");
  ASSIGN_OR_RETURN(ListenAddress addr, parseListenAddress(listen_address_));

  auto server = std::make_unique<httplib::Server>();
  server->new_task_queue = [] { return new NamedTaskQueue(kWorkers); };
  server->set_socket_options(socketOptions);
  server->set_keep_alive_timeout(kKeepAliveSeconds);
  server->set_read_timeout(kIoTimeoutSeconds, 0);
  server->set_write_timeout(kIoTimeoutSeconds, 0);

  const Registry* registry = &registry_;
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->render(), Registry::kContentType);
  });
  HealthCheck health = health_;
  server->Get("/healthz", [health](const httplib::Request&, httplib::Response& res) {
    Status st = health ? health() : okStatus();
    if (st.isOk()) {
      res.set_content("ok\n", "text/plain; charset=utf-8");
    } else {
      res.status = 503;
      res.set_content(st.toString() + "\n", "text/plain; charset=utf-8");
    }
  });

  errno = 0;
  int port = addr.port;
  if (addr.port == 0) {
    port = server->bind_to_any_port(addr.host);
  } else if (!server->bind_to_port(addr.host, addr.port)) {
    port = -1;
  }
  if (port <= 0) {
    int err = errno;
    std::string why = err != 0 ? std::string(": ") + std::strerror(err) : std::string();
    return unavailable("metrics HTTP server cannot listen on " + listen_address_ + why);
  }

  host_ = addr.host;
  port_ = port;
  server_ = std::move(server);
  started_ = true;
  auto done = std::make_shared<ThreadDone>();
  httplib::Server* srv = server_.get();
  thread_ = std::thread([srv, done] {
    log::setThreadName("metrics-http");
    srv->listen_after_bind();
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  done_ = done;
  log::get("metrics")->info("serving /metrics and /healthz on http://{}/", boundAddress());
  return okStatus();
}

void MetricsHttpServer::stop() {
  if (!thread_.joinable()) return;
  auto done = done_;
  // httplib's stop() only works once the accept loop runs (is_running());
  // wait for that (or for the thread to end on its own), then stop once.
  {
    std::unique_lock<std::mutex> lock(done->mu);
    while (!done->done && !server_->is_running()) {
      done->cv.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  if (server_->is_running()) server_->stop();
  auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(done->mu);
    if (!done->cv.wait_for(lock, std::chrono::seconds(2 * kIoTimeoutSeconds + 1),
                           [&] { return done->done; })) {
      log::get("metrics")->warn("metrics HTTP server: a connection is still open after {} s",
                                2 * kIoTimeoutSeconds + 1);
    }
  }
  thread_.join();
  log::get("metrics")->debug(
      "metrics HTTP server stopped in {} ms",
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

}  // namespace kolo::metrics
