// kolo's TLS/token settings: flag > environment, files read and checked at
// start (cli/kolo_commands.h resolveSecurity, common/config_tls.h).
#include <gtest/gtest.h>

#include <fstream>

#include "cli/kolo_commands.h"
#include "test_process.h"

namespace kolo::clitest {
namespace {

using cli::KoloCliOptions;
using cli::resolveSecurity;

class SecurityOptions : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    std::string p = tmp_.path() + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  TempDir tmp_;
};

const char* kPemA = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
const char* kPemB = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";

TEST_F(SecurityOptions, NothingGivenMeansPlainTextAndNoToken) {
  KoloCliOptions o;
  ASSERT_TRUE(resolveSecurity(o, {}, {}).isOk());
  EXPECT_FALSE(o.agent_security.tls);
  EXPECT_FALSE(o.coordinator_security.tls);
  EXPECT_EQ(o.coordinator_security.token, "");
}

TEST_F(SecurityOptions, FlagBeatsEnvironmentAndEachPeerIsSeparate) {
  std::string a = write("a.pem", kPemA), b = write("b.pem", kPemB);
  KoloCliOptions o;
  ASSERT_TRUE(resolveSecurity(o, {{"coordinator-ca", b}}, {{"KOLO_COORDINATOR_CA", a}, {"KOLO_AGENT_CA", a}}).isOk());
  EXPECT_TRUE(o.coordinator_security.tls);
  EXPECT_EQ(o.coordinator_security.root_certs_pem, kPemB);
  EXPECT_EQ(o.coordinator_security.ca_file, b);
  EXPECT_TRUE(o.agent_security.tls);
  EXPECT_EQ(o.agent_security.root_certs_pem, kPemA);
}

TEST_F(SecurityOptions, TokenFromEnvironmentBeatsTheTokenFile) {
  std::string f = write("token", "  from-the-file-0123456789\n");
  KoloCliOptions o;
  ASSERT_TRUE(resolveSecurity(o, {{"agent-token-file", f}}, {}).isOk());
  EXPECT_EQ(o.agent_security.token, "from-the-file-0123456789");
  ASSERT_TRUE(resolveSecurity(o, {{"agent-token-file", f}}, {{"KOLO_AGENT_TOKEN", "from-env"}}).isOk());
  EXPECT_EQ(o.agent_security.token, "from-env");
  // A token without TLS is allowed (loopback); TLS stays off.
  EXPECT_FALSE(o.agent_security.tls);
}

TEST_F(SecurityOptions, SystemRootsWithTlsFlagAndClientCertificate) {
  std::string cert = write("c.pem", kPemA), key = write("c.key", "-----BEGIN PRIVATE KEY-----\nK\n-----END PRIVATE KEY-----\n");
  KoloCliOptions o;
  ASSERT_TRUE(resolveSecurity(o, {{"coordinator-tls", "true"}, {"coordinator-cert", cert}, {"coordinator-key", key},
                                  {"coordinator-server-name", "kolo.example"}},
                              {})
                  .isOk());
  EXPECT_TRUE(o.coordinator_security.tls);
  EXPECT_EQ(o.coordinator_security.root_certs_pem, "");
  EXPECT_EQ(o.coordinator_security.cert_chain_pem, kPemA);
  EXPECT_NE(o.coordinator_security.private_key_pem.find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(o.coordinator_security.server_name, "kolo.example");
}

TEST_F(SecurityOptions, BadSettingsNameTheFlagAndTheFile) {
  KoloCliOptions o;
  std::string cert = write("c.pem", kPemA);
  Status s = resolveSecurity(o, {{"coordinator-cert", cert}}, {});
  EXPECT_EQ(s.message(), "--coordinator-cert and --coordinator-key go together");
  std::string junk = write("junk.pem", "not a certificate\n");
  s = resolveSecurity(o, {{"agent-ca", junk}}, {});
  EXPECT_EQ(s.message(), "--agent-ca: " + junk + " holds no PEM block (-----BEGIN ...)");
  s = resolveSecurity(o, {}, {{"KOLO_COORDINATOR_CA", tmp_.path() + "/missing.pem"}});
  EXPECT_EQ(s.message(), "--coordinator-ca: cannot read " + tmp_.path() + "/missing.pem");
  std::string empty = write("empty-token", "\n");
  s = resolveSecurity(o, {{"coordinator-token-file", empty}}, {});
  EXPECT_EQ(s.message(), "--coordinator-token-file: " + empty + " is empty");
}

TEST_F(SecurityOptions, TheDaemonsConfigFileDoesNotConfuseKolo) {
  // KOLO_CONFIG names the agent's file, with keys kolo does not know.
  std::string cfg = write("agent.conf", "arena-mb = 64\n");
  KoloCliOptions o;
  EXPECT_TRUE(resolveSecurity(o, {}, {{"KOLO_CONFIG", cfg}}).isOk());
}

}  // namespace
}  // namespace kolo::clitest
