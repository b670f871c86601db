#include "common/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <list>

#include "common/log.h"

namespace kolo::metrics {

namespace {

using Clock = std::chrono::steady_clock;
// Bounds (docs/security.md, "Health and metrics under slow clients").
constexpr auto kRequestDeadline = std::chrono::seconds(2);  // from accept to a whole request
constexpr auto kWriteDeadline = std::chrono::seconds(2);    // for the answer to leave
constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr size_t kMaxConnections = 64;

std::string reply(int code, const char* reason, const std::string& type, const std::string& body, bool head) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

}  // namespace

struct MetricsHttpServer::Conn {
  int fd = -1;
  Clock::time_point deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool writing = false;
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
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port = std::to_string(addr.port);
  if (int e = ::getaddrinfo(addr.host.c_str(), port.c_str(), &hints, &res); e != 0) {
    return unavailable("metrics HTTP server cannot listen on " + listen_address_ + ": " + ::gai_strerror(e));
  }
  int fd = -1, err = 0;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;  // SO_REUSEADDR only: SO_REUSEPORT would let a second server bind the port silently
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return unavailable("metrics HTTP server cannot listen on " + listen_address_ +
                       (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  host_ = addr.host;
  listen_fd_ = fd;
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  started_ = true;
  thread_ = std::thread([this] {
    log::setThreadName("metrics-http");
    serve();
  });
  log::get("metrics")->info("serving /metrics and /healthz on http://{}/", boundAddress());
  return okStatus();
}

// The answer to a whole request in c.in (a request line and headers).
void MetricsHttpServer::answer(Conn& c) {
  const std::string line = c.in.substr(0, c.in.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  const std::string method = line.substr(0, sp1);
  std::string path = sp2 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  const std::string text = "text/plain; charset=utf-8";
  if (sp2 == std::string::npos) {
    c.out = reply(400, "Bad Request", text, "bad request line\n", false);
  } else if (method != "GET" && !head) {
    c.out = reply(405, "Method Not Allowed", text, "only GET and HEAD\n", false);
  } else if (path == "/metrics") {
    c.out = reply(200, "OK", Registry::kContentType, registry_.render(), head);
  } else if (path == "/healthz") {
    Status st = health_ ? health_() : okStatus();
    c.out = st.isOk() ? reply(200, "OK", text, "ok\n", head)
                      : reply(503, "Service Unavailable", text, st.toString() + "\n", head);
  } else {
    c.out = reply(404, "Not Found", text, "not found\n", head);
  }
  c.writing = true;
  c.deadline = Clock::now() + kWriteDeadline;
}

void MetricsHttpServer::serve() {
  std::list<Conn> conns;  // oldest first
  std::vector<pollfd> pfds;
  std::vector<Conn*> by_slot;
  for (;;) {
    pfds.assign({{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}});
    by_slot.assign(2, nullptr);
    auto now = Clock::now();
    int timeout = 1000;
    for (Conn& c : conns) {
      pfds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      by_slot.push_back(&c);
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      timeout = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(timeout, left + 1)));
    }
    if (::poll(pfds.data(), pfds.size(), timeout) < 0 && errno != EINTR) break;
    if (pfds[1].revents != 0) break;  // stop()
    now = Clock::now();
    for (size_t i = 2; i < pfds.size(); ++i) {
      Conn& c = *by_slot[i];
      if (pfds[i].revents == 0) continue;
      if (!c.writing) {
        char buf[4096];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0) {
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) c.deadline = now;  // gone: closed below
          continue;
        }
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.find("\r\n\r\n") != std::string::npos) {
          answer(c);
        } else if (c.in.size() > kMaxRequestBytes) {
          c.out = reply(431, "Request Header Fields Too Large", "text/plain; charset=utf-8", "too large\n", false);
          c.writing = true;
          c.deadline = now + kWriteDeadline;
        }
      }
      if (c.writing) {
        ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += static_cast<size_t>(n);
        if (c.sent == c.out.size() || (n < 0 && errno != EAGAIN && errno != EINTR)) c.deadline = now;
      }
    }
    // Past its deadline (or done): closed. Slow clients end here.
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->deadline <= now) {
        ::close(it->fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
    if (pfds[0].revents != 0) {
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (conns.size() >= kMaxConnections) {  // the oldest gives way
          ::close(conns.front().fd);
          conns.pop_front();
        }
        conns.push_back(Conn{fd, now + kRequestDeadline, {}, {}, 0, false});
      }
    }
  }
  for (Conn& c : conns) ::close(c.fd);
}

void MetricsHttpServer::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

}  // namespace kolo::metrics
