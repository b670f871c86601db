// TLS and bearer-token settings of kolo's gRPC endpoints, shared by the
// agent (its coordinator client and its status service) and the `kolo` CLI.
// Header-only: the parts that need gRPC compile only in targets that link
// gRPC++ (kolo_common itself does not).
//
// Client side, for a peer named by `prefix` ("coordinator"):
//   --<prefix>-ca FILE          PEM CA bundle to verify the server (turns TLS on)
//   --<prefix>-tls              TLS with the system's root CAs (no --<prefix>-ca)
//   --<prefix>-cert/-key FILE   client certificate and key (mutual TLS)
//   --<prefix>-server-name N    name to check the server certificate against
//   --<prefix>-token T          bearer token (flag > env > config file)
//   --<prefix>-token-file FILE  the token in a file (used when no token is given)
// Server side: --<prefix>-tls-cert/-key FILE, --<prefix>-tls-client-ca FILE
// and --<prefix>-auth-token-file FILE (prefix "rpc" for the agent).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace kolo {

// What a gRPC client needs to reach a server that may use TLS and tokens.
// The PEM texts are read at configuration time, so a bad file stops the
// start with the file named, not the first call.
struct GrpcClientSecurity {
  bool tls = false;
  std::string root_certs_pem;   // empty with tls: the system's roots
  std::string cert_chain_pem;   // mutual TLS (with private_key_pem)
  std::string private_key_pem;
  std::string server_name;      // overrides the name checked in the server's certificate
  std::string token;            // sent as "authorization: Bearer <token>"
  std::string ca_file;          // for messages
  // Plain text only: the uid besides root and the client's own that may
  // serve the address on this host (-1: none; agent/coord/listener_owner.h).
  int64_t server_uid = -1;
};

struct GrpcServerSecurity {
  std::string cert_chain_pem;   // empty: plain text
  std::string private_key_pem;
  std::string client_ca_pem;    // non-empty: require and verify client certificates
  std::string token;            // required on mutating calls when non-empty
  bool tls() const { return !cert_chain_pem.empty(); }
};

namespace tls_detail {

inline StatusOr<std::string> readSmallFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalidArgument(what + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > 1024 * 1024) return invalidArgument(what + ": " + path + " is too large");
  return text;
}

}  // namespace tls_detail

// A PEM file's text; an error names the flag and the file.
inline StatusOr<std::string> readPemFile(const std::string& what, const std::string& path) {
  ASSIGN_OR_RETURN(std::string pem, tls_detail::readSmallFile(what, path));
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return invalidArgument(what + ": " + path + " holds no PEM block (-----BEGIN ...)");
  }
  return pem;
}

// A bearer token: the file's one word (surrounding whitespace ignored).
inline StatusOr<std::string> readTokenFile(const std::string& what, const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, tls_detail::readSmallFile(what, path));
  const char* ws = " \t\r\n";
  size_t first = text.find_first_not_of(ws);
  if (first == std::string::npos) return invalidArgument(what + ": " + path + " is empty");
  std::string token = text.substr(first, text.find_last_not_of(ws) - first + 1);
  if (token.find_first_of(ws) != std::string::npos) {
    return invalidArgument(what + ": " + path + " must hold one token without spaces");
  }
  return token;
}

// The client knobs for the peer `prefix`, e.g. "coordinator" (see above).
inline void defineGrpcClientKnobs(Config& c, const std::string& prefix, const std::string& peer) {
  c.define(prefix + "-ca", KnobType::kString, "",
           "PEM CA bundle that signed the " + peer + "'s TLS certificate: connect with TLS (empty = plain text)")
      .define(prefix + "-tls", KnobType::kBool, "false",
              "Connect to the " + peer + " with TLS, verified against the system's root CAs (implied by --" +
                  prefix + "-ca)")
      .define(prefix + "-cert", KnobType::kString, "",
              "PEM client certificate (chain) for mutual TLS with the " + peer + " (needs --" + prefix + "-key)")
      .define(prefix + "-key", KnobType::kString, "", "PEM private key of --" + prefix + "-cert")
      .define(prefix + "-server-name", KnobType::kString, "",
              "Name to check the " + peer + "'s certificate against (default: the host of the address)")
      .define(prefix + "-token", KnobType::kString, "",
              "Bearer token for the " + peer + "'s mutating calls (prefer the environment or --" + prefix +
                  "-token-file: flags show in ps)")
      .define(prefix + "-token-file", KnobType::kString, "",
              "File holding the bearer token (used when --" + prefix + "-token is empty)");
}

inline StatusOr<GrpcClientSecurity> grpcClientSecurityFrom(const Config& c, const std::string& prefix) {
  GrpcClientSecurity s;
  const std::string ca = c.getString(prefix + "-ca");
  const std::string cert = c.getString(prefix + "-cert");
  const std::string key = c.getString(prefix + "-key");
  if (cert.empty() != key.empty()) {
    return invalidArgument("--" + prefix + "-cert and --" + prefix + "-key go together");
  }
  s.tls = !ca.empty() || !cert.empty() || c.getBool(prefix + "-tls");
  s.ca_file = ca;
  if (!ca.empty()) {
    ASSIGN_OR_RETURN(s.root_certs_pem, readPemFile("--" + prefix + "-ca", ca));
  }
  if (!cert.empty()) {
    ASSIGN_OR_RETURN(s.cert_chain_pem, readPemFile("--" + prefix + "-cert", cert));
    ASSIGN_OR_RETURN(s.private_key_pem, readPemFile("--" + prefix + "-key", key));
  }
  s.server_name = c.getString(prefix + "-server-name");
  s.token = c.getString(prefix + "-token");
  const std::string token_file = c.getString(prefix + "-token-file");
  if (s.token.empty() && !token_file.empty()) {
    ASSIGN_OR_RETURN(s.token, readTokenFile("--" + prefix + "-token-file", token_file));
  }
  return s;
}

// The server knobs with names "<prefix>-tls-cert" etc. (prefix "rpc").
inline void defineGrpcServerKnobs(Config& c, const std::string& prefix, const std::string& what) {
  c.define(prefix + "-tls-cert", KnobType::kString, "",
           "PEM certificate (chain): serve the " + what + " over TLS only (needs --" + prefix + "-tls-key)")
      .define(prefix + "-tls-key", KnobType::kString, "", "PEM private key of --" + prefix + "-tls-cert")
      .define(prefix + "-tls-client-ca", KnobType::kString, "",
              "PEM CA bundle: the " + what + " requires a client certificate signed by it (mutual TLS)")
      .define(prefix + "-auth-token-file", KnobType::kString, "",
              "File holding a bearer token that the " + what +
                  "'s mutating calls must carry ('authorization: Bearer <token>'); empty = none");
}

inline StatusOr<GrpcServerSecurity> grpcServerSecurityFrom(const Config& c, const std::string& prefix) {
  GrpcServerSecurity s;
  const std::string cert = c.getString(prefix + "-tls-cert");
  const std::string key = c.getString(prefix + "-tls-key");
  const std::string client_ca = c.getString(prefix + "-tls-client-ca");
  if (cert.empty() != key.empty()) {
    return invalidArgument("--" + prefix + "-tls-cert and --" + prefix + "-tls-key go together");
  }
  if (!client_ca.empty() && cert.empty()) {
    return invalidArgument("--" + prefix + "-tls-client-ca needs --" + prefix + "-tls-cert and --" + prefix +
                           "-tls-key (mutual TLS is TLS)");
  }
  if (!cert.empty()) {
    ASSIGN_OR_RETURN(s.cert_chain_pem, readPemFile("--" + prefix + "-tls-cert", cert));
    ASSIGN_OR_RETURN(s.private_key_pem, readPemFile("--" + prefix + "-tls-key", key));
  }
  if (!client_ca.empty()) {
    ASSIGN_OR_RETURN(s.client_ca_pem, readPemFile("--" + prefix + "-tls-client-ca", client_ca));
  }
  const std::string token_file = c.getString(prefix + "-auth-token-file");
  if (!token_file.empty()) {
    ASSIGN_OR_RETURN(s.token, readTokenFile("--" + prefix + "-auth-token-file", token_file));
    if (s.token.size() < 16) {
      return invalidArgument("--" + prefix + "-auth-token-file: " + token_file +
                             " must hold a token of at least 16 characters");
    }
  }
  return s;
}

}  // namespace kolo
