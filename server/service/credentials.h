// The server's credentials: plaintext or TLS (with certificates re-read from disk when they
// change, so that they rotate without a restart), with the Authenticator's processor deciding
// every call.
//
// Why our own grpc::ServerCredentials: gRPC 1.51's C++ InsecureServerCredentials aborts when given
// an AuthMetadataProcessor, yet a token over plaintext is how trainerd runs inside a pod or behind
// a TLS-terminating proxy. C-core attaches a processor to any credentials
// (grpc_server_credentials_set_auth_metadata_processor), so this class holds C-core credentials
// (insecure, or TLS with a file-watcher certificate provider) and adds them to the server itself.
#pragma once

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/service/auth.h"

namespace trainerd::service {

struct TlsOptions {
  // PEM files. cert_file and key_file together turn TLS on; client_ca_file adds mutual TLS
  // (every client must present a certificate it signed). All empty: plaintext.
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  // How often the files are checked for changes.
  absl::Duration reload_interval = absl::Seconds(10);

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

// Checks the files before the server starts: both of cert and key or neither, a client CA only
// with them, readable PEM, the key matching the certificate. INVALID_ARGUMENT naming the flag and
// the file.
absl::Status CheckTlsFiles(const TlsOptions& tls);

// Credentials for the listening port. `authenticator` (may be null) decides each call.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TlsOptions& tls, const std::shared_ptr<Authenticator>& authenticator);

// Whether a --listen address reaches only this machine: a Unix socket ("unix:PATH"), 127.0.0.0/8,
// ::1 or "localhost". Anything else (0.0.0.0, [::], a host name, an interface address, and an
// abstract Unix socket "unix-abstract:NAME", which no file mode guards) is open.
bool IsLocalAddress(absl::string_view address);

}  // namespace trainerd::service
