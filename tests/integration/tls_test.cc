// TLS, mutual TLS and bearer tokens between the real daemons and the kolo
// CLI. The test makes its own CA, server and client certificates with the
// openssl command line (in a private directory, removed at the end).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <regex>

#include "harness.h"

namespace kolo::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string checkBin() { return binDir() + "/kolo_check"; }

// A CA, a server certificate for 127.0.0.1/localhost, a client certificate,
// and a second CA that signed nothing of the above.
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/kolo-pki-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    const std::string d = dir_;
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::string script =
        "set -e; cd '" + d + "'\n" +
        "openssl req -x509 " + key + " -keyout ca.key -out ca.pem -days 2 -subj /CN=kolo-test-ca\n" +
        "openssl req -x509 " + key + " -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca\n" +
        "openssl req " + key + " -keyout server.key -out server.csr -subj /CN=localhost\n" +
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' > server.ext\n" +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
        "-extfile server.ext\n" +
        "openssl req " + key + " -keyout client.key -out client.csr -subj /CN=kolo-test-client\n" +
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n" +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 "
        "-extfile client.ext\n" +
        "printf 'kolo-test-token-0123456789abcdef\\n' > token\n" +
        "printf 'kolo-wrong-token-0123456789abcdef\\n' > wrong-token\n" +
        "chmod 600 *.key token wrong-token\n";
    std::ofstream(d + "/make.sh") << script;
    std::string cmd = "sh '" + d + "/make.sh' > '" + d + "/make.log' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream f(d + "/make.log");
      std::stringstream ss;
      ss << f.rdbuf();
      error_ = "making the test certificates failed:\n" + ss.str();
      return;
    }
    ok_ = true;
  }
  ~Pki() {
    if (!dir_.empty() && std::getenv("KOLO_TEST_KEEP") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  bool ok_ = false;
  std::string dir_;
  std::string error_;
};

// A process the test started, stopped (SIGKILL) when the test ends.
struct Owned {
  Proc p;
  ~Owned() {
    killProcess(p, SIGKILL);
    waitProcess(p, seconds(5));
  }
};

// Runs `kolo args...` to completion (bounded); returns the process.
Proc runKolo(const Cluster& c, const std::vector<std::string>& args, std::map<std::string, std::string> env = {},
             const std::string& tag = "kolo") {
  static int seq = 0;
  std::vector<std::string> argv = {binDir() + "/kolo"};
  argv.insert(argv.end(), args.begin(), args.end());
  Owned o{spawnProcess(argv, env, c.dir() + "/" + tag + "-" + std::to_string(++seq) + ".log")};
  EXPECT_TRUE(waitProcess(o.p, seconds(30))) << "kolo did not finish: " << o.p.output();
  Proc p = o.p;
  o.p.pid = -1;
  return p;
}

// Starts one more agent against the cluster's coordinator, outside the
// Cluster (it is expected to fail), and waits for it to exit.
Proc runFailingAgent(const Cluster& c, std::vector<std::string> flags) {
  std::vector<std::string> argv = {binDir() + "/kolo-agent", "--socket", c.dir() + "/extra.sock",
                                   "--coordinator", c.coordinatorAddress(), "--rpc-listen", "127.0.0.1:0",
                                   "--metrics-listen", "", "--agent-id", "extra", "--register-timeout-s", "2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  Owned o{spawnProcess(argv, {}, c.dir() + "/extra-agent.log")};
  EXPECT_TRUE(waitProcess(o.p, seconds(30))) << "the agent did not give up: " << o.p.output();
  Proc p = o.p;
  o.p.pid = -1;
  return p;
}

void runJobOk(Cluster& c, const std::string& job, const std::vector<int>& sizes) {
  auto ranks = c.launchMultiJob(job, sizes, {checkBin(), "allreduce"});
  ASSERT_TRUE(c.waitJob(ranks, seconds(180))) << "ranks did not finish; agent log:\n" << c.agentLog(0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << ranks[r].output() << "\nagent 0:\n" << c.agentLog(0);
    EXPECT_NE(ranks[r].output().find("allreduce checks passed"), std::string::npos) << ranks[r].output();
  }
}

class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki(); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(pki_->ok()) << pki_->error(); }
  static std::string pem(const std::string& name) { return pki_->path(name); }
  static std::vector<std::string> serverTls() {
    return {"--tls-cert", pem("server.pem"), "--tls-key", pem("server.key")};
  }
  static Pki* pki_;
};
Pki* Tls::pki_ = nullptr;

TEST_F(Tls, AgentWithTheCaRunsAJobAndKoloListsIt) {
  ClusterOptions o;
  o.coordinator_args = serverTls();
  o.agent_env = {{"KOLO_COORDINATOR_CA", pem("ca.pem")}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  runJobOk(c, "tls1", {2});

  Proc agents = runKolo(c, {"agents", "--coordinator", c.coordinatorAddress(), "--coordinator-ca", pem("ca.pem")});
  EXPECT_EQ(agents.exit_code, 0) << agents.output();
  EXPECT_NE(agents.output().find("node0"), std::string::npos) << agents.output();
  // The CA by environment works the same.
  Proc by_env = runKolo(c, {"jobs", "--coordinator", c.coordinatorAddress(), "--json"},
                        {{"KOLO_COORDINATOR_CA", pem("ca.pem")}});
  EXPECT_EQ(by_env.exit_code, 0) << by_env.output();

  Proc plain = runKolo(c, {"agents", "--coordinator", c.coordinatorAddress()}, {{"KOLO_COORDINATOR_CA", ""}});
  EXPECT_EQ(plain.exit_code, 1) << plain.output();
  EXPECT_NE(plain.output().find("kolo: cannot reach the kolo coordinator at " + c.coordinatorAddress()),
            std::string::npos)
      << plain.output();
  EXPECT_NE(plain.output().find("give --coordinator-ca"), std::string::npos) << plain.output();

  // A CA that did not sign the server's certificate: the handshake fails.
  Proc wrong_ca =
      runKolo(c, {"agents", "--coordinator", c.coordinatorAddress(), "--coordinator-ca", pem("other-ca.pem")});
  EXPECT_EQ(wrong_ca.exit_code, 1) << wrong_ca.output();
  EXPECT_NE(wrong_ca.output().find("TLS is on, CA " + pem("other-ca.pem")), std::string::npos)
      << wrong_ca.output();
}

TEST_F(Tls, AgentWithoutTheCaFailsWithAClearError) {
  ClusterOptions o;
  o.agents = 0;
  o.coordinator_args = serverTls();
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  Proc a = runFailingAgent(c, {});
  EXPECT_EQ(a.exit_code, 1) << a.output();
  EXPECT_NE(a.output().find("cannot register with the coordinator at " + c.coordinatorAddress()),
            std::string::npos)
      << a.output();
  EXPECT_NE(a.output().find("if the server serves TLS, give --coordinator-ca"), std::string::npos)
      << a.output();

  // A CA file that is not PEM stops the start at once, naming the file.
  Proc bad = runFailingAgent(c, {"--coordinator-ca", pem("make.sh")});
  EXPECT_EQ(bad.exit_code, 2) << bad.output();
  EXPECT_NE(bad.output().find("--coordinator-ca: " + pem("make.sh") + " holds no PEM block"), std::string::npos)
      << bad.output();
}

TEST_F(Tls, MutualTlsRefusesAnAgentWithoutAClientCertificate) {
  ClusterOptions o;
  o.agents = 0;
  o.coordinator_args = serverTls();
  o.coordinator_args.push_back("--tls-client-ca");
  o.coordinator_args.push_back(pem("ca.pem"));
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  Proc a = runFailingAgent(c, {"--coordinator-ca", pem("ca.pem")});
  EXPECT_EQ(a.exit_code, 1) << a.output();
  EXPECT_NE(a.output().find("cannot register with the coordinator"), std::string::npos) << a.output();
  EXPECT_NE(a.output().find("whether the server requires a client certificate (--coordinator-cert/--coordinator-key)"),
            std::string::npos)
      << a.output();

  Proc list = runKolo(c, {"agents", "--coordinator", c.coordinatorAddress(), "--coordinator-ca", pem("ca.pem")});
  EXPECT_EQ(list.exit_code, 1) << list.output();
}

TEST_F(Tls, MutualTlsWithClientCertificatesRunsAJobAcrossTwoAgents) {
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_args = serverTls();
  o.coordinator_args.push_back("--tls-client-ca");
  o.coordinator_args.push_back(pem("ca.pem"));
  o.coordinator_args.push_back("--metrics-listen");
  o.coordinator_args.push_back("127.0.0.1:0");
  o.agent_env = {{"KOLO_COORDINATOR_CA", pem("ca.pem")},
                 {"KOLO_COORDINATOR_CERT", pem("client.pem")},
                 {"KOLO_COORDINATOR_KEY", pem("client.key")}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  runJobOk(c, "mtls", {1, 1});
  // The coordinator's own gauges on /metrics work under mutual TLS (it reads
  // them over an in-process channel, not through its TLS port).
  {
    std::smatch m;
    std::string log = c.coordinator().output();
    ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on http://([0-9.]+:[0-9]+)/metrics"))) << log;
    std::string addr = m[1];
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + seconds(12);
    while (std::chrono::steady_clock::now() < deadline) {
      text = httpGet(addr, "/metrics");
      if (text.find("kolo_coordinator_agents 2") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a gauge refreshed every 5 s
    }
    EXPECT_NE(text.find("kolo_coordinator_agents 2"), std::string::npos) << text;
    EXPECT_NE(text.find("kolo_coordinator_jobs{state=\"FINISHED\"} 1"), std::string::npos) << text;
    EXPECT_EQ(c.coordinator().output().find("wrong version number"), std::string::npos)
        << c.coordinator().output();
  }
  Proc list = runKolo(c, {"agents", "--coordinator", c.coordinatorAddress(), "--coordinator-ca", pem("ca.pem"),
                          "--coordinator-cert", pem("client.pem"), "--coordinator-key", pem("client.key")});
  EXPECT_EQ(list.exit_code, 0) << list.output();
  EXPECT_NE(list.output().find("node1"), std::string::npos) << list.output();
}

TEST_F(Tls, BearerTokenIsNeededAndAWrongOneIsRefused) {
  ClusterOptions o;
  o.agents = 2;
  o.coordinator_args = serverTls();
  o.coordinator_args.push_back("--auth-token-file");
  o.coordinator_args.push_back(pem("token"));
  o.agent_env = {{"KOLO_COORDINATOR_CA", pem("ca.pem")}, {"KOLO_COORDINATOR_TOKEN_FILE", pem("token")}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  // JoinJob, KvPut (UCX addresses) and LeaveJob all carry the token.
  runJobOk(c, "tok", {1, 1});

  Proc none = runFailingAgent(c, {"--coordinator-ca", pem("ca.pem"), "--coordinator-token-file="});
  EXPECT_EQ(none.exit_code, 1) << none.output();
  EXPECT_NE(none.output().find("RegisterAgent needs a bearer token"), std::string::npos) << none.output();
  EXPECT_NE(none.output().find("give the token with --coordinator-token-file or KOLO_COORDINATOR_TOKEN"),
            std::string::npos)
      << none.output();
  Proc wrong = runFailingAgent(c, {"--coordinator-ca", pem("ca.pem"), "--coordinator-token-file", pem("wrong-token")});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output();
  EXPECT_NE(wrong.output().find("the bearer token is not valid for this coordinator"), std::string::npos)
      << wrong.output();
  EXPECT_LT(wrong.seconds(), 10.0) << "a wrong token must not be retried until the register timeout";
  EXPECT_NE(c.coordinator().output().find("RegisterAgent refused from"), std::string::npos)
      << c.coordinator().output();
  EXPECT_NE(c.coordinator().output().find("wrong bearer token"), std::string::npos) << c.coordinator().output();
}

TEST_F(Tls, AgentStatusServiceOverTlsWithATokenForDrain) {
  ClusterOptions o;
  o.agent_env = {{"KOLO_RPC_TLS_CERT", pem("server.pem")},
                 {"KOLO_RPC_TLS_KEY", pem("server.key")},
                 {"KOLO_RPC_AUTH_TOKEN_FILE", pem("token")}};
  Cluster c(o);
  ASSERT_TRUE(c.ok()) << c.error();
  const std::string addr = c.agentRpc(0);

  Proc status = runKolo(c, {"status", "--agent", addr, "--agent-ca", pem("ca.pem")});
  EXPECT_EQ(status.exit_code, 0) << status.output();
  EXPECT_NE(status.output().find("node0"), std::string::npos) << status.output();

  Proc plain = runKolo(c, {"status", "--agent", addr});
  EXPECT_EQ(plain.exit_code, 1) << plain.output();
  EXPECT_NE(plain.output().find("cannot reach the kolo agent at " + addr), std::string::npos) << plain.output();
  EXPECT_NE(plain.output().find("give --agent-ca"), std::string::npos) << plain.output();

  Proc no_token = runKolo(c, {"drain", "--agent", addr, "--agent-ca", pem("ca.pem")});
  EXPECT_EQ(no_token.exit_code, 1) << no_token.output();
  EXPECT_NE(no_token.output().find("Drain needs a bearer token"), std::string::npos) << no_token.output();

  Proc wrong = runKolo(c, {"drain", "--agent", addr, "--agent-ca", pem("ca.pem"), "--agent-token-file",
                           pem("wrong-token")});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output();
  EXPECT_NE(wrong.output().find("the bearer token is not valid for this server"), std::string::npos)
      << wrong.output();
  EXPECT_NE(c.agentLog(0).find("refused Drain"), std::string::npos) << c.agentLog(0);

  // The refused drains changed nothing: a job still starts.
  runJobOk(c, "before-drain", {1});

  // The token by environment: the agent drains and admits no new trainer.
  Proc drain = runKolo(c, {"drain", "--agent", addr, "--agent-ca", pem("ca.pem")},
                       {{"KOLO_AGENT_TOKEN_FILE", pem("token")}});
  EXPECT_EQ(drain.exit_code, 0) << drain.output();
  EXPECT_NE(drain.output().find("is draining"), std::string::npos) << drain.output();
  auto ranks = c.launchJob("after-drain", 1, {checkBin(), "allreduce"});
  ASSERT_TRUE(c.waitJob(ranks, seconds(60)));
  EXPECT_NE(ranks[0].exit_code, 0) << ranks[0].output();
  EXPECT_NE(ranks[0].output().find("draining and admits no new trainers"), std::string::npos)
      << ranks[0].output();
}

}  // namespace
}  // namespace kolo::testing
