#include "common/frame.h"

#include <google/protobuf/message_lite.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace kolo {

namespace {
void putU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t getU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace

std::string encodeFrameHeader(uint32_t len) {
  std::string h(8, '\0');
  putU32(h.data(), kFrameMagic);
  putU32(h.data() + 4, len);
  return h;
}

Status FrameDecoder::feed(const char* data, size_t len) {
  if (!poisoned_.isOk()) return poisoned_;
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  buf_.append(data, len);
  // Validate every complete header now, so garbage is rejected early.
  size_t p = pos_;
  while (buf_.size() - p >= 8) {
    uint32_t magic = getU32(buf_.data() + p);
    uint32_t n = getU32(buf_.data() + p + 4);
    if (magic != kFrameMagic) {
      poisoned_ = invalidArgument("malformed frame: bad magic 0x" + [&] {
        char b[16];
        std::snprintf(b, sizeof b, "%08x", magic);
        return std::string(b);
      }());
      return poisoned_;
    }
    if (n > kMaxFrameBytes) {
      poisoned_ = invalidArgument("oversize frame: " + std::to_string(n) + " bytes (limit " +
                                  std::to_string(kMaxFrameBytes) + ")");
      return poisoned_;
    }
    if (buf_.size() - p - 8 < n) break;
    p += 8 + n;
  }
  return okStatus();
}

bool FrameDecoder::next(std::string* payload) {
  if (!poisoned_.isOk() || buf_.size() - pos_ < 8) return false;
  uint32_t n = getU32(buf_.data() + pos_ + 4);
  if (buf_.size() - pos_ - 8 < n) return false;
  payload->assign(buf_.data() + pos_ + 8, n);
  pos_ += 8 + n;
  if (pos_ > 1 << 20) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return true;
}

Status sendFrame(int fd, const google::protobuf::MessageLite& msg, const std::vector<int>& fds) {
  std::string body;
  if (!msg.SerializeToString(&body)) return internalError("cannot serialize frame");
  if (body.size() > kMaxFrameBytes) return internalError("frame too large to send");
  std::string out = encodeFrameHeader(static_cast<uint32_t>(body.size())) + body;

  size_t off = 0;
  bool fds_sent = fds.empty();
  while (off < out.size()) {
    struct iovec iov{out.data() + off, out.size() - off};
    struct msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
    if (!fds_sent) {
      if (fds.size() > kMaxFdsPerFrame) return internalError("too many fds for one frame");
      std::memset(cbuf, 0, sizeof cbuf);
      mh.msg_control = cbuf;
      mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      struct cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = ::sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 1000) <= 0) return timedOut("socket send blocked for 1 s");
        continue;
      }
      return errnoStatus("sendmsg", errno);
    }
    fds_sent = true;
    off += static_cast<size_t>(n);
  }
  return okStatus();
}

Status readAvailable(int fd, FrameDecoder* dec, std::deque<UniqueFd>* fds, size_t max_bytes,
                     bool* more) {
  char buf[16384];
  size_t total = 0;
  if (more != nullptr) *more = false;
  for (;;) {
    if (total >= max_bytes) {
      if (more != nullptr) *more = true;
      return okStatus();
    }
    struct iovec iov{buf, sizeof buf};
    struct msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n = ::recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return okStatus();
      return errnoStatus("recvmsg", errno);
    }
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int f;
          std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds->emplace_back(f);
        }
      }
    }
    if (mh.msg_flags & MSG_CTRUNC) return invalidArgument("too many descriptors in one message");
    if (fds->size() > static_cast<size_t>(kMaxFdsPerFrame)) {
      return invalidArgument(std::to_string(fds->size()) +
                             " file descriptors received without a frame to carry them (limit " +
                             std::to_string(kMaxFdsPerFrame) + ")");
    }
    if (n == 0) return unavailable("connection closed by peer");
    RETURN_IF_ERROR(dec->feed(buf, static_cast<size_t>(n)));
    total += static_cast<size_t>(n);
  }
}

Status recvFrame(int fd, std::chrono::steady_clock::time_point deadline, FrameDecoder* dec,
                 std::deque<UniqueFd>* fds, std::string* payload) {
  for (;;) {
    if (dec->next(payload)) return okStatus();
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return timedOut("no reply from the agent before the deadline");
    int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    struct pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) return errnoStatus("poll", errno);
    if (r > 0) {
      // A frame and the end of the connection can arrive in one read: the
      // frame is still delivered, and the next call reports the end.
      Status st = readAvailable(fd, dec, fds);
      if (!st.isOk()) return dec->next(payload) ? okStatus() : st;
    }
  }
}

}  // namespace kolo
