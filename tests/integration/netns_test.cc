// Two agents in separate network namespaces joined by a veth pair: the
// cross-agent path over a real (virtual) link, with each host backend (ucx
// forced onto TCP, and tcp, which must find the peer's veth address after
// its loopback address leads nowhere). The test creates and removes the
// namespaces itself; it skips, saying why, where the privilege is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "harness.h"

namespace kolo::testing {
namespace {

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

class VethPair {
 public:
  VethPair() {
    std::string id = std::to_string(::getpid() % 100000);
    ns_a_ = "kolo-a-" + id;
    ns_b_ = "kolo-b-" + id;
    dev_a_ = "kva" + id;
    dev_b_ = "kvb" + id;
    subnet_ = "10.201." + std::to_string(::getpid() % 250) + ".";
    if (sh("ip netns add " + ns_a_) != 0) {
      why_ = "cannot create network namespaces (needs root / CAP_NET_ADMIN and iproute2)";
      return;
    }
    created_ = true;
    bool ok = sh("ip netns add " + ns_b_) == 0 &&
              sh("ip link add " + dev_a_ + " type veth peer name " + dev_b_) == 0 &&
              sh("ip link set " + dev_a_ + " netns " + ns_a_) == 0 &&
              sh("ip link set " + dev_b_ + " netns " + ns_b_) == 0 &&
              sh(exec(ns_a_) + "ip addr add " + addrA() + "/24 dev " + dev_a_) == 0 &&
              sh(exec(ns_b_) + "ip addr add " + addrB() + "/24 dev " + dev_b_) == 0 &&
              sh(exec(ns_a_) + "ip link set " + dev_a_ + " up") == 0 &&
              sh(exec(ns_b_) + "ip link set " + dev_b_ + " up") == 0 &&
              sh(exec(ns_a_) + "ip link set lo up") == 0 && sh(exec(ns_b_) + "ip link set lo up") == 0;
    if (!ok) setup_error_ = "could not set up the veth pair between " + ns_a_ + " and " + ns_b_;
  }
  ~VethPair() {
    if (created_) {
      sh("ip netns del " + ns_a_);  // removes the veth pair with it
      sh("ip netns del " + ns_b_);
    }
  }
  bool ok() const { return why_.empty(); }
  const std::string& setupError() const { return setup_error_; }
  const std::string& why() const { return why_; }
  std::string addrA() const { return subnet_ + "1"; }
  std::string addrB() const { return subnet_ + "2"; }
  std::vector<std::string> prefixA() const { return {"/usr/bin/env", "ip", "netns", "exec", ns_a_}; }
  std::vector<std::string> prefixB() const { return {"/usr/bin/env", "ip", "netns", "exec", ns_b_}; }
  const std::string& devA() const { return dev_a_; }
  const std::string& devB() const { return dev_b_; }
  // Takes A's end of the pair down (B's end loses its carrier with it).
  bool linkDown() const { return sh(exec(ns_a_) + "ip link set " + dev_a_ + " down") == 0; }

 private:
  static std::string exec(const std::string& ns) { return "ip netns exec " + ns + " "; }
  std::string ns_a_, ns_b_, dev_a_, dev_b_, subnet_, why_, setup_error_;
  bool created_ = false;
};

// The backend under test, as the agents' environment.
class NetworkNamespaces : public ::testing::TestWithParam<std::string> {
 protected:
  static std::map<std::string, std::string> backendEnv() {
    return {{"UCX_TLS", "tcp"}, {"KOLO_BACKEND", GetParam()}};
  }
};

TEST_P(NetworkNamespaces, AgentsJoinedByVethAllreduceOverTcp) {
  VethPair veth;
  if (!veth.ok()) GTEST_SKIP() << veth.why();
  ASSERT_TRUE(veth.setupError().empty()) << veth.setupError();
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_prefix = veth.prefixA();
  o.coordinator_listen = veth.addrA() + ":0";
  o.agent_prefix = {veth.prefixA(), veth.prefixB()};
  o.agent_env = backendEnv();
  o.per_agent_env = {{{"UCX_NET_DEVICES", veth.devA()}}, {{"UCX_NET_DEVICES", veth.devB()}}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  // One rank per agent, each inside its agent's namespace.
  std::vector<Proc> ranks;
  std::vector<std::vector<std::string>> prefixes = {veth.prefixA(), veth.prefixB()};
  for (int a = 0; a < 2; ++a) {
    auto env = c.rankEnv("veth", "secret-veth", 2, 0, 1, a);
    std::vector<std::string> argv = prefixes[a];
    argv.push_back(binDir() + "/kolo_check");
    argv.push_back("allreduce");
    ranks.push_back(spawnProcess(argv, env, c.dir() + "/veth-rank" + std::to_string(a) + ".log"));
  }
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::seconds(240))) << c.agentLog(0) << c.agentLog(1);
  for (auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output() << c.agentLog(0) << c.agentLog(1);
    EXPECT_NE(r.output().find("allreduce checks passed"), std::string::npos) << r.output();
  }
}

// The veth link goes down under a running job. Node0 shares namespace A
// with the coordinator; node1 is cut off from both. Node0's rank fails by
// the coordinator's lease on node1 (--lease-ms 3000, heartbeat 500 ms: the
// harness's settings) or by its own backend timeout, whichever first;
// node1's rank, which cannot reach the coordinator, fails by the backend
// timeout (--backend-timeout-ms 4000 here; default 30000): nothing it waits
// for arrives. Each error names the other node. Bound asserted per rank:
// the backend timeout + the backend's 2 s drain grace + 3 s slack for a
// loaded machine.
TEST_P(NetworkNamespaces, LinkDownFailsTheJobOnBothSidesWithinTheTimeouts) {
  VethPair veth;
  if (!veth.ok()) GTEST_SKIP() << veth.why();
  ASSERT_TRUE(veth.setupError().empty()) << veth.setupError();
  constexpr int kBackendTimeoutMs = 4000;
  const auto bound = std::chrono::milliseconds(kBackendTimeoutMs + 2000 + 3000);
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_prefix = veth.prefixA();
  o.coordinator_listen = veth.addrA() + ":0";
  o.agent_prefix = {veth.prefixA(), veth.prefixB()};
  o.agent_env = backendEnv();
  o.agent_env["KOLO_BACKEND_TIMEOUT_MS"] = std::to_string(kBackendTimeoutMs);
  o.per_agent_env = {{{"UCX_NET_DEVICES", veth.devA()}}, {{"UCX_NET_DEVICES", veth.devB()}}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<Proc> ranks;
  std::vector<std::vector<std::string>> prefixes = {veth.prefixA(), veth.prefixB()};
  for (int a = 0; a < 2; ++a) {
    auto env = c.rankEnv("cut", "secret-cut", 2, 0, 1, a);
    std::vector<std::string> argv = prefixes[a];
    argv.insert(argv.end(), {binDir() + "/kolo_check", "loop", "100000000"});
    ranks.push_back(spawnProcess(argv, env, c.dir() + "/cut-rank" + std::to_string(a) + ".log"));
  }
  // Training: both agents connected over the link, then 1 s of allreduces.
  const std::string connected = "job cut: agents connected";
  auto form_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (c.agentLog(0).find(connected) == std::string::npos ||
         c.agentLog(1).find(connected) == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), form_deadline) << "the job did not form\n" << allLogs(c, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the agents' logs
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  for (auto& r : ranks) {
    ASSERT_FALSE(waitProcess(r, std::chrono::milliseconds(0))) << "a rank ended before the fault: " << r.output();
  }

  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(veth.linkDown());
  // Both ranks polled together, so that each one's end is stamped when it
  // happens (bounded: a rank that outlives the bound by 30 s has hung).
  const auto hung = t0 + bound + std::chrono::seconds(30);
  while ((!ranks[0].exited || !ranks[1].exited) && std::chrono::steady_clock::now() < hung) {
    for (auto& r : ranks) waitProcess(r, std::chrono::milliseconds(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling the ranks' exits
  }
  ASSERT_TRUE(c.waitJob(ranks, std::chrono::milliseconds(0)))
      << "a rank hung after the link went down\n" << ranks[0].output() << ranks[1].output() << allLogs(c, 2);
  const char* node[2] = {"node0", "node1"};
  for (int a = 0; a < 2; ++a) {
    const Proc& r = ranks[a];
    const double s = std::chrono::duration<double>(r.ended - t0).count();
    std::printf("link-down detection: %s's rank ended %.2f s after the link went down\n", node[a], s);
    std::string out = r.output();
    EXPECT_EQ(r.exit_code, 1) << out;
    EXPECT_LE(r.ended - t0, bound) << node[a] << "'s rank took " << s << " s\n" << out << allLogs(c, 2);
    EXPECT_NE(out.find("KOLO_ERR_PEER_FAILURE"), std::string::npos) << out;
    // The error names the node on the other side of the link.
    EXPECT_NE(out.find(node[1 - a]), std::string::npos) << out;
  }
  // Both daemons are still up (they fail the job, not themselves).
  for (int a = 0; a < 2; ++a) {
    EXPECT_FALSE(waitProcess(c.agent(a), std::chrono::milliseconds(0))) << c.agentLog(a);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, NetworkNamespaces, ::testing::Values("ucx", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace kolo::testing
