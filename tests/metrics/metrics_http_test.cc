// The metrics HTTP endpoint, scraped for real over loopback: with
// httplib::Client and with a plain socket (the bytes on the wire).
#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kolo::metrics {
namespace {

// Sample lines "name{labels} value" -> value; comment lines checked for form.
std::map<std::string, std::string> parseExposition(const std::string& text) {
  std::map<std::string, std::string> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) << line;
      continue;
    }
    auto sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    if (sp == std::string::npos) continue;
    samples[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return samples;
}

// A plain HTTP/1.1 GET with Connection: close; every wait bounded (5 s).
std::string rawGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      char buf[4096];
      for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        pollfd p{fd, POLLIN, 0};
        if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  return out;
}

std::unique_ptr<httplib::Client> client(int port) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_connection_timeout(5, 0);
  c->set_read_timeout(5, 0);
  c->set_write_timeout(5, 0);
  return c;
}

TEST(ListenAddress, Parses) {
  auto a = parseListenAddress("0.0.0.0:7472");
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a->host, "0.0.0.0");
  EXPECT_EQ(a->port, 7472);
  a = parseListenAddress(":9100");
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a->host, "0.0.0.0");
  EXPECT_EQ(a->port, 9100);
  a = parseListenAddress("[::1]:0");
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 0);
  for (const char* bad : {"", "7472", "host:", "host:abc", "host:70000", "::1:80", "[::1:80",
                          "h:-1", "h:123456"}) {
    auto r = parseListenAddress(bad);
    EXPECT_FALSE(r.isOk()) << bad;
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    }
  }
}

TEST(MetricsHttp, ScrapeOverLoopback) {
  Registry reg;
  Counter& c = reg.counter("kolo_collectives_total", "Collectives completed.",
                           {{"op", "allreduce"}, {"dtype", "float32"}, {"status", "ok"}});
  Gauge& clients = reg.gauge("kolo_clients", "Connected trainers.");
  Histogram& lat = reg.histogram("kolo_collective_latency_seconds", "Latency.", {}, {0.5, 1});
  c.inc(7);
  clients.set(3);
  lat.observe(0.25);

  MetricsHttpServer server(reg, "127.0.0.1:0");
  ASSERT_TRUE(server.start().isOk());
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.boundAddress(), "127.0.0.1:" + std::to_string(server.port()));

  auto cli = client(server.port());
  auto res = cli->Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, reg.render());
  auto samples = parseExposition(res->body);
  EXPECT_EQ(samples["kolo_collectives_total{dtype=\"float32\",op=\"allreduce\",status=\"ok\"}"],
            "7");
  EXPECT_EQ(samples["kolo_clients"], "3");
  EXPECT_EQ(samples["kolo_collective_latency_seconds_bucket{le=\"0.5\"}"], "1");
  EXPECT_EQ(samples["kolo_collective_latency_seconds_bucket{le=\"+Inf\"}"], "1");
  EXPECT_EQ(samples["kolo_collective_latency_seconds_sum"], "0.25");
  EXPECT_EQ(samples["kolo_collective_latency_seconds_count"], "1");

  // Updates show up in the next scrape, here read off a plain socket.
  c.inc();
  clients.dec();
  std::string raw = rawGet(server.port(), "/metrics");
  ASSERT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw;
  auto body_at = raw.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos);
  EXPECT_NE(raw.substr(0, body_at).find("version=0.0.4"), std::string::npos) << raw;
  samples = parseExposition(raw.substr(body_at + 4));
  EXPECT_EQ(samples["kolo_collectives_total{dtype=\"float32\",op=\"allreduce\",status=\"ok\"}"],
            "8");
  EXPECT_EQ(samples["kolo_clients"], "2");

  res = cli->Get("/nothing-here");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  server.stop();
}

TEST(MetricsHttp, HealthzFollowsTheHealthCheck) {
  Registry reg;
  std::atomic<bool> healthy{true};
  MetricsHttpServer server(reg, "127.0.0.1:0", [&]() -> Status {
    if (healthy.load()) return okStatus();
    return unavailable("coordinator unreachable");
  });
  ASSERT_TRUE(server.start().isOk());
  auto cli = client(server.port());
  auto res = cli->Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");
  healthy = false;
  res = cli->Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_NE(res->body.find("coordinator unreachable"), std::string::npos) << res->body;

  // Without a health check /healthz is always 200.
  MetricsHttpServer plain(reg, "127.0.0.1:0");
  ASSERT_TRUE(plain.start().isOk());
  res = client(plain.port())->Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(MetricsHttp, PortInUseAndBadAddressFailAtStart) {
  Registry reg;
  MetricsHttpServer first(reg, "127.0.0.1:0");
  ASSERT_TRUE(first.start().isOk());
  MetricsHttpServer second(reg, "127.0.0.1:" + std::to_string(first.port()));
  Status st = second.start();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.toString();
  EXPECT_EQ(second.port(), 0);
  second.stop();  // never started: a no-op

  MetricsHttpServer bad(reg, "127.0.0.1");
  EXPECT_EQ(bad.start().code(), Code::kInvalidArgument);

  // The first one still serves, and start() twice is refused.
  EXPECT_EQ(first.start().code(), Code::kInvalidArgument);
  auto res = client(first.port())->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(MetricsHttp, StopIsBoundedWithAnIdleKeepAliveConnection) {
  Registry reg;
  reg.counter("kolo_stalls_total", "Stalls.").inc();
  auto server = std::make_unique<MetricsHttpServer>(reg, "127.0.0.1:0");
  ASSERT_TRUE(server->start().isOk());
  int port = server->port();
  auto cli = client(port);
  cli->set_keep_alive(true);
  auto res = cli->Get("/metrics");  // the connection stays open afterwards
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);

  auto t0 = std::chrono::steady_clock::now();
  server->stop();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(4));
  server->stop();  // idempotent
  server.reset();

  // Nothing listens any more.
  EXPECT_EQ(rawGet(port, "/metrics"), "");
}

TEST(MetricsHttp, StopRightAfterStart) {
  Registry reg;
  for (int i = 0; i < 20; ++i) {
    MetricsHttpServer server(reg, "127.0.0.1:0");
    ASSERT_TRUE(server.start().isOk());
    server.stop();
  }
}

int connectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Slow-loris (issue 47): 80 connections that trickle a request byte by
// byte, more than the server keeps open, while /healthz is probed as
// Kubernetes does (1 s deadline): every probe is answered, well within it,
// and a trickling connection is closed by its request deadline (2 s).
TEST(MetricsHttp, SlowClientsCannotStarveTheHealthProbe) {
  Registry reg;
  MetricsHttpServer server(reg, "127.0.0.1:0", [] { return okStatus(); });
  ASSERT_TRUE(server.start().isOk());
  std::vector<int> slow;
  for (int i = 0; i < 80; ++i) {
    int fd = connectLoopback(server.port());
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (size_t k = 0; !done; ++k) {
      for (int fd : slow) (void)::send(fd, &req[k % req.size()], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  double worst = 0;
  for (int probe = 0; probe < 6; ++probe) {
    auto t0 = std::chrono::steady_clock::now();
    std::string r = rawGet(server.port(), "/healthz");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    worst = std::max(worst, s);
    EXPECT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u) << "probe " << probe << ": '" << r << "'";
    EXPECT_LT(s, 1.0) << "probe " << probe;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::printf("slowest of 6 /healthz probes beside 80 slow clients: %.1f ms\n", worst * 1e3);
  // Every slow connection was closed by now (request deadline 2 s, or made
  // way for a newer one): a read sees the end.
  done = true;
  trickle.join();
  int closed = 0;
  for (int fd : slow) {
    pollfd p{fd, POLLIN, 0};
    char b;
    if (::poll(&p, 1, 3000) > 0 && ::recv(fd, &b, 1, MSG_DONTWAIT) <= 0) ++closed;
    ::close(fd);
  }
  EXPECT_EQ(closed, 80);
  // Oversized headers get 431 and the connection is closed.
  int fd = connectLoopback(server.port());
  std::string big = "GET /metrics HTTP/1.1\r\nX: " + std::string(10000, 'a');
  (void)::send(fd, big.data(), big.size(), MSG_NOSIGNAL);
  char buf[256] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_GT(::poll(&p, 1, 3000), 0);
  ASSERT_GT(::recv(fd, buf, sizeof buf - 1, 0), 0);
  EXPECT_EQ(std::string(buf).rfind("HTTP/1.1 431", 0), 0u) << buf;
  ::close(fd);
}

}  // namespace
}  // namespace kolo::metrics
