#include "server/service/peer_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace trainerd::service {

absl::StatusOr<std::string> ReadFlagFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerCredentials(
    const PeerClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
      !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "--peer_tls_cert and --peer_tls_key go together (this daemon's client certificate)");
    }
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      absl::StatusOr<std::string> ca = ReadFlagFile(options.tls_ca_file, "--peer_tls_ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (!options.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFlagFile(options.tls_cert_file, "--peer_tls_cert");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFlagFile(options.tls_key_file, "--peer_tls_key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  }
  return credentials;
}

}  // namespace trainerd::service
