// Certificates for the TLS tests, made by the openssl command the way an operator would make
// them: a CA, a server certificate for localhost and 127.0.0.1, and client certificates for
// mutual TLS, all EC P-256 and valid for a day.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace trainerd::testing {

// PEM files under one folder.
struct TestPki {
  std::string dir;
  std::string ca_cert;        // the CA that signs everything below
  std::string ca_key;
  std::string server_cert;    // CN=localhost, SAN DNS:localhost, IP:127.0.0.1
  std::string server_key;
  std::string client_cert;    // CN=alice, clientAuth
  std::string client_key;
  std::string other_ca_cert;  // a second CA, trusted by nobody
  std::string other_client_cert;  // CN=mallory, signed by the second CA
  std::string other_client_key;
};

// Makes the files under `dir` (which must exist). INTERNAL with openssl's output when a command
// fails.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

// Signs a new certificate for `common_name` (SAN localhost and 127.0.0.1 when `server`, clientAuth
// otherwise) with the CA of `ca_cert` / `ca_key`, writing `cert` and `key` (a temporary name
// first, then a rename, as a rotation would).
absl::Status SignCertificate(const std::string& ca_cert, const std::string& ca_key,
                             const std::string& common_name, bool server, const std::string& cert,
                             const std::string& key);

// The whole of a file, or "" when it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace trainerd::testing
