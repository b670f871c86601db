// The TCP transport of the p2p backend (p2p_backend.h).
//
// Connections: every rank listens (backend-tcp-address, or every interface)
// and publishes "kolo-tcp1 <nonce> <port> <address>..." under
// "<key_prefix>/<rank>"; each rank dials every lower rank, trying the
// published addresses in order, and says who it is and whom it meant (the
// nonce) in a hello that the listener checks, so that a connection that
// reached the wrong process (a loopback address tried across network
// namespaces, another job's listener) is refused and the next address tried.
//
// Frames: a 16-byte header (magic, seq, step, chunk: 16 bits each; payload
// bytes: 64) and the payload. A sender writes header and payload straight
// from the collective's buffer with one sendmsg (several queued frames at
// once); a receiver reads the header, then the payload straight into the
// posted receive's buffer. A frame that arrives before its receive is posted
// goes to a buffer of its own and is copied when the receive comes (or, if
// it is still arriving, what came is copied and the rest read in place).
// The sockets are edge-triggered in an epoll set of their own, whose fd is
// the one the backend's loop sleeps on.
#include "agent/backends/tcp/factory.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <sstream>

#include "agent/backends/p2p_backend.h"

namespace kolo {
namespace {

constexpr uint16_t kFrameMagic = 0x4b54;  // "KT"
constexpr uint32_t kHelloMagic = 0x6b6f6c6f;  // "kolo"
constexpr uint32_t kHelloVersion = 1;
constexpr size_t kHeaderBytes = 16;
constexpr int kMaxIov = 64;  // frames per sendmsg: header + payload each
// A frame of at least this many bytes whose receive is not posted yet is left
// in the socket (TCP holds the sender back) until the receive comes, so that
// it is read straight into place; after kStallMax it is read into a buffer of
// its own anyway (no collective may wait on it forever).
constexpr size_t kStallBytes = 64 * 1024;
constexpr auto kStallMax = std::chrono::milliseconds(10);
// Dialling one address gives up after this long (then the next is tried).
constexpr auto kDialTimeout = std::chrono::seconds(2);

struct FrameHeader {
  uint16_t magic;
  uint16_t seq;
  uint16_t step;
  uint16_t chunk;
  uint64_t bytes;
};
static_assert(sizeof(FrameHeader) == kHeaderBytes);

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t nonce;  // the listener's, from its published address
  uint32_t rank;   // the dialler's
  uint32_t size;
};

using Key = uint64_t;  // seq (16) | step (16) | chunk (16)
Key frameKey(uint64_t seq, uint32_t step, uint32_t chunk) {
  return ((seq & 0xffff) << 32) | ((step & 0xffffu) << 16) | (chunk & 0xffffu);
}

std::string errnoText(int err) { return std::strerror(err); }

// Reads or writes exactly n bytes of a non-blocking socket by the deadline.
Status ioFull(int fd, void* buf, size_t n, bool write, P2pTransport::Clock::time_point deadline,
              const std::string& what) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = write ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return peerFailure(what + ": connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return peerFailure(what + ": " + errnoText(errno));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - P2pTransport::Clock::now());
    if (left.count() <= 0) return peerFailure(what + ": timed out");
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
  }
  return okStatus();
}

Status setSocketOptions(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return errnoStatus("setsockopt TCP_NODELAY", errno);
  }
  return okStatus();
}

// The IPv4 addresses a peer may reach this host on: every interface that is
// up, loopback first (the common case of agents on one host, and cheap to
// refuse elsewhere).
std::vector<std::string> localAddresses() {
  std::vector<std::string> loop, other;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return {"127.0.0.1"};
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) == nullptr) continue;
    ((i->ifa_flags & IFF_LOOPBACK) != 0 ? loop : other).push_back(text);
  }
  ::freeifaddrs(ifs);
  loop.insert(loop.end(), other.begin(), other.end());
  return loop;
}

// The published addresses in the order to try them: those on a subnet of
// one of this host's interfaces first (an address on a network this host
// is not on may be dropped silently and cost a dial timeout), the rest
// after, each group in the published order.
std::vector<std::string> dialOrder(const std::vector<std::string>& published) {
  std::vector<std::pair<uint32_t, uint32_t>> nets;  // (address, mask), host order
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if ((i->ifa_flags & IFF_UP) == 0) continue;
      nets.emplace_back(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr),
                        ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr));
    }
    ::freeifaddrs(ifs);
  }
  auto local = [&](const std::string& a) {
    in_addr x{};
    if (::inet_pton(AF_INET, a.c_str(), &x) != 1) return false;
    const uint32_t h = ntohl(x.s_addr);
    return std::any_of(nets.begin(), nets.end(), [h](const auto& n) { return (h & n.second) == (n.first & n.second); });
  };
  std::vector<std::string> order = published;
  std::stable_partition(order.begin(), order.end(), local);
  return order;
}

StatusOr<in_addr> resolveIpv4(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalidArgument("backend-tcp-address '" + host + "': " + ::gai_strerror(rc));
  }
  a = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

struct Published {
  uint64_t nonce = 0;
  int port = 0;
  std::vector<std::string> addresses;
};

StatusOr<Published> parsePublished(const std::string& text) {
  std::istringstream in(text);
  std::string tag;
  Published p;
  in >> tag >> p.nonce >> p.port;
  std::string a;
  while (in >> a) p.addresses.push_back(a);
  if (tag != "kolo-tcp1" || !in.eof() || p.port <= 0 || p.port > 65535 || p.addresses.empty()) {
    return invalidArgument("malformed tcp address record '" + text + "'");
  }
  return p;
}

// The tcp transport's own options.
struct TcpTransportOptions {
  // Listen on this address (IPv4 or host name) and give peers only it;
  // empty: every interface, all of its IPv4 addresses given.
  std::string address;
};

class TcpTransport final : public P2pTransport {
 public:
  TcpTransport(P2pHost& host, TcpTransportOptions options)
      : P2pTransport(host), tcp_(std::move(options)) {}

  std::string_view name() const override { return "tcp"; }

 private:
  struct SendItem {
    FrameHeader header;
    const std::byte* data;
    size_t bytes;
    size_t sent = 0;  // of header + payload
    P2pRequest* req;
  };
  struct PostedRecv {
    P2pRequest* req;
    std::byte* buf;
    size_t cap;
  };
  struct Unexpected {
    std::unique_ptr<std::byte[]> data;  // not zeroed: it is about to be read into
    size_t size = 0;
    size_t got = 0;
  };
  struct Peer {
    UniqueFd fd;
    bool readable = true;
    bool writable = true;
    bool closed = false;  // gone, or closed by us: nothing more moves
    std::deque<SendItem> sendq;
    std::map<Key, PostedRecv> posted;
    std::map<Key, Unexpected> unexpected;  // complete ones, and the one arriving
    // The frame being read: its header, then its payload into `target`.
    FrameHeader header{};
    size_t header_got = 0;
    bool in_payload = false;
    Key key = 0;
    std::byte* target = nullptr;
    size_t payload_got = 0;
    P2pRequest* req = nullptr;        // the posted receive it lands in, if any
    Unexpected* parked = nullptr;     // else the buffer it lands in
    // The frame's receive is not posted yet and the payload waits in the
    // socket, since `stalled_since` (see kStallBytes).
    std::optional<Clock::time_point> stalled_since;
  };

  // --- connecting -----------------------------------------------------------

  Status connectTransport(KvStore& kv, Clock::time_point deadline) override {
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) return errnoStatus("epoll_create1", errno);
    const int n = opts().size, me = opts().rank;
    peers_.resize(n);
    std::random_device rd;
    nonce_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());

    UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!listener.valid()) return errnoStatus("socket", errno);
    int one = 1;
    ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    std::vector<std::string> addresses;
    if (tcp_.address.empty()) {
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addresses = localAddresses();
    } else {
      ASSIGN_OR_RETURN(addr.sin_addr, resolveIpv4(tcp_.address));
      char text[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof text);
      addresses = {text};
    }
    if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return unavailable("not viable: cannot listen on " +
                         (tcp_.address.empty() ? std::string("any address") : tcp_.address) +
                         ": " + errnoText(errno));
    }
    if (::listen(listener.get(), std::max(n, 16)) != 0) return errnoStatus("listen", errno);
    socklen_t len = sizeof addr;
    ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    std::string record = "kolo-tcp1 " + std::to_string(nonce_) + " " + std::to_string(ntohs(addr.sin_port));
    for (const auto& a : addresses) record += " " + a;
    RETURN_IF_ERROR(kv.put(key(me), record).withContext("publishing the TCP address"));

    for (int p = 0; p < me; ++p) RETURN_IF_ERROR(dial(kv, p, deadline));
    for (int accepted = 0; accepted < n - 1 - me;) {
      ASSIGN_OR_RETURN(bool got, acceptOne(listener.get(), deadline));
      if (got) ++accepted;
    }
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.u32 = static_cast<uint32_t>(p);
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, peers_[p].fd.get(), &ev) != 0) {
        return errnoStatus("epoll_ctl", errno);
      }
    }
    return okStatus();
  }

  Status dial(KvStore& kv, int p, Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto remote = kv.get(key(p), std::max(left, std::chrono::milliseconds(1)));
    if (!remote.isOk()) {
      return peerFailure("agent rank " + std::to_string(p) + " unreachable: its TCP address '" +
                         key(p) + "' did not appear: " + remote.status().message());
    }
    ASSIGN_OR_RETURN(Published pub, parsePublished(*remote));
    const std::vector<std::string> order = dialOrder(pub.addresses);
    std::string last = "no address";
    while (Clock::now() < deadline) {
      for (const auto& a : order) {
        auto fd = tryDial(a, pub, p, deadline);
        if (fd.isOk()) {
          peers_[p].fd = std::move(fd).value();
          return okStatus();
        }
        last = fd.status().message();
      }
      pollfd none{-1, 0, 0};
      ::poll(&none, 0, 50);
    }
    return peerFailure("agent rank " + std::to_string(p) + " unreachable: cannot connect to it: " + last);
  }

  StatusOr<UniqueFd> tryDial(const std::string& address, const Published& pub, int p,
                             Clock::time_point deadline) {
    const std::string where = address + ":" + std::to_string(pub.port);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(pub.port));
    if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) {
      return invalidArgument(where + ": not an IPv4 address");
    }
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errnoStatus("socket", errno);
    const auto until = std::min(deadline, Clock::now() + kDialTimeout);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      if (errno != EINPROGRESS) return peerFailure(where + ": " + errnoText(errno));
      pollfd pfd{fd.get(), POLLOUT, 0};
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(ms.count(), 0))) <= 0) {
        return peerFailure(where + ": connect timed out");
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return peerFailure(where + ": " + errnoText(err));
    }
    RETURN_IF_ERROR(setSocketOptions(fd.get()));
    // Connected: from here on the listener has our hello in its backlog and
    // will answer it once it reaches its accept phase (after dialling its
    // own lower ranks), so wait for the answer until the overall deadline.
    // Giving up earlier would leave it a hello from a connection we closed,
    // which it would take as ours. A process that is not the peer closes
    // at once (wrong nonce) and the next address is tried.
    Hello hello{kHelloMagic, kHelloVersion, pub.nonce, static_cast<uint32_t>(opts().rank),
                static_cast<uint32_t>(opts().size)};
    RETURN_IF_ERROR(ioFull(fd.get(), &hello, sizeof hello, true, deadline, where + ": hello"));
    uint32_t answer = 0;
    RETURN_IF_ERROR(ioFull(fd.get(), &answer, sizeof answer, false, deadline, where + ": hello"));
    if (answer != static_cast<uint32_t>(p)) {
      return peerFailure(where + ": answered as rank " + std::to_string(answer));
    }
    return fd;
  }

  // One connection from a higher rank; false when what connected was not one
  // of ours (wrong nonce: another listener's dialler), which is dropped.
  StatusOr<bool> acceptOne(int listener, Clock::time_point deadline) {
    for (;;) {
      UniqueFd fd(::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (fd.valid()) {
        Hello hello{};
        const auto until = std::min(deadline, Clock::now() + kDialTimeout);
        if (!ioFull(fd.get(), &hello, sizeof hello, false, until, "hello").isOk()) return false;
        const int r = static_cast<int>(hello.rank);
        if (hello.magic != kHelloMagic || hello.version != kHelloVersion || hello.nonce != nonce_ ||
            static_cast<int>(hello.size) != opts().size || r <= opts().rank || r >= opts().size ||
            peers_[r].fd.valid()) {
          log()->debug("{}dropped a connection that is not a peer's (rank {}, nonce {})", prefix(),
                       hello.rank, hello.nonce);
          return false;
        }
        RETURN_IF_ERROR(setSocketOptions(fd.get()));
        uint32_t me = static_cast<uint32_t>(opts().rank);
        if (!ioFull(fd.get(), &me, sizeof me, true, until, "hello").isOk()) return false;
        peers_[r].fd = std::move(fd);
        return true;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errnoStatus("accept", errno);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        std::string missing;
        for (int p = opts().rank + 1; p < opts().size; ++p) {
          if (!peers_[p].fd.valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        }
        return peerFailure("agent rank " + missing.substr(0, missing.find(',')) +
                           " unreachable: it did not connect (waiting for ranks " + missing + ")");
      }
      pollfd pfd{listener, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    }
  }

  // --- moving messages (progress thread) ------------------------------------

  int transportFd() const override { return epoll_.get(); }

  bool progressTransport() override {
    bool moved = false;
    epoll_event evs[64];
    int n;
    while ((n = ::epoll_wait(epoll_.get(), evs, 64, 0)) > 0) {
      for (int i = 0; i < n; ++i) {
        Peer& peer = peers_[evs[i].data.u32];
        if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer.readable = true;
        if (evs[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) peer.writable = true;
      }
      if (n < 64) break;
    }
    const auto now = Clock::now();
    for (int p = 0; p < static_cast<int>(peers_.size()); ++p) {
      Peer& peer = peers_[p];
      if (peer.closed || !peer.fd.valid()) continue;
      if (peer.stalled_since && now - *peer.stalled_since >= kStallMax) {
        peer.stalled_since.reset();  // read it aside after all
        ++unexpected_late_;
        if (!placePayload(p)) continue;
        peer.readable = true;
      }
      if (peer.readable && !peer.stalled_since) moved |= readFrom(p);
      if (!peer.closed && peer.writable && !peer.sendq.empty()) moved |= flush(p);
    }
    if (moved) noteProgress();
    return moved;
  }

  // Edge-triggered: sleeping is safe once every socket was driven to EAGAIN.
  bool armTransport(int& wait_ms) override {
    const auto now = Clock::now();
    for (const Peer& peer : peers_) {
      if (peer.closed || !peer.fd.valid()) continue;
      if (peer.stalled_since) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            *peer.stalled_since + kStallMax - now).count() + 1;
        wait_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, wait_ms));
        continue;
      }
      if (peer.readable || (peer.writable && !peer.sendq.empty())) return false;
    }
    return true;
  }

  void postSend(P2pRequest* r, const void* buf, size_t bytes) override {
    Peer& peer = peers_[r->peer];
    if (peer.closed || !peer.fd.valid()) return failRequest(r, "not connected");
    FrameHeader h{kFrameMagic, static_cast<uint16_t>(r->seq & 0xffff), static_cast<uint16_t>(r->step),
                  static_cast<uint16_t>(r->chunk), bytes};
    peer.sendq.push_back({h, static_cast<const std::byte*>(buf), bytes, 0, r});
    r->handle = r;
    if (peer.writable) flush(r->peer);
  }

  void postRecv(P2pRequest* r, void* buf, size_t bytes) override {
    Peer& peer = peers_[r->peer];
    const Key k = frameKey(r->seq, r->step, r->chunk);
    auto* dst = static_cast<std::byte*>(buf);
    auto it = peer.unexpected.find(k);
    if (it != peer.unexpected.end()) {
      Unexpected& u = it->second;
      const size_t total = u.size;
      if (total > bytes) {
        const bool arriving = peer.parked == &u;
        peer.unexpected.erase(it);
        if (arriving) stopReading(peer);
        return finishRecv(r, total, P2pRequest::Result::kTruncated);
      }
      std::memcpy(dst, u.data.get(), u.got);
      if (peer.parked == &u) {  // still arriving: read the rest in place
        peer.target = dst;
        peer.parked = nullptr;
        peer.req = r;
        r->handle = r;
        peer.unexpected.erase(it);
        return;
      }
      peer.unexpected.erase(it);
      return finishRecv(r, total, P2pRequest::Result::kOk);
    }
    if (peer.closed || !peer.fd.valid()) {
      // Pending: the backend judges a receive from a gone peer (after a grace).
      if (peer.fd.valid() || peerFailed(r->peer)) {
        peer.posted.emplace(k, PostedRecv{r, dst, bytes});
        r->handle = r;
        return;
      }
      return failRequest(r, "not connected");
    }
    peer.posted.emplace(k, PostedRecv{r, dst, bytes});
    r->handle = r;
    if (peer.stalled_since && peer.key == k) {  // its frame waits in the socket
      peer.stalled_since.reset();
      if (!placePayload(r->peer)) return;
      peer.readable = true;
    }
  }

  // Reads frames until the socket has no more; true when bytes came.
  bool readFrom(int p) {
    Peer& peer = peers_[p];
    bool moved = false;
    for (;;) {
      ssize_t got;
      if (!peer.in_payload) {
        got = ::recv(peer.fd.get(), reinterpret_cast<char*>(&peer.header) + peer.header_got,
                     kHeaderBytes - peer.header_got, 0);
      } else {
        // The rest of the payload, and the next header with it.
        iovec iov[2] = {{peer.target + peer.payload_got, peer.header.bytes - peer.payload_got},
                        {&next_header_, kHeaderBytes}};
        got = ::readv(peer.fd.get(), iov, 2);
      }
      if (got == 0) {
        connectionLost(p, "connection closed by the peer");
        return true;
      }
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          peer.readable = false;
          return moved;
        }
        connectionLost(p, errnoText(errno));
        return true;
      }
      moved = true;
      size_t n = static_cast<size_t>(got);
      if (!peer.in_payload) {
        peer.header_got += n;
        if (peer.header_got == kHeaderBytes && !startPayload(p)) return true;
      } else {
        const size_t want = peer.header.bytes - peer.payload_got;
        const size_t used = std::min(n, want);
        peer.payload_got += used;
        if (peer.parked != nullptr) peer.parked->got += used;
        if (peer.payload_got == peer.header.bytes) {
          payloadDone(peer);
          if (n > used) {
            std::memcpy(&peer.header, &next_header_, n - used);
            peer.header_got = n - used;
            if (peer.header_got == kHeaderBytes && !startPayload(p)) return true;
          }
        }
      }
      if (peer.closed) return true;
    }
  }

  // A whole header is in: find where its payload goes, or leave it in the
  // socket until its receive is posted. False when reading from the peer
  // stops here (a malformed frame, a frame larger than its receive).
  bool startPayload(int p) {
    Peer& peer = peers_[p];
    if (peer.header.magic != kFrameMagic) {
      connectionLost(p, "malformed frame (bad magic " + std::to_string(peer.header.magic) + ")");
      return false;
    }
    peer.header_got = 0;
    peer.payload_got = 0;
    peer.key = frameKey(peer.header.seq, peer.header.step, peer.header.chunk);
    peer.req = nullptr;
    peer.parked = nullptr;
    if (peer.header.bytes >= kStallBytes && peer.posted.count(peer.key) == 0) {
      peer.stalled_since = Clock::now();
      return false;
    }
    return placePayload(p);
  }

  // Points the payload of the frame whose header is in at its posted
  // receive, or at a buffer of its own.
  bool placePayload(int p) {
    Peer& peer = peers_[p];
    peer.in_payload = true;
    auto it = peer.posted.find(peer.key);
    if (it != peer.posted.end()) {
      PostedRecv pr = it->second;
      peer.posted.erase(it);
      if (peer.header.bytes > pr.cap) {
        finishRecv(pr.req, peer.header.bytes, P2pRequest::Result::kTruncated);
        stopReading(peer);  // the stream cannot be followed past this frame
        return false;
      }
      peer.target = pr.buf;
      peer.req = pr.req;
    } else {
      std::unique_ptr<std::byte[]> data(new (std::nothrow) std::byte[std::max<size_t>(peer.header.bytes, 1)]);
      if (!data) {  // (a corrupt header, or a frame no receive of this job could take)
        connectionLost(p, "malformed frame (" + std::to_string(peer.header.bytes) + " bytes: cannot hold it)");
        return false;
      }
      Unexpected& u = peer.unexpected[peer.key];
      u.data = std::move(data);
      u.size = peer.header.bytes;
      u.got = 0;
      peer.target = u.data.get();
      peer.parked = &u;
    }
    if (peer.header.bytes == 0) payloadDone(peer);
    return true;
  }

  void payloadDone(Peer& peer) {
    peer.in_payload = false;
    if (peer.req != nullptr) finishRecv(peer.req, peer.header.bytes, P2pRequest::Result::kOk);
    peer.req = nullptr;
    peer.parked = nullptr;
    peer.target = nullptr;
  }

  // Writes queued frames until the socket takes no more; true when bytes went.
  bool flush(int p) {
    Peer& peer = peers_[p];
    bool moved = false;
    while (!peer.sendq.empty()) {
      iovec iov[kMaxIov];
      int n = 0;
      for (auto it = peer.sendq.begin(); it != peer.sendq.end() && n + 2 <= kMaxIov; ++it) {
        size_t off = it->sent;
        if (off < kHeaderBytes) {
          iov[n++] = {reinterpret_cast<char*>(&it->header) + off, kHeaderBytes - off};
          off = kHeaderBytes;
        }
        if (it->bytes > off - kHeaderBytes) {
          iov[n++] = {const_cast<std::byte*>(it->data) + (off - kHeaderBytes),
                      it->bytes - (off - kHeaderBytes)};
        }
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t sent = ::sendmsg(peer.fd.get(), &msg, MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          peer.writable = false;
          return moved;
        }
        connectionLost(p, errnoText(errno));
        return true;
      }
      moved = true;
      size_t left = static_cast<size_t>(sent);
      while (left > 0 && !peer.sendq.empty()) {
        SendItem& item = peer.sendq.front();
        const size_t take = std::min(left, kHeaderBytes + item.bytes - item.sent);
        item.sent += take;
        left -= take;
        if (item.sent < kHeaderBytes + item.bytes) break;
        P2pRequest* r = item.req;
        peer.sendq.pop_front();
        r->handle = nullptr;
        r->result = P2pRequest::Result::kOk;
        completed(r);
      }
    }
    return moved;
  }

  // --- completions and failures ---------------------------------------------

  void finishRecv(P2pRequest* r, size_t bytes, P2pRequest::Result result) {
    r->received = bytes;
    r->result = result;
    r->handle = nullptr;
    completed(r);
  }

  void failRequest(P2pRequest* r, const std::string& why) {
    r->result = P2pRequest::Result::kError;
    r->error = why;
    r->handle = nullptr;
    completed(r);
  }

  void stopReading(Peer& peer) {
    peer.readable = false;
    peer.in_payload = false;
    peer.req = nullptr;
    peer.parked = nullptr;
    peer.closed = true;
  }

  // The peer's connection ended (or broke): sends to it fail; receives from
  // it stay posted, and the backend fails the collective if it still waits
  // for one after its grace (what came before the end was matched first).
  void connectionLost(int p, const std::string& why) {
    Peer& peer = peers_[p];
    if (peer.closed) return;
    peer.closed = true;
    peer.readable = peer.writable = false;
    if (peer.req != nullptr) {
      // The frame being read will never be whole.
      peer.posted.emplace(peer.key, PostedRecv{peer.req, peer.target, peer.header.bytes});
      peer.req = nullptr;
    }
    for (SendItem& item : peer.sendq) failRequest(item.req, why);
    peer.sendq.clear();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, peer.fd.get(), nullptr);
    peerGone(p, why);
  }

  void dropPeer(Peer& peer, const std::string& why) {
    for (SendItem& item : peer.sendq) failRequest(item.req, why);
    peer.sendq.clear();
    for (auto& [k, pr] : peer.posted) failRequest(pr.req, why);
    peer.posted.clear();
    if (peer.req != nullptr) failRequest(peer.req, why);
    peer.req = nullptr;
    peer.parked = nullptr;
    peer.unexpected.clear();
    peer.in_payload = false;
    peer.stalled_since.reset();
    peer.closed = true;
    peer.fd.reset();
  }

  void closeTransportForcefully() override {
    for (Peer& peer : peers_) dropPeer(peer, "cancelled");
  }

  void teardownTransport(bool force, Clock::time_point) override {
    if (unexpected_late_ > 0) {
      log()->debug("{}{} large frames waited {} ms for their receive and were read aside", prefix(),
                   unexpected_late_, kStallMax.count());
    }
    for (Peer& peer : peers_) {
      if (peer.fd.valid() && force) {
        linger l{1, 0};  // reset: the peer learns at once
        ::setsockopt(peer.fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
      }
      dropPeer(peer, "the backend was shut down");
    }
    epoll_.reset();
  }

  const TcpTransportOptions tcp_;
  UniqueFd epoll_;
  uint64_t nonce_ = 0;
  uint64_t unexpected_late_ = 0;  // stalled frames read aside after kStallMax
  std::vector<Peer> peers_;
  FrameHeader next_header_{};
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> createTcpBackend(const BackendOptions& options, KvStore& kv) {
  TcpTransportOptions tcp{options.tcp_address};
  return makeP2pBackend(options, kv, "agent.backend.tcp", [tcp](P2pHost& host) {
    return std::make_unique<TcpTransport>(host, tcp);
  });
}

}  // namespace kolo
