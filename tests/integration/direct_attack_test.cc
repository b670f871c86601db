// The real kolo-agent, running as root, attacked by another local user
// (issue 47, docs/security.md):
// - the direct user-memory path: a rank of another user, granted the path,
//   execs a setuid-root program under the same pid with its connection kept
//   open. The agent must neither read the root process's memory into the
//   job nor write the result into it; the op fails naming the pid, and an
//   honest job beside it finishes exactly;
// - the coordinator's port taken by another user while it is down: the
//   agent sends it nothing.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string bin(const char* name) { return binDir() + "/" + name; }

TEST(DirectAttack, ASetuidProgramExecdUnderTheGrantedPidIsNeverTouched) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root: the agent as root, ranks as another user, a setuid program";
  if (::access("/usr/bin/setpriv", X_OK) != 0)
    GTEST_SKIP() << "setpriv (util-linux) is not installed";
  Cluster c;
  ASSERT_TRUE(c.ok()) << c.error();
  ASSERT_EQ(::chmod(c.dir().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(c.socket().c_str(), 0666),
            0);  // the attacker's user may connect (a socket-group member)
  // The setuid-root victim: a copy of the rank program, owned by root, mode 4755.
  char tmpl[] = "/tmp/kolo-suid-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  std::string victim = dir + "/victim";
  std::filesystem::copy_file(bin("kolo_direct_attack"), victim);
  ASSERT_EQ(::chown(victim.c_str(), 0, 0), 0);
  ASSERT_EQ(::chmod(victim.c_str(), 04755), 0);
  std::string ready = dir + "/ready";

  auto honest = c.launchJob("honest", 2, {bin("kolo_check"), "direct"});
  std::vector<Proc> ranks;
  for (int r = 0; r < 2; ++r) {
    auto env = c.rankEnv("attack", "attack-token", 2, r, 2);
    env["KOLO_DIRECT"] = "always";
    env["KOLO_OP_TIMEOUT"] = "20";
    ranks.push_back(
        spawnProcess({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                      bin("kolo_direct_attack"), "exec", victim, ready},
                     env, c.dir() + "/attack-" + std::to_string(r) + ".log"));
  }
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(60))) << c.agentLog(0);
  std::string out0 = ranks[0].output();
  std::string out1 = ranks[1].output();
  EXPECT_NE(out1.find("rank 1: submitted, exec'ing"), std::string::npos) << out1;
  EXPECT_NE(out1.find("VICTIM euid 0: 0 elements changed"), std::string::npos)
      << "the agent wrote into the setuid-root process:\n"
      << out1;
  EXPECT_NE(out0.find("exec.target: KOLO_ERR_"), std::string::npos) << out0;
  EXPECT_NE(out0.find("; 0 elements of the victim's secret"), std::string::npos)
      << "the root process's memory reached the job:\n"
      << out0;
  EXPECT_NE(out0.find("no longer has the address space it connected with"), std::string::npos)
      << out0;
  ASSERT_TRUE(c.waitJob(honest, std::chrono::seconds(60))) << c.agentLog(0);
  for (auto& r : honest) EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(c.agent(0).exit_code, -1) << "the agent exited:\n" << c.agentLog(0);
  std::filesystem::remove_all(dir);
}

// A local user (uid 65534) listens on the coordinator's address before the
// agent starts (the coordinator is down). The agent refuses to register
// there, naming the listener's uid and the knobs, and exits within its
// register timeout; the squatter never receives a byte.
TEST(CoordinatorSquat, APortTakenByAnotherUserGetsNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the squatter runs as another user";
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t squatter = ::fork();
  if (squatter == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) ::_exit(1);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 8) != 0) ::_exit(1);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    int port = ntohs(a.sin_port);
    (void)!::write(pipefd[1], &port, sizeof port);
    // Whatever connects: the bytes it sends, counted until the parent asks.
    long got = 0;
    for (int i = 0; i < 80; ++i) {  // 4 s: past the agent's 3 s register timeout
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        int c = ::accept(fd, nullptr, nullptr);
        char buf[4096];
        ssize_t n;
        while (c >= 0 && (n = ::recv(c, buf, sizeof buf, MSG_DONTWAIT)) > 0) got += n;
        (void)!::write(pipefd[1], "C", 1);
      }
    }
    ::_exit(got > 0 ? 3 : 0);
  }
  int port = 0;
  ASSERT_EQ(::read(pipefd[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  char tmpl[] = "/tmp/kolo-squat-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  Proc agent = spawnProcess(
      {bin("kolo-agent"), "--socket", dir + "/a.sock", "--coordinator",
       "127.0.0.1:" + std::to_string(port), "--rpc-listen", "127.0.0.1:0", "--metrics-listen",
       "127.0.0.1:0", "--agent-id", "squat", "--register-timeout-s", "3"},
      {}, dir + "/agent.log");
  ASSERT_TRUE(waitProcess(agent, std::chrono::seconds(15))) << agent.output();
  std::string out = agent.output();
  EXPECT_NE(agent.exit_code, 0) << out;
  EXPECT_NE(out.find("the coordinator address 127.0.0.1:" + std::to_string(port) +
                     " is served by a process of uid 65534"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("--coordinator-uid"), std::string::npos) << out;
  int status = 0;
  ASSERT_EQ(::waitpid(squatter, &status, 0), squatter);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the squatter received bytes (status " << status << ")";
  char c;
  ::close(pipefd[1]);
  EXPECT_EQ(::read(pipefd[0], &c, 1), 0) << "the agent connected to the squatter";
  ::close(pipefd[0]);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kolo::testing
