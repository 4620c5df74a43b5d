// Server credentials with a processor on any transport, and the checks of the TLS files.
#include "server/service/credentials.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainerd::service {
namespace {

// C-core credentials added to the server as they are. Owns them.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* credentials)
      : credentials_(credentials) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(credentials_); }

  // The processor is installed on the C-core credentials before this object is made.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {}

 private:
  int AddPortToServer(const std::string& address, grpc_server* server) override {
    return grpc_server_add_http2_port(server, address.c_str(), credentials_);
  }

  grpc_server_credentials* const credentials_;
};

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "not PEM";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};

absl::Status Unreadable(absl::string_view flag, const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "': ", why));
}

}  // namespace

absl::Status CheckTlsFiles(const TlsOptions& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both --tls_cert_file and --tls_key_file (a certificate and its private key)");
  }
  if (tls.mutual() && !tls.enabled()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file (mutual TLS) needs --tls_cert_file and --tls_key_file too");
  }
  if (!tls.enabled()) return absl::OkStatus();
  std::unique_ptr<FILE, FileCloser> cert_file(std::fopen(tls.cert_file.c_str(), "r"));
  if (cert_file == nullptr) return Unreadable("--tls_cert_file", tls.cert_file, "cannot open it");
  X509* cert = PEM_read_X509(cert_file.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) {
    return Unreadable("--tls_cert_file", tls.cert_file,
                      absl::StrCat("no PEM certificate: ", OpenSslError()));
  }
  std::unique_ptr<X509, decltype(&X509_free)> cert_owner(cert, X509_free);
  std::unique_ptr<FILE, FileCloser> key_file(std::fopen(tls.key_file.c_str(), "r"));
  if (key_file == nullptr) return Unreadable("--tls_key_file", tls.key_file, "cannot open it");
  EVP_PKEY* key = PEM_read_PrivateKey(key_file.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    return Unreadable("--tls_key_file", tls.key_file,
                      absl::StrCat("no PEM private key: ", OpenSslError()));
  }
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key_owner(key, EVP_PKEY_free);
  if (X509_check_private_key(cert, key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls_key_file '", tls.key_file,
                                                   "' is not the key of --tls_cert_file '",
                                                   tls.cert_file, "'"));
  }
  if (tls.mutual()) {
    std::unique_ptr<FILE, FileCloser> ca_file(std::fopen(tls.client_ca_file.c_str(), "r"));
    if (ca_file == nullptr) {
      return Unreadable("--tls_client_ca_file", tls.client_ca_file, "cannot open it");
    }
    X509* ca = PEM_read_X509(ca_file.get(), nullptr, nullptr, nullptr);
    if (ca == nullptr) {
      return Unreadable("--tls_client_ca_file", tls.client_ca_file,
                        absl::StrCat("no PEM certificate: ", OpenSslError()));
    }
    X509_free(ca);
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TlsOptions& tls, const std::shared_ptr<Authenticator>& authenticator) {
  grpc_server_credentials* credentials = nullptr;
  if (tls.enabled()) {
    // The provider re-reads the files every reload_interval and serves new connections with what
    // it found, so certificates rotate without a restart.
    const auto seconds = static_cast<unsigned int>(
        std::max(1.0, std::ceil(absl::ToDoubleSeconds(tls.reload_interval))));
    grpc_tls_certificate_provider* provider = grpc_tls_certificate_provider_file_watcher_create(
        tls.key_file.c_str(), tls.cert_file.c_str(),
        tls.mutual() ? tls.client_ca_file.c_str() : nullptr, seconds);
    grpc_tls_credentials_options* options = grpc_tls_credentials_options_create();
    grpc_tls_credentials_options_set_certificate_provider(options, provider);
    grpc_tls_credentials_options_watch_identity_key_cert_pairs(options);
    if (tls.mutual()) {
      grpc_tls_credentials_options_watch_root_certs(options);
      grpc_tls_credentials_options_set_cert_request_type(
          options, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      grpc_tls_credentials_options_set_cert_request_type(options,
                                                         GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    credentials = grpc_tls_server_credentials_create(options);  // takes the options
    grpc_tls_certificate_provider_release(provider);            // the options hold it
  } else {
    credentials = grpc_insecure_server_credentials_create();
  }
  if (authenticator != nullptr && authenticator->required()) {
    grpc_server_credentials_set_auth_metadata_processor(credentials, authenticator->Processor());
  }
  return std::make_shared<CoreServerCredentials>(credentials);
}

bool IsLocalAddress(absl::string_view address) {
  // A Unix socket file is guarded by its mode (0660, set at start). An abstract socket has no file
  // and no mode: any process on the host (in the same network namespace) may connect, as to a
  // TCP port, so it counts as open and needs a token, mutual TLS or --insecure.
  if (absl::StartsWith(address, "unix:")) return true;
  const size_t colon = address.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? address : address.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as four decimal parts.
  const std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (absl::string_view part : parts) {
    if (part.empty() || part.size() > 3 || part.find_first_not_of("0123456789") != absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

}  // namespace trainerd::service
