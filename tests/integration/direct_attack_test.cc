// The direct user-memory path under attack (issue 47, docs/security.md
// "The direct path: the agent in the trainer's memory"), against the real
// kolo-agent running as root: a rank of another user, granted the path,
// execs a setuid-root program under the same pid with its connection kept
// open. The agent must neither read the root process's memory into the job
// nor write the result into it; the op fails naming the pid, and an honest
// job beside it finishes exactly.
#include <gtest/gtest.h>
#include <sys/stat.h>
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

}  // namespace
}  // namespace kolo::testing
