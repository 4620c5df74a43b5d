// TlsFiles and TlsIdentity (console_tls.h): GnuTLS credentials for the handshake, an OpenSSL
// store for the browser's certificate.
#include "server/console/console_tls.h"

#include <gnutls/x509.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace trainerd::console {
namespace {

// A browser's chain beyond this many certificates is not looked at.
constexpr unsigned int kMaxPeerCertificates = 8;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM certificate in it";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

absl::Status Unusable(absl::string_view flag, const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("the console's ", flag, " '", path, "': ", why));
}

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

}  // namespace

TlsIdentity::~TlsIdentity() {
  if (credentials_ != nullptr) gnutls_certificate_free_credentials(credentials_);
  if (client_ca_ != nullptr) X509_STORE_free(client_ca_);
}

absl::StatusOr<std::string> TlsIdentity::VerifiedSubject(gnutls_session_t session) const {
  if (client_ca_ == nullptr) return absl::FailedPreconditionError("no client CA");
  unsigned int count = 0;
  const gnutls_datum_t* peers =
      session == nullptr ? nullptr : gnutls_certificate_get_peers(session, &count);
  if (peers == nullptr || count == 0) {
    return absl::UnauthenticatedError(
        "this console requires a client certificate signed by the daemon's client CA; the "
        "browser sent none");
  }
  std::vector<X509Ptr> chain;
  for (unsigned int i = 0; i < count && i < kMaxPeerCertificates; ++i) {
    const unsigned char* der = peers[i].data;
    X509* cert = d2i_X509(nullptr, &der, static_cast<long>(peers[i].size));
    if (cert == nullptr) {
      ERR_clear_error();
      return absl::UnauthenticatedError("the client certificate is not X.509 DER");
    }
    chain.emplace_back(cert);
  }
  STACK_OF(X509)* untrusted = sk_X509_new_null();
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(untrusted, chain[i].get());
  X509_STORE_CTX* context = X509_STORE_CTX_new();
  bool verified = false;
  std::string why;
  if (context != nullptr &&
      X509_STORE_CTX_init(context, client_ca_, chain[0].get(), untrusted) == 1) {
    // As OpenSSL verifies a client's certificate in a TLS server (gRPC's): for client
    // authentication.
    X509_STORE_CTX_set_default(context, "ssl_client");
    verified = X509_verify_cert(context) == 1;
    if (!verified) why = X509_verify_cert_error_string(X509_STORE_CTX_get_error(context));
  }
  X509_STORE_CTX_free(context);
  sk_X509_free(untrusted);  // the certificates are chain's
  ERR_clear_error();
  if (!verified) {
    return absl::UnauthenticatedError(
        absl::StrCat("the client certificate does not verify against the daemon's client CA: ",
                     why.empty() ? "cannot verify" : why));
  }
  // The subject as gRPC's TLS names a caller (GRPC_X509_SUBJECT_PROPERTY_NAME).
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return absl::ResourceExhaustedError("out of memory");
  X509_NAME_print_ex(bio, X509_get_subject_name(chain[0].get()), 0, XN_FLAG_RFC2253);
  char* contents = nullptr;
  const long length = BIO_get_mem_data(bio, &contents);
  std::string subject = length > 0 ? std::string(contents, static_cast<size_t>(length)) : "";
  BIO_free(bio);
  if (subject.empty()) {
    return absl::UnauthenticatedError("the client certificate has an empty subject");
  }
  return subject;
}

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Load(
    const ConsoleTls& options, std::function<void(absl::string_view)> warn) {
  std::unique_ptr<TlsFiles> files(new TlsFiles(options, std::move(warn)));
  const std::string signature = files->Signature();
  absl::StatusOr<std::shared_ptr<const TlsIdentity>> identity =
      files->Read(&files->cert_pem_, &files->key_pem_);
  if (!identity.ok()) return identity.status();
  absl::MutexLock lock(&files->mu_);
  files->current_ = *std::move(identity);
  files->signature_ = signature;
  files->checked_ = absl::Now();
  return files;
}

std::string TlsFiles::Signature() const {
  return absl::StrCat(FileSignature(options_.cert_file), "|", FileSignature(options_.key_file), "|",
                      options_.mutual() ? FileSignature(options_.client_ca_file) : "");
}

absl::StatusOr<std::shared_ptr<const TlsIdentity>> TlsFiles::Read(std::string* cert_pem,
                                                                  std::string* key_pem) const {
  absl::StatusOr<std::string> cert = ReadFileToString(options_.cert_file);
  if (!cert.ok()) return Unusable("certificate", options_.cert_file, cert.status().message());
  absl::StatusOr<std::string> key = ReadFileToString(options_.key_file);
  if (!key.ok()) return Unusable("key", options_.key_file, key.status().message());
  std::shared_ptr<TlsIdentity> identity(new TlsIdentity());
  if (gnutls_certificate_allocate_credentials(&identity->credentials_) != GNUTLS_E_SUCCESS) {
    return absl::ResourceExhaustedError("cannot allocate TLS credentials");
  }
  gnutls_datum_t cert_datum{reinterpret_cast<unsigned char*>(cert->data()),
                            static_cast<unsigned int>(cert->size())};
  gnutls_datum_t key_datum{reinterpret_cast<unsigned char*>(key->data()),
                           static_cast<unsigned int>(key->size())};
  if (const int set = gnutls_certificate_set_x509_key_mem(identity->credentials_, &cert_datum,
                                                          &key_datum, GNUTLS_X509_FMT_PEM);
      set < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the console cannot serve TLS with certificate '", options_.cert_file,
                     "' and key '", options_.key_file, "': ", gnutls_strerror(set)));
  }
  if (options_.mutual()) {
    identity->client_ca_ = X509_STORE_new();
    if (identity->client_ca_ == nullptr) return absl::ResourceExhaustedError("out of memory");
    absl::StatusOr<std::string> ca = ReadFileToString(options_.client_ca_file);
    if (!ca.ok()) return Unusable("client CA", options_.client_ca_file, ca.status().message());
    BIO* bio = BIO_new_mem_buf(ca->data(), static_cast<int>(ca->size()));
    int added = 0;
    while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
      if (X509_STORE_add_cert(identity->client_ca_, cert) == 1) ++added;
      X509_free(cert);
    }
    BIO_free(bio);
    if (added == 0) {
      return Unusable("client CA", options_.client_ca_file, OpenSslError());
    }
    ERR_clear_error();  // the end of the PEM
  }
  *cert_pem = *std::move(cert);
  *key_pem = *std::move(key);
  return std::shared_ptr<const TlsIdentity>(std::move(identity));
}

std::shared_ptr<const TlsIdentity> TlsFiles::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < options_.reload_interval) return current_;
  checked_ = now;
  const std::string signature = Signature();
  if (signature == signature_) return current_;
  std::string cert_pem, key_pem;
  absl::StatusOr<std::shared_ptr<const TlsIdentity>> identity = Read(&cert_pem, &key_pem);
  if (!identity.ok()) {
    // A rotation caught half way (the key written, the certificate not yet) reads again at the
    // next check; until then the files read last serve.
    if (warn_) {
      warn_(
          absl::StrCat("the console keeps its previous TLS files: ", identity.status().message()));
    }
    return current_;
  }
  current_ = *std::move(identity);
  signature_ = signature;
  return current_;
}

}  // namespace trainerd::console
