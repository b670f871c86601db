// common/sd_notify: the datagrams a Type=notify unit's service manager sees.
// A receiving AF_UNIX datagram socket stands in for systemd; it asks for
// SCM_CREDENTIALS like systemd does (NotifyAccess=main checks the sender pid).
#include "common/sd_notify.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>

#include "common/fd.h"

namespace kolo {
namespace {

constexpr int kRecvTimeoutMs = 5000;

struct Datagram {
  std::string text;
  pid_t sender_pid = -1;
};

// Restores NOTIFY_SOCKET as it was before the test.
class ScopedNotifyEnv {
 public:
  ScopedNotifyEnv() {
    if (const char* v = std::getenv("NOTIFY_SOCKET")) saved_ = v;
  }
  ~ScopedNotifyEnv() {
    if (saved_) {
      ::setenv("NOTIFY_SOCKET", saved_->c_str(), 1);
    } else {
      ::unsetenv("NOTIFY_SOCKET");
    }
  }
  void set(const std::string& v) { ::setenv("NOTIFY_SOCKET", v.c_str(), 1); }
  void unset() { ::unsetenv("NOTIFY_SOCKET"); }

 private:
  std::optional<std::string> saved_;
};

// A bound datagram socket playing the service manager: a file in a fresh
// temporary directory (removed at the end) or an abstract name.
class FakeServiceManager {
 public:
  enum class Kind { kPath, kAbstract };

  explicit FakeServiceManager(Kind kind) {
    fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd_.valid()) {
      error_ = std::string("socket: ") + std::strerror(errno);
      return;
    }
    int one = 1;
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
    sockaddr_un addr;
    std::memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (kind == Kind::kPath) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / "kolo-sdnotify-XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        error_ = std::string("mkdtemp: ") + std::strerror(errno);
        return;
      }
      dir_ = tmpl;
      address_ = dir_ + "/notify";
      std::memcpy(addr.sun_path, address_.c_str(), address_.size());
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size() + 1);
    } else {
      static std::atomic<int> counter{0};
      std::random_device rd;
      std::string name = "kolo-sdnotify-test-" + std::to_string(::getpid()) + "-" +
                         std::to_string(rd()) + "-" + std::to_string(counter++);
      address_ = "@" + name;
      std::memcpy(addr.sun_path + 1, name.c_str(), name.size());
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    }
    if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      error_ = "bind " + address_ + ": " + std::strerror(errno);
    }
  }
  ~FakeServiceManager() {
    fd_.reset();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  const std::string& error() const { return error_; }
  const std::string& address() const { return address_; }

  // Waits up to kRecvTimeoutMs for one datagram.
  std::optional<Datagram> receive() {
    pollfd p{fd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, kRecvTimeoutMs);
    if (r <= 0) return std::nullopt;
    char buf[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
    if (n < 0) return std::nullopt;
    Datagram d;
    d.text.assign(buf, static_cast<size_t>(n));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        d.sender_pid = cred.pid;
      }
    }
    return d;
  }

  // True if nothing arrives right now (non-blocking check).
  bool empty() {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }

 private:
  UniqueFd fd_;
  std::string dir_;
  std::string address_;
  std::string error_;
};

TEST(SdNotify, NoOpWithoutNotifySocket) {
  ScopedNotifyEnv env;
  env.unset();
  EXPECT_FALSE(sdNotifyEnabled());
  EXPECT_TRUE(sdNotifyReady("ready").isOk());
  EXPECT_TRUE(sdNotifyStopping().isOk());
  EXPECT_TRUE(sdNotifyStatus("x").isOk());
  EXPECT_TRUE(sdNotify("READY=1").isOk());
  env.set("");
  EXPECT_FALSE(sdNotifyEnabled());
  EXPECT_TRUE(sdNotifyReady().isOk());
}

TEST(SdNotify, ReadyReachesPathSocketWithSenderPid) {
  FakeServiceManager sm(FakeServiceManager::Kind::kPath);
  ASSERT_EQ(sm.error(), "");
  ScopedNotifyEnv env;
  env.set(sm.address());
  EXPECT_TRUE(sdNotifyEnabled());
  Status st = sdNotifyReady();
  ASSERT_TRUE(st.isOk()) << st.toString();
  auto d = sm.receive();
  ASSERT_TRUE(d.has_value()) << "no datagram within " << kRecvTimeoutMs << " ms";
  EXPECT_EQ(d->text, "READY=1");
  EXPECT_EQ(d->sender_pid, ::getpid());  // what NotifyAccess=main checks
}

TEST(SdNotify, AbstractSocketWithLeadingAt) {
  FakeServiceManager sm(FakeServiceManager::Kind::kAbstract);
  ASSERT_EQ(sm.error(), "");
  ASSERT_EQ(sm.address().front(), '@');
  ScopedNotifyEnv env;
  env.set(sm.address());
  Status st = sdNotifyStopping("draining 2 jobs");
  ASSERT_TRUE(st.isOk()) << st.toString();
  auto d = sm.receive();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->text, "STOPPING=1\nSTATUS=draining 2 jobs");
}

TEST(SdNotify, StatusNewlinesCannotInjectAssignments) {
  FakeServiceManager sm(FakeServiceManager::Kind::kPath);
  ASSERT_EQ(sm.error(), "");
  ScopedNotifyEnv env;
  env.set(sm.address());
  ASSERT_TRUE(sdNotifyStatus("3 jobs\nMAINPID=1\r\nERRNO=5").isOk());
  auto d = sm.receive();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->text, "STATUS=3 jobs MAINPID=1  ERRNO=5");
  ASSERT_TRUE(sdNotifyReady("listening on /run/kolo/agent.sock").isOk());
  d = sm.receive();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->text, "READY=1\nSTATUS=listening on /run/kolo/agent.sock");
}

TEST(SdNotify, ExplicitAddressIgnoresEnvironment) {
  FakeServiceManager sm(FakeServiceManager::Kind::kAbstract);
  ASSERT_EQ(sm.error(), "");
  ScopedNotifyEnv env;
  env.unset();
  ASSERT_TRUE(sdNotifyTo(sm.address(), "WATCHDOG=1").isOk());
  auto d = sm.receive();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->text, "WATCHDOG=1");
  EXPECT_TRUE(sm.empty());
}

TEST(SdNotify, MissingSocketIsUnavailable) {
  ScopedNotifyEnv env;
  std::string dir = (std::filesystem::temp_directory_path() / "kolo-sdnotify-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  env.set(dir + "/nobody-listens");
  Status st = sdNotifyReady();
  std::filesystem::remove_all(dir);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.toString();
  EXPECT_NE(st.message().find("nobody-listens"), std::string::npos) << st.message();
}

TEST(SdNotify, RejectsUnsupportedAddresses) {
  ScopedNotifyEnv env;
  env.set("relative/notify");
  EXPECT_EQ(sdNotifyReady().code(), Code::kInvalidArgument);
  env.set("vsock:2:1234");
  EXPECT_EQ(sdNotifyReady().code(), Code::kInvalidArgument);
  env.set("/" + std::string(200, 'x'));
  Status st = sdNotifyReady();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("too long"), std::string::npos) << st.message();
  EXPECT_EQ(sdNotifyTo("", "READY=1").code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kolo
