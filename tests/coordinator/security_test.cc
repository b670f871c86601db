// Transport security and authentication of the real kolo-coordinator: TLS,
// mutual TLS and the bearer token on mutating calls. The certificates are
// made for each test with the openssl command (the tests skip without it).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "kolo/proto/coordinator.grpc.pb.h"
#include "tests/coordinator/coordinator_process.h"

#ifndef KOLO_COORDINATOR_BIN
#error "KOLO_COORDINATOR_BIN must name the kolo-coordinator binary"
#endif

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;

constexpr char kToken[] = "s3cr3t-t0ken-0123456789abcdef";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string findOpenssl() {
  for (const char* p : {"/usr/bin/openssl", "/usr/local/bin/openssl", "/bin/openssl"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// A throwaway CA, a server certificate for 127.0.0.1/localhost and a client
// certificate, all signed by the CA, in `dir`.
struct Pki {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string error;

  bool make(const std::string& openssl, const std::string& where) {
    dir = where;
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::vector<std::string> lines = {
        "set -e",
        "cd '" + dir + "'",
        openssl + " req -x509" + ec + " -days 2 -keyout ca.key -out ca.pem -subj /CN=kolo-test-ca" +
            " -addext basicConstraints=critical,CA:TRUE" +
            " -addext keyUsage=critical,keyCertSign,cRLSign",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n'"
        " > server.ext",
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext",
        openssl + " req" + ec + " -keyout server.key -out server.csr -subj /CN=localhost",
        openssl + " x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2" +
            " -extfile server.ext -out server.pem",
        openssl + " req" + ec + " -keyout client.key -out client.csr -subj /CN=kolo-test-agent",
        openssl + " x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2" +
            " -extfile client.ext -out client.pem",
    };
    std::string script;
    for (const std::string& line : lines) script += line + "\n";
    auto run = testing::runToCompletion("/bin/sh", {"-c", script}, milliseconds(30000));
    if (run.exit_code != 0) {
      error = "openssl failed (" + std::to_string(run.exit_code) + "):\n" + run.output;
      return false;
    }
    ca = readFile(dir + "/ca.pem");
    server_cert = readFile(dir + "/server.pem");
    server_key = readFile(dir + "/server.key");
    client_cert = readFile(dir + "/client.pem");
    client_key = readFile(dir + "/client.key");
    return !ca.empty() && !server_cert.empty() && !client_cert.empty();
  }
};

std::shared_ptr<grpc::Channel> channel(const std::string& address,
                                       std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetSslTargetNameOverride("localhost");
  return grpc::CreateCustomChannel(address, creds, args);
}

std::shared_ptr<grpc::ChannelCredentials> tlsCredentials(const Pki& pki, bool with_client_cert) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pki.ca;
  if (with_client_cert) {
    o.pem_cert_chain = pki.client_cert;
    o.pem_private_key = pki.client_key;
  }
  return grpc::SslCredentials(o);
}

grpc::Status listJobs(const std::shared_ptr<grpc::Channel>& ch) {
  auto stub = coord::Coordinator::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  coord::ListJobsReply reply;
  return stub->ListJobs(&ctx, {}, &reply);
}

class SecurityTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << "--- kolo-coordinator log ---\n" << proc_.log() << "---\n";
    proc_.kill();
  }
  // Makes the certificates in the process's temp dir; false = skip.
  bool makePki() {
    std::string openssl = findOpenssl();
    if (openssl.empty()) return false;
    std::string dir = proc_.dir() + "/pki";
    std::filesystem::create_directories(dir);
    EXPECT_TRUE(pki_.make(openssl, dir)) << pki_.error;
    return true;
  }
  void start(const std::vector<std::string>& args) {
    std::string error;
    ASSERT_TRUE(proc_.start(KOLO_COORDINATOR_BIN, args, milliseconds(15000), &error)) << error;
  }
  std::string writeTokenFile() {
    std::string path = proc_.dir() + "/token";
    std::ofstream(path) << "  " << kToken << "\n";
    ::chmod(path.c_str(), 0600);
    return path;
  }

  testing::CoordinatorProcess proc_;
  Pki pki_;
};

TEST_F(SecurityTest, TlsServerTakesTlsClientsAndRefusesPlainText) {
  if (!makePki()) GTEST_SKIP() << "openssl is not installed: cannot make test certificates";
  ASSERT_FALSE(HasFailure());
  start({"--tls-cert", pki_.dir + "/server.pem", "--tls-key", pki_.dir + "/server.key"});

  grpc::Status st = listJobs(channel(proc_.address(), tlsCredentials(pki_, false)));
  EXPECT_TRUE(st.ok()) << "TLS client with the CA: " << st.error_message();

  st = listJobs(channel(proc_.address(), grpc::InsecureChannelCredentials()));
  EXPECT_FALSE(st.ok()) << "a plain-text client must not get through";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();

  // A client that does not trust the server's CA is refused too.
  grpc::SslCredentialsOptions wrong_ca;
  wrong_ca.pem_root_certs = pki_.client_cert;  // not a CA
  st = listJobs(channel(proc_.address(), grpc::SslCredentials(wrong_ca)));
  EXPECT_FALSE(st.ok());
}

TEST_F(SecurityTest, MutualTlsRejectsAClientWithoutACertificate) {
  if (!makePki()) GTEST_SKIP() << "openssl is not installed: cannot make test certificates";
  ASSERT_FALSE(HasFailure());
  start({"--tls-cert", pki_.dir + "/server.pem", "--tls-key", pki_.dir + "/server.key",
         "--tls-client-ca", pki_.dir + "/ca.pem"});

  grpc::Status st = listJobs(channel(proc_.address(), tlsCredentials(pki_, true)));
  EXPECT_TRUE(st.ok()) << "client with a certificate from the CA: " << st.error_message();

  st = listJobs(channel(proc_.address(), tlsCredentials(pki_, false)));
  EXPECT_FALSE(st.ok()) << "a client without a certificate must be refused";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();

  st = listJobs(channel(proc_.address(), grpc::InsecureChannelCredentials()));
  EXPECT_FALSE(st.ok());
}

TEST_F(SecurityTest, BearerTokenGuardsMutatingCalls) {
  start({"--auth-token-file", writeTokenFile(), "--lease-ms", "5000"});
  auto stub =
      coord::Coordinator::NewStub(channel(proc_.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const char* token, auto&& fn) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (token != nullptr) ctx.AddMetadata("authorization", token);
    return fn(&ctx);
  };
  coord::RegisterAgentRequest reg;
  reg.mutable_agent()->set_agent_id("agent-1");
  reg.mutable_agent()->set_hostname("h");
  coord::RegisterAgentReply reg_reply;
  auto registerAgent = [&](grpc::ClientContext* ctx) {
    return stub->RegisterAgent(ctx, reg, &reg_reply);
  };

  grpc::Status st = call(nullptr, registerAgent);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("RegisterAgent needs a bearer token"), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("authorization: Bearer"), std::string::npos)
      << st.error_message();

  st = call("Bearer not-the-token", registerAgent);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("bearer token is not valid"), std::string::npos)
      << st.error_message();

  st = call(kToken, registerAgent);  // no "Bearer " scheme
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("'Bearer <token>'"), std::string::npos) << st.error_message();

  std::string good = std::string("Bearer ") + kToken;
  st = call(good.c_str(), registerAgent);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const std::string secret = reg_reply.agent_secret();

  // The other mutating calls are guarded the same way.
  coord::JoinJobRequest join;
  join.set_job_id("job");
  join.set_token("t");
  join.set_agent_id("agent-1");
  join.set_agent_secret(secret);
  join.set_local_size(1);
  join.set_world_size(2);
  coord::JoinJobReply join_reply;
  auto joinJob = [&](grpc::ClientContext* ctx) { return stub->JoinJob(ctx, join, &join_reply); };
  EXPECT_EQ(call(nullptr, joinJob).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(call(good.c_str(), joinJob).ok());

  coord::KvPutRequest put;
  put.set_job_id("job");
  put.set_token("t");
  put.set_key("k");
  put.set_value("v");
  coord::KvPutReply put_reply;
  auto kvPut = [&](grpc::ClientContext* ctx) { return stub->KvPut(ctx, put, &put_reply); };
  EXPECT_EQ(call("Bearer wrong", kvPut).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(call(good.c_str(), kvPut).ok());

  coord::LeaveJobRequest leave;
  leave.set_job_id("job");
  leave.set_token("t");
  leave.set_agent_id("agent-1");
  leave.set_agent_secret(secret);
  coord::LeaveJobReply leave_reply;
  auto leaveJob = [&](grpc::ClientContext* ctx) {
    return stub->LeaveJob(ctx, leave, &leave_reply);
  };
  EXPECT_EQ(call(nullptr, leaveJob).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // Reads and heartbeats need no bearer token (job-scoped reads need the job
  // token, heartbeats the agent's secret).
  coord::KvGetRequest get;
  get.set_job_id("job");
  get.set_token("t");
  get.set_key("k");
  coord::KvGetReply got;
  ASSERT_TRUE(
      call(nullptr, [&](grpc::ClientContext* ctx) { return stub->KvGet(ctx, get, &got); }).ok());
  EXPECT_TRUE(got.found());
  EXPECT_TRUE(listJobs(channel(proc_.address(), grpc::InsecureChannelCredentials())).ok());
  coord::HeartbeatRequest hb;
  hb.set_agent_id("agent-1");
  hb.set_agent_secret(secret);
  coord::HeartbeatReply hb_reply;
  ASSERT_TRUE(call(nullptr, [&](grpc::ClientContext* ctx) {
                return stub->Heartbeat(ctx, hb, &hb_reply);
              }).ok());
  EXPECT_TRUE(hb_reply.known());

  ASSERT_TRUE(call(good.c_str(), leaveJob).ok());
}

TEST_F(SecurityTest, TlsWithTokenCallCredentials) {
  if (!makePki()) GTEST_SKIP() << "openssl is not installed: cannot make test certificates";
  ASSERT_FALSE(HasFailure());
  start({"--tls-cert", pki_.dir + "/server.pem", "--tls-key", pki_.dir + "/server.key",
         "--auth-token-file", writeTokenFile()});
  // What a client does: TLS channel credentials composed with the standard
  // access-token call credentials (sent as "authorization: Bearer <token>").
  auto creds = grpc::CompositeChannelCredentials(tlsCredentials(pki_, false),
                                                 grpc::AccessTokenCredentials(kToken));
  auto stub = coord::Coordinator::NewStub(channel(proc_.address(), creds));
  coord::RegisterAgentRequest reg;
  reg.mutable_agent()->set_agent_id("agent-1");
  coord::RegisterAgentReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st = stub->RegisterAgent(&ctx, reg, &reply);
  EXPECT_TRUE(st.ok()) << st.error_message();

  auto wrong = grpc::CompositeChannelCredentials(tlsCredentials(pki_, false),
                                                 grpc::AccessTokenCredentials("wrong-token"));
  auto stub2 = coord::Coordinator::NewStub(channel(proc_.address(), wrong));
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  st = stub2->RegisterAgent(&ctx2, reg, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
}

TEST(SecurityFlagsTest, BadTlsAndTokenSettingsStopTheStart) {
  testing::CoordinatorProcess scratch;  // a temp dir
  std::string not_pem = scratch.dir() + "/not.pem";
  std::ofstream(not_pem) << "hello\n";
  std::string empty_token = scratch.dir() + "/empty-token";
  std::ofstream(empty_token) << "\n";

  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"--listen", "127.0.0.1:0"});
    return testing::runToCompletion(KOLO_COORDINATOR_BIN, args, milliseconds(10000));
  };
  auto r = run({"--tls-cert", not_pem});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tls-cert and --tls-key go together"), std::string::npos) << r.output;
  r = run({"--tls-client-ca", not_pem});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run({"--tls-cert", not_pem, "--tls-key", not_pem});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("holds no PEM block"), std::string::npos) << r.output;
  r = run({"--tls-cert", scratch.dir() + "/missing.pem", "--tls-key", not_pem});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot read"), std::string::npos) << r.output;
  r = run({"--auth-token-file", empty_token});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is empty"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kolo::coordinator
