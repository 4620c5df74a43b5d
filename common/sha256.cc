// SHA-256 through OpenSSL's EVP digest interface.
#include "common/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

namespace trainerd {
namespace {

// The EVP calls fail only when memory runs out or OpenSSL is broken; the header's API has no
// status to report that with, so the process stops (as it would on a failed operator new).
void CheckOpenSsl(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "trainerd: OpenSSL %s failed\n", what);
  std::abort();
}

struct EvpMdCtxDeleter {
  void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};

}  // namespace

struct Sha256::Impl {
  std::unique_ptr<EVP_MD_CTX, EvpMdCtxDeleter> context;
  // Set by the first HexDigest; later calls return it again and Update is then ignored.
  std::string digest;
  bool finished = false;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->context.reset(EVP_MD_CTX_new());
  CheckOpenSsl(impl_->context != nullptr, "EVP_MD_CTX_new");
  CheckOpenSsl(EVP_DigestInit_ex(impl_->context.get(), EVP_sha256(), nullptr) == 1,
               "EVP_DigestInit_ex");
}

Sha256::~Sha256() = default;

void Sha256::Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }

void Sha256::Update(const void* data, size_t size) {
  if (impl_->finished || size == 0) return;
  CheckOpenSsl(EVP_DigestUpdate(impl_->context.get(), data, size) == 1, "EVP_DigestUpdate");
}

std::string Sha256::HexDigest() {
  if (impl_->finished) return impl_->digest;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  CheckOpenSsl(EVP_DigestFinal_ex(impl_->context.get(), digest, &length) == 1,
               "EVP_DigestFinal_ex");
  static constexpr char kHex[] = "0123456789abcdef";
  impl_->digest.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    impl_->digest.push_back(kHex[digest[i] >> 4]);
    impl_->digest.push_back(kHex[digest[i] & 0xf]);
  }
  impl_->finished = true;
  return impl_->digest;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes);
  return sha.HexDigest();
}

}  // namespace trainerd
