// Who listens on a coordinator address of this host (agent/coord/listener_owner.h),
// read off the kernel's tables for real: sockets bound by this process and
// by a child running as another user.
#include "agent/coord/listener_owner.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

namespace kolo {
namespace {

// A listening socket on `host` (IPv4 or IPv6 literal), port chosen by the kernel.
int listenOn(const char* host, int* port) {
  sockaddr_storage ss{};
  socklen_t len;
  int family = std::string(host).find(':') != std::string::npos ? AF_INET6 : AF_INET;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    ::inet_pton(AF_INET, host, &a->sin_addr);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, host, &a->sin6_addr);
    len = sizeof *a;
  }
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 4) != 0)
    return -1;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

TEST(ListenerOwner, FindsThisProcesssListenersInBothFamilies) {
  int p4 = 0, p6 = 0, pany = 0;
  int a = listenOn("127.0.0.1", &p4);
  int b = listenOn("::1", &p6);
  int c = listenOn("0.0.0.0", &pany);
  ASSERT_GE(a, 0);
  ASSERT_GE(c, 0);
  EXPECT_EQ(localListenerUid("127.0.0.1", p4), ::geteuid());
  EXPECT_EQ(localListenerUid("localhost", p4), ::geteuid());
  EXPECT_EQ(localListenerUid("127.0.0.1", pany), ::geteuid())
      << "a socket on every address serves loopback too";
  if (b >= 0) EXPECT_EQ(localListenerUid("::1", p6), ::geteuid());
  EXPECT_TRUE(checkPlainCoordinator("127.0.0.1:" + std::to_string(p4), -1).isOk());
  ::close(a);
  EXPECT_FALSE(localListenerUid("127.0.0.1", p4).has_value()) << "nothing listens there any more";
  EXPECT_TRUE(checkPlainCoordinator("127.0.0.1:" + std::to_string(p4), -1).isOk())
      << "nobody to send to";
  EXPECT_FALSE(localListenerUid("coordinator.example", 7470).has_value())
      << "not a literal of this host";
  if (b >= 0) ::close(b);
  ::close(c);
}

// Another user's listener on the address: refused with its uid and the
// knobs, unless --coordinator-uid names that user.
TEST(ListenerOwner, AnotherUsersListenerIsRefusedUnlessNamed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as another user";
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t child = ::fork();
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) ::_exit(1);
    int port = 0;
    int fd = listenOn("127.0.0.1", &port);
    (void)!::write(pipefd[1], &port, sizeof port);
    ::pause();
    ::close(fd);
    ::_exit(0);
  }
  int port = 0;
  ASSERT_EQ(::read(pipefd[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ASSERT_GT(port, 0);
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(localListenerUid("127.0.0.1", port), 65534u);
  Status st = checkPlainCoordinator(addr, -1);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_NE(
      st.message().find("the coordinator address " + addr + " is served by a process of uid 65534"),
      std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("--coordinator-uid"), std::string::npos) << st.message();
  EXPECT_TRUE(checkPlainCoordinator(addr, 65534).isOk());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

}  // namespace
}  // namespace kolo
