// The agent's admin calls and the files it writes (docs/security.md, "Admin
// calls, written files and safe defaults"), through the real daemons and
// `kolo`:
//  - the decision (admin_auth.h) on peers and tokens, without a server;
//  - the defaults: the status service on loopback, timelines in their
//    directory;
//  - timeline names outside --timeline-dir (absolute, '..', a symbolic
//    link) refused over gRPC and on the trainers' socket, the file they
//    name left as it was;
//  - Drain and Timeline from a non-loopback peer: refused without a token,
//    accepted with it. The peer is a veth address in a network namespace
//    the test creates (skipped, saying why, without the privilege).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/rpc/admin_auth.h"
#include "harness.h"

namespace kolo::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A process the test started, stopped (SIGKILL) when the test ends.
struct Owned {
  Proc p;
  Owned() = default;
  explicit Owned(Proc proc) : p(std::move(proc)) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (p.pid > 0 && !p.exited) {
      killProcess(p, SIGKILL);
      waitProcess(p, seconds(5));
    }
  }
};

std::vector<std::string> prefixed(const std::vector<std::string>& prefix,
                                  std::vector<std::string> argv) {
  std::vector<std::string> out = prefix;
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// Runs `kolo args...` (under `prefix`, e.g. in a namespace) to completion.
Proc runKolo(const std::string& dir, const std::vector<std::string>& args,
             std::map<std::string, std::string> env = {},
             const std::vector<std::string>& prefix = {}) {
  static int seq = 0;
  std::vector<std::string> argv = {binDir() + "/kolo"};
  argv.insert(argv.end(), args.begin(), args.end());
  Owned o(
      spawnProcess(prefixed(prefix, argv), env, dir + "/kolo-" + std::to_string(++seq) + ".log"));
  EXPECT_TRUE(waitProcess(o.p, seconds(30))) << "kolo did not finish: " << o.p.output();
  return o.p;
}

// One more agent against `coordinator`, with its own flags; ready (its
// rpc address read from the ready file) or failed within 20 s.
struct ExtraAgent {
  Owned proc;
  std::string rpc;
  bool ready = false;
};

void startAgent(ExtraAgent& a, const std::string& dir, const std::string& id,
                const std::string& coordinator, const std::vector<std::string>& flags,
                const std::map<std::string, std::string>& env,
                const std::vector<std::string>& prefix = {}) {
  const std::string ready = dir + "/" + id + ".ready";
  std::vector<std::string> argv = {binDir() + "/kolo-agent",
                                   "--socket",
                                   dir + "/" + id + ".sock",
                                   "--coordinator",
                                   coordinator,
                                   "--metrics-listen",
                                   "",
                                   "--ready-file",
                                   ready,
                                   "--agent-id",
                                   id};
  argv.insert(argv.end(), flags.begin(), flags.end());
  a.proc.p = spawnProcess(prefixed(prefix, argv), env, dir + "/" + id + ".log");
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::string text = slurp(ready);
    if (!text.empty() && text.back() == '\n') {
      a.rpc = text.substr(0, text.find_first_of(" \n"));
      a.ready = true;
      return;
    }
    if (waitProcess(a.proc.p, milliseconds(0))) return;  // it exited: not ready
    std::this_thread::sleep_for(milliseconds(10));       // polling for a file
  }
}

std::string portOf(const std::string& address) { return address.substr(address.rfind(':') + 1); }

// --- the decision, without a server ---

TEST(AdminDecision, LoopbackPeers) {
  for (const char* peer :
       {"ipv4:127.0.0.1:5000", "ipv4:127.1.2.3:1", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000",
        "ipv6:[::ffff:127.0.0.1]:80", "unix:/run/kolo/rpc.sock"}) {
    EXPECT_TRUE(isLoopbackPeer(peer)) << peer;
  }
  for (const char* peer : {"ipv4:10.0.0.5:5000", "ipv4:128.0.0.1:1", "ipv4:0.0.0.0:1",
                           "ipv6:[::2]:1", "ipv6:[fe80::1%eth0]:1", "ipv6:[::ffff:10.0.0.1]:1",
                           "ipv6:[::]:1", "", "garbage", "ipv4:localhost:1"}) {
    EXPECT_FALSE(isLoopbackPeer(peer)) << peer;
  }
}

TEST(AdminDecision, TokenWhenConfiguredElseLoopbackOnly) {
  const std::string token = "kolo-test-token-0123456789abcdef";
  // No token configured: loopback yes, anything else no, with the reason.
  EXPECT_TRUE(checkAdminCall("Drain", "", std::nullopt, "ipv4:127.0.0.1:4000").ok());
  grpc::Status far = checkAdminCall("Drain", "", std::nullopt, "ipv4:10.0.0.5:4000");
  EXPECT_EQ(far.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(far.error_message(),
            "Drain is an admin call: this agent has no --rpc-auth-token-file, so it accepts Drain "
            "only from "
            "loopback (127.0.0.1, ::1), not from ipv4:10.0.0.5:4000; run the command on the "
            "agent's host, or give "
            "the agent --rpc-auth-token-file and the client the token (kolo --agent-token-file)");
  // Even a "token" sent to an agent without one does not open it.
  EXPECT_FALSE(checkAdminCall("Timeline", "", "Bearer " + token, "ipv4:10.0.0.5:4000").ok());
  // A token configured: needed from every peer, loopback included.
  grpc::Status none = checkAdminCall("Timeline", token, std::nullopt, "ipv4:127.0.0.1:4000");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(none.error_message(),
            "Timeline needs a bearer token: send the metadata 'authorization: Bearer <token>'");
  for (const std::string& wrong :
       {std::string("Bearer kolo-test-token-0123456789abcdeF"), "Bearer " + token + "x",
        std::string("Bearer "), token, std::string("")}) {
    grpc::Status w = checkAdminCall("Drain", token, wrong, "ipv4:127.0.0.1:4000");
    EXPECT_EQ(w.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong;
    EXPECT_EQ(w.error_message(), "the bearer token is not valid for this server");
  }
  EXPECT_TRUE(checkAdminCall("Drain", token, "Bearer " + token, "ipv4:10.0.0.5:4000").ok());
}

TEST(AdminDecision, ConstantTimeEquals) {
  EXPECT_TRUE(constantTimeEquals("", ""));
  EXPECT_TRUE(constantTimeEquals("abc", "abc"));
  EXPECT_FALSE(constantTimeEquals("abc", "abd"));
  EXPECT_FALSE(constantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(constantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(constantTimeEquals("", "a"));
  EXPECT_FALSE(constantTimeEquals(std::string("a\0b", 3), "a"));
}

// --- defaults ---

TEST(AgentDefaults, StatusServiceOnLoopbackAndTimelinesInTheirDirectory) {
  char tmpl[] = "/tmp/kolo-admin-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  // KOLO_* from the test's own environment must not change the defaults.
  Owned o(spawnProcess({"/usr/bin/env", "-u", "KOLO_RPC_LISTEN", "-u", "KOLO_TIMELINE_DIR", "-u",
                        "KOLO_CONFIG", binDir() + "/kolo-agent", "--dump-config"},
                       {}, dir + "/dump.log"));
  ASSERT_TRUE(waitProcess(o.p, seconds(30)));
  const std::string out = o.p.output();
  EXPECT_EQ(o.p.exit_code, 0) << out;
  EXPECT_NE(out.find("rpc-listen = \"127.0.0.1:7471\"  # default"), std::string::npos) << out;
  EXPECT_NE(out.find("timeline-dir = \"/var/log/kolo/timeline\"  # default"), std::string::npos)
      << out;
  fs::remove_all(dir);
}

// --- timeline names ---

class AgentTimelineDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kolo-admin-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    tl_dir_ = root_ + "/timelines";
    victim_ = root_ + "/victim.conf";
    fs::create_directory(tl_dir_);
    std::ofstream(victim_) << kVictimText;
  }
  void TearDown() override {
    std::error_code ec;
    if (std::getenv("KOLO_TEST_KEEP") == nullptr) fs::remove_all(root_, ec);
  }
  std::string where() const {
    return " (this agent writes timelines only inside " + tl_dir_ +
           ", set by --timeline-dir (KOLO_TIMELINE_DIR))";
  }
  void expectVictimUnchanged() const {
    EXPECT_EQ(slurp(victim_), kVictimText) << "the file outside changed";
  }

  const std::string kVictimText = "owned by root, chosen by the caller\n";
  std::string root_, tl_dir_, victim_;
};

TEST_F(AgentTimelineDir, NamesOutsideAreRefusedOverGrpcAndTheFileIsUnchanged) {
  Cluster c(1, {{"KOLO_TIMELINE_DIR", tl_dir_}});
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string addr = c.agentRpc(0);
  fs::create_symlink(victim_, tl_dir_ + "/trace.json");
  fs::create_symlink(root_, tl_dir_ + "/up");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {victim_, "is outside the timeline directory"},
      {tl_dir_ + "/../victim.conf", "has a '..' component"},
      {"../victim.conf", "has a '..' component"},
      {"trace.json", "is a symbolic link"},
      {"up/victim.conf", "goes through " + tl_dir_ + "/up, a symbolic link or not a directory"},
  };
  for (const auto& [name, why] : refused) {
    Proc p = runKolo(c.dir(), {"timeline", "start", name, "--agent", addr});
    EXPECT_EQ(p.exit_code, 1) << name << ": " << p.output();
    EXPECT_NE(p.output().find("kolo: the kolo agent at " + addr +
                              " answered PERMISSION_DENIED: timeline path '" + name + "' " + why +
                              where()),
              std::string::npos)
        << p.output();
    expectVictimUnchanged();
  }
  // A relative name lands inside the directory.
  Proc ok = runKolo(c.dir(), {"timeline", "start", "ok.json", "--agent", addr});
  EXPECT_EQ(ok.exit_code, 0) << ok.output();
  EXPECT_NE(ok.output().find("timeline started: " + tl_dir_ + "/ok.json"), std::string::npos)
      << ok.output();
  Proc stop = runKolo(c.dir(), {"timeline", "stop", "--agent", addr});
  EXPECT_EQ(stop.exit_code, 0) << stop.output();
  EXPECT_NE(slurp(tl_dir_ + "/ok.json").find("traceEvents"), std::string::npos);
}

TEST_F(AgentTimelineDir, ATrainersRequestOnTheSocketIsConfinedToo) {
  Cluster c(1, {{"KOLO_TIMELINE_DIR", tl_dir_}});
  ASSERT_TRUE(c.ok()) << c.error();
  // The agent refuses the name (logged with the reason) and writes nothing;
  // the trainer's start_timeline returns that refusal, naming the folder.
  auto ranks = c.launchJob("tlout", 2, {binDir() + "/kolo_check", "api-timeline", victim_});
  ASSERT_TRUE(c.waitJob(ranks, seconds(60))) << c.agentLog(0);
  EXPECT_NE(ranks[0].exit_code, 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find(
                "start_timeline: KOLO_ERR_PERMISSION_DENIED: start_timeline: timeline path '" +
                victim_ + "' is outside the timeline directory" + where()),
            std::string::npos)
      << ranks[0].output();
  const std::string log = c.agentLog(0);
  EXPECT_NE(log.find("timeline path '" + victim_ + "' is outside the timeline directory" + where()),
            std::string::npos)
      << log;
  expectVictimUnchanged();
}

TEST_F(AgentTimelineDir, StartupFileOutsideStopsTheAgentWithTheReason) {
  ClusterOptions o;
  o.agents = 0;
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  ExtraAgent a;
  startAgent(
      a, root_, "startup", c.coordinatorAddress(),
      {"--rpc-listen", "127.0.0.1:0", "--timeline-dir", tl_dir_, "--timeline-filename", victim_},
      {});
  ASSERT_FALSE(a.ready) << a.proc.p.output();
  ASSERT_TRUE(waitProcess(a.proc.p, seconds(20)));
  EXPECT_NE(a.proc.p.exit_code, 0);
  EXPECT_NE(a.proc.p.output().find("timeline path '" + victim_ +
                                   "' is outside the timeline directory" + where()),
            std::string::npos)
      << a.proc.p.output();
  expectVictimUnchanged();
}

// --- admin calls from another address ---

// A network namespace with loopback and one end of a veth pair (both ends
// inside it) carrying a private address: a client there that dials that
// address is not a loopback peer of a server there.
class PeerNamespace {
 public:
  PeerNamespace() {
    const std::string id = std::to_string(::getpid() % 100000);
    ns_ = "kolo-adm-" + id;
    addr_ = "10.203." + std::to_string(::getpid() % 250) + ".1";
    if (sh("ip netns add " + ns_) != 0) {
      why_ = "cannot create a network namespace (needs root / CAP_NET_ADMIN and iproute2)";
      return;
    }
    created_ = true;
    const std::string in = "ip netns exec " + ns_ + " ";
    bool ok = sh(in + "ip link set lo up") == 0 &&
              sh(in + "ip link add kadm0 type veth peer name kadm1") == 0 &&
              sh(in + "ip addr add " + addr_ + "/24 dev kadm0") == 0 &&
              sh(in + "ip link set kadm0 up") == 0 && sh(in + "ip link set kadm1 up") == 0;
    if (!ok) why_ = "cannot add a veth pair in " + ns_;
  }
  ~PeerNamespace() {
    if (created_) sh("ip netns del " + ns_);
  }
  const std::string& why() const { return why_; }
  const std::string& addr() const { return addr_; }
  std::vector<std::string> prefix() const { return {"/usr/bin/env", "ip", "netns", "exec", ns_}; }

 private:
  static int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }
  std::string ns_, addr_, why_;
  bool created_ = false;
};

TEST(AdminCalls, FromANonLoopbackPeerNeedTheToken) {
  PeerNamespace ns;
  if (!ns.why().empty()) GTEST_SKIP() << ns.why();
  ClusterOptions o;
  o.agents = 0;
  o.coordinator_prefix = ns.prefix();
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string tl_dir = c.dir() + "/timelines";
  fs::create_directory(tl_dir);
  const std::string token_file = c.dir() + "/admin.token";
  std::ofstream(token_file) << "kolo-admin-token-0123456789abcdef\n";
  ::chmod(token_file.c_str(), 0600);

  // No token: every address of the namespace, loopback included.
  ExtraAgent open;
  startAgent(open, c.dir(), "open", c.coordinatorAddress(), {"--rpc-listen", "0.0.0.0:0"},
             {{"KOLO_TIMELINE_DIR", tl_dir}}, ns.prefix());
  ASSERT_TRUE(open.ready) << open.proc.p.output();
  const std::string far = ns.addr() + ":" + portOf(open.rpc),
                    near = "127.0.0.1:" + portOf(open.rpc);
  EXPECT_NE(open.proc.p.output().find("listens on 0.0.0.0:0 without --rpc-auth-token-file"),
            std::string::npos)
      << open.proc.p.output();

  Proc status = runKolo(c.dir(), {"status", "--agent", far}, {}, ns.prefix());
  EXPECT_EQ(status.exit_code, 0) << "read-only calls stay open: " << status.output();
  for (const std::string call : {"Drain", "Timeline"}) {
    Proc p = call == "Drain" ? runKolo(c.dir(), {"drain", "--agent", far}, {}, ns.prefix())
                             : runKolo(c.dir(), {"timeline", "start", "far.json", "--agent", far},
                                       {}, ns.prefix());
    EXPECT_EQ(p.exit_code, 1) << p.output();
    EXPECT_NE(p.output().find(
                  "kolo: the kolo agent at " + far + " answered PERMISSION_DENIED: " + call +
                  " is an admin call: this agent has no --rpc-auth-token-file, so it accepts " +
                  call + " only from loopback (127.0.0.1, ::1), not from ipv4:" + ns.addr() + ":"),
              std::string::npos)
        << p.output();
  }
  EXPECT_FALSE(fs::exists(tl_dir + "/far.json"));
  EXPECT_NE(open.proc.p.output().find("refused Drain from ipv4:" + ns.addr()), std::string::npos)
      << open.proc.p.output();
  // From loopback the same calls go through.
  Proc tl = runKolo(c.dir(), {"timeline", "start", "near.json", "--agent", near}, {}, ns.prefix());
  EXPECT_EQ(tl.exit_code, 0) << tl.output();
  EXPECT_TRUE(fs::exists(tl_dir + "/near.json"));
  Proc drain = runKolo(c.dir(), {"drain", "--agent", near}, {}, ns.prefix());
  EXPECT_EQ(drain.exit_code, 0) << drain.output();
  EXPECT_NE(drain.output().find("is draining"), std::string::npos) << drain.output();

  // With a token: the token from anywhere, nothing without it, loopback included.
  ExtraAgent locked;
  startAgent(locked, c.dir(), "locked", c.coordinatorAddress(), {"--rpc-listen", "0.0.0.0:0"},
             {{"KOLO_TIMELINE_DIR", tl_dir}, {"KOLO_RPC_AUTH_TOKEN_FILE", token_file}},
             ns.prefix());
  ASSERT_TRUE(locked.ready) << locked.proc.p.output();
  const std::string lfar = ns.addr() + ":" + portOf(locked.rpc),
                    lnear = "127.0.0.1:" + portOf(locked.rpc);
  Proc no_token = runKolo(c.dir(), {"drain", "--agent", lnear}, {}, ns.prefix());
  EXPECT_EQ(no_token.exit_code, 1) << no_token.output();
  EXPECT_NE(no_token.output().find("refused the call: Drain needs a bearer token"),
            std::string::npos)
      << no_token.output();
  Proc with_token = runKolo(c.dir(), {"drain", "--agent", lfar, "--agent-token-file", token_file},
                            {}, ns.prefix());
  EXPECT_EQ(with_token.exit_code, 0) << with_token.output();
  EXPECT_NE(with_token.output().find("is draining"), std::string::npos) << with_token.output();
}

// --rpc-advertise-address: what `kolo agents` lists is the address given
// (e.g. a pod's IP; the node's name may answer nothing), with the bound
// port, and it answers; a bad value is refused naming the knob.
TEST(AgentAdvertise, TheListedAddressIsTheAdvertisedOneAndAnswers) {
  ClusterOptions o;
  o.agents = 1;
  o.agent_env = {{"KOLO_RPC_ADVERTISE_ADDRESS", "localhost"}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string port = c.agentRpc(0).substr(c.agentRpc(0).rfind(':') + 1);
  Proc agents = runKolo(c.dir(), {"agents", "--coordinator", c.coordinatorAddress()});
  EXPECT_EQ(agents.exit_code, 0) << agents.output();
  EXPECT_NE(agents.output().find("localhost:" + port), std::string::npos) << agents.output();
  Proc status = runKolo(c.dir(), {"status", "--agent", "localhost:" + port});
  EXPECT_EQ(status.exit_code, 0) << status.output();

  Owned bad(spawnProcess({binDir() + "/kolo-agent", "--rpc-advertise-address", "10.0.0.1:http"}, {},
                         c.dir() + "/bad-agent.log"));
  ASSERT_TRUE(waitProcess(bad.p, seconds(30))) << bad.p.output();
  EXPECT_NE(bad.p.exit_code, 0);
  EXPECT_NE(bad.p.output().find("--rpc-advertise-address must be host or host:port"),
            std::string::npos)
      << bad.p.output();
}

// Agent and trainer in sibling PID namespaces (Kubernetes pods without
// hostPID): the agent cannot see the trainer's pid (0), and `kolo status`
// shows the trainer's own pid, the one `kubectl exec` into its pod sees.
TEST(AgentStatusPids, SiblingPidNamespacesShowTheTrainersOwnPid) {
  if (std::system("/usr/bin/unshare -p -f --kill-child true >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs PID namespaces (root)";
  }
  ClusterOptions o;
  o.agents = 1;
  o.agent_prefix = {{"/usr/bin/unshare", "-p", "-f", "--kill-child"}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string stop = c.dir() + "/stop";
  auto env = c.rankEnv("pidns", "secret-pidns", 1, 0, 1, 0);
  // The trainer's own namespace: it is pid 1 there (unshare -f forks it).
  Owned rank(spawnProcess(
      {"/usr/bin/unshare", "-p", "-f", "--kill-child", binDir() + "/kolo_check", "until", stop},
      env, c.dir() + "/rank.log"));
  std::string out;
  for (int i = 0; i < 200; ++i) {
    Proc st = runKolo(c.dir(), {"status", "--agent", c.agentRpc(0)});
    out = st.output();
    if (out.find("pidns") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_NE(out.find("0 (own 1)"), std::string::npos) << out << c.agentLog(0);
  Proc js = runKolo(c.dir(), {"status", "--agent", c.agentRpc(0), "--json"});
  EXPECT_NE(js.output().find("\"own_pid\": 1,"), std::string::npos) << js.output();
  EXPECT_NE(js.output().find("\"pid\": 0,"), std::string::npos) << js.output();
  std::ofstream(stop) << "x";
  EXPECT_TRUE(waitProcess(rank.p, seconds(60))) << rank.p.output();
  EXPECT_EQ(rank.p.exit_code, 0) << rank.p.output();
}

}  // namespace
}  // namespace kolo::testing
