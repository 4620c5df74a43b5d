// MakeTestPki: openssl commands run through the shell.
#include "tests/support/certificates.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace trainerd::testing {
namespace {

// Runs `command` with its output captured; INTERNAL with the output when it fails.
absl::Status Run(const std::string& command) {
  FILE* pipe = ::popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string output;
  std::array<char, 512> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) output += buffer.data();
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' failed: ", output));
  }
  return absl::OkStatus();
}

absl::Status MakeCa(const std::string& cert, const std::string& key, const std::string& name) {
  return Run(absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "
      "'/CN=", name, "' -keyout '", key, "' -out '", cert, "'"));
}

}  // namespace

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::Status SignCertificate(const std::string& ca_cert, const std::string& ca_key,
                             const std::string& common_name, bool server, const std::string& cert,
                             const std::string& key) {
  const std::string csr = cert + ".csr";
  const std::string ext = cert + ".ext";
  {
    std::ofstream out(ext);
    out << (server ? "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                   : "extendedKeyUsage=clientAuth\n");
  }
  const std::string new_cert = cert + ".new";
  const std::string new_key = key + ".new";
  absl::Status status = Run(absl::StrCat(
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=",
      common_name, "' -keyout '", new_key, "' -out '", csr, "'"));
  if (status.ok()) {
    status = Run(absl::StrCat("openssl x509 -req -days 1 -in '", csr, "' -CA '", ca_cert,
                              "' -CAkey '", ca_key, "' -set_serial ", ::getpid() ^ rand(),
                              " -extfile '", ext, "' -out '", new_cert, "'"));
  }
  std::remove(csr.c_str());
  std::remove(ext.c_str());
  if (!status.ok()) return status;
  // The key first: a reader that sees the new certificate then finds its key.
  if (std::rename(new_key.c_str(), key.c_str()) != 0 ||
      std::rename(new_cert.c_str(), cert.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename into ", cert));
  }
  return absl::OkStatus();
}

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  TestPki pki;
  pki.dir = dir;
  pki.ca_cert = dir + "/ca.crt";
  pki.ca_key = dir + "/ca.key";
  pki.server_cert = dir + "/server.crt";
  pki.server_key = dir + "/server.key";
  pki.client_cert = dir + "/client.crt";
  pki.client_key = dir + "/client.key";
  pki.other_ca_cert = dir + "/other-ca.crt";
  const std::string other_ca_key = dir + "/other-ca.key";
  pki.other_client_cert = dir + "/other-client.crt";
  pki.other_client_key = dir + "/other-client.key";
  absl::Status status = MakeCa(pki.ca_cert, pki.ca_key, "trainerd test CA");
  if (status.ok()) {
    status = SignCertificate(pki.ca_cert, pki.ca_key, "localhost", /*server=*/true,
                             pki.server_cert, pki.server_key);
  }
  if (status.ok()) {
    status = SignCertificate(pki.ca_cert, pki.ca_key, "alice", /*server=*/false, pki.client_cert,
                             pki.client_key);
  }
  if (status.ok()) status = MakeCa(pki.other_ca_cert, other_ca_key, "another CA");
  if (status.ok()) {
    status = SignCertificate(pki.other_ca_cert, other_ca_key, "mallory", /*server=*/false,
                             pki.other_client_cert, pki.other_client_key);
  }
  if (!status.ok()) return status;
  return pki;
}

}  // namespace trainerd::testing
