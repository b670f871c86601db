// gRPC credentials from the settings of common/config_tls.h. Header-only:
// include it only in targets that link gRPC++ (agent, kolo CLI).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/config_tls.h"

namespace kolo {

// A channel to `address` with the client's TLS settings (plain text when
// s.tls is false). `args` are the caller's channel arguments.
inline std::shared_ptr<grpc::Channel> makeSecureChannel(const std::string& address, const GrpcClientSecurity& s,
                                                        grpc::ChannelArguments args = {}) {
  if (!s.tls) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = s.root_certs_pem;
  ssl.pem_cert_chain = s.cert_chain_pem;
  ssl.pem_private_key = s.private_key_pem;
  if (!s.server_name.empty()) args.SetSslTargetNameOverride(s.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

// Adds the bearer token (if any) to one call. Sent by hand rather than as
// call credentials so that it also works against a plain-text coordinator
// on loopback (which then warns that the token travels in clear text).
inline void addBearerToken(grpc::ClientContext& ctx, const GrpcClientSecurity& s) {
  if (!s.token.empty()) ctx.AddMetadata("authorization", "Bearer " + s.token);
}

// What to add to an UNAVAILABLE/DEADLINE_EXCEEDED message when the cause
// may be a TLS mismatch (gRPC's own text rarely says so).
inline std::string tlsHint(const GrpcClientSecurity& s, const std::string& flag_prefix) {
  if (!s.tls) {
    return " (if the server serves TLS, give --" + flag_prefix + "-ca with the CA that signed its certificate)";
  }
  return " (TLS is on" +
         (s.ca_file.empty() ? std::string(", system root CAs: check that the server serves TLS, that one of them")
                            : ", CA " + s.ca_file + ": check that the server serves TLS, that this CA") +
         " signed its certificate and that the certificate names this address (or set --" + flag_prefix +
         "-server-name), and whether the server requires a client certificate (--" + flag_prefix + "-cert/--" +
         flag_prefix + "-key))";
}

inline std::shared_ptr<grpc::ServerCredentials> makeServerCredentials(const GrpcServerSecurity& s) {
  if (!s.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!s.client_ca_pem.empty()) {
    ssl.pem_root_certs = s.client_ca_pem;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({s.private_key_pem, s.cert_chain_pem});
  return grpc::SslServerCredentials(ssl);
}

// Checks the bearer token of a mutating call: OK when no token is required
// or the call carries the right one (compared in constant time).
inline grpc::Status checkBearerToken(const grpc::ServerContext& ctx, const std::string& required,
                                     const std::string& call) {
  if (required.empty()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        call + " needs a bearer token: send the metadata 'authorization: Bearer <token>'");
  }
  std::string got(it->second.data(), it->second.size());
  const std::string want = "Bearer " + required;
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got[i] : 0));
  }
  if (diff != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not valid for this server");
  }
  return grpc::Status::OK;
}

}  // namespace kolo
