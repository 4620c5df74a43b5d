// The console's TLS: the daemon's own certificate and key (the files the gRPC API serves with),
// and, for mutual TLS, the client CA that a browser's certificate must chain to. The files are
// re-read when they change (checked at most once per reload interval, when a connection starts),
// so that certificates rotate without a restart, as the gRPC API's do.
//
// Each connection takes the TlsIdentity current when it starts and keeps it (a shared_ptr) until
// it closes: GnuTLS reads the credentials during the handshake, and the CA store verifies the
// connection's certificate later, on its first call.
//
// Why the certificate is verified by OpenSSL rather than by GnuTLS: the caller it names must be
// the very string the gRPC API names it by (X509_NAME_print_ex with XN_FLAG_RFC2253, as gRPC's
// TLS does), so that --admin, the owners recorded on datasets and jobs, and tenancy are one for
// both doors; GnuTLS asks for the certificate and proves the browser holds its key.
#pragma once

#include <gnutls/gnutls.h>
#include <openssl/x509.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainerd::console {

struct ConsoleTls {
  // PEM files: cert_file (with its chain) and key_file together turn HTTPS on; client_ca_file
  // asks every browser for a certificate and lets the API in only for one it signed.
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  absl::Duration reload_interval = absl::Seconds(10);

  bool enabled() const { return !cert_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

// One reading of the files.
class TlsIdentity {
 public:
  ~TlsIdentity();
  TlsIdentity(const TlsIdentity&) = delete;
  TlsIdentity& operator=(const TlsIdentity&) = delete;

  // The certificate and key for a session's handshake.
  gnutls_certificate_credentials_t credentials() const { return credentials_; }
  bool mutual() const { return client_ca_ != nullptr; }

  // The subject of the certificate the browser presented on `session`, verified against the
  // client CA for client authentication (the chain it sent helping); UNAUTHENTICATED saying
  // why when it sent none or it does not verify.
  absl::StatusOr<std::string> VerifiedSubject(gnutls_session_t session) const;

 private:
  friend class TlsFiles;
  TlsIdentity() = default;

  gnutls_certificate_credentials_t credentials_ = nullptr;
  X509_STORE* client_ca_ = nullptr;  // null: no mutual TLS
};

class TlsFiles {
 public:
  // Reads the files; INVALID_ARGUMENT naming the file that cannot be read or used. `warn` logs a
  // re-reading that failed (the previous files stay in use).
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Load(
      const ConsoleTls& options, std::function<void(absl::string_view)> warn);

  // What a connection starting now uses: the files as they were last read, re-read first when
  // reload_interval has passed and one of them changed on disk.
  std::shared_ptr<const TlsIdentity> Current();

  // The certificate and key as read at start: libmicrohttpd wants a pair to start with (each
  // session is then given Current()'s).
  const std::string& cert_pem() const { return cert_pem_; }
  const std::string& key_pem() const { return key_pem_; }

 private:
  TlsFiles(ConsoleTls options, std::function<void(absl::string_view)> warn)
      : options_(std::move(options)), warn_(std::move(warn)) {}
  absl::StatusOr<std::shared_ptr<const TlsIdentity>> Read(std::string* cert_pem,
                                                          std::string* key_pem) const;
  std::string Signature() const;

  const ConsoleTls options_;
  const std::function<void(absl::string_view)> warn_;
  std::string cert_pem_;
  std::string key_pem_;
  absl::Mutex mu_;
  std::shared_ptr<const TlsIdentity> current_ ABSL_GUARDED_BY(mu_);
  std::string signature_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainerd::console
