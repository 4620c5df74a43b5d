#include "common/page_token.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"

namespace trainerd {
namespace {

constexpr size_t kSignatureDigits = 16;

std::string Signature(absl::string_view key, int64_t position, absl::string_view filter) {
  // Lengths first, so that no two (key, filter) pairs hash the same text.
  const std::string text =
      absl::StrCat(key.size(), ":", key, "|", position, "|", filter.size(), ":", filter);
  return Sha256Hex(std::string_view(text.data(), text.size())).substr(0, kSignatureDigits);
}

}  // namespace

std::string MakePageToken(absl::string_view key, int64_t position, absl::string_view filter) {
  return absl::StrCat("p1.", position, ".", Signature(key, position, filter));
}

absl::StatusOr<int64_t> ReadPageToken(absl::string_view key, absl::string_view token,
                                      absl::string_view filter) {
  const auto refuse = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "page token '", absl::CHexEscape(token.substr(0, 64)),
        "' is not one this daemon gave for this listing (a token works only with the filters of "
        "the call that returned it)"));
  };
  const std::vector<absl::string_view> parts = absl::StrSplit(token, '.');
  int64_t position = 0;
  if (parts.size() != 3 || parts[0] != "p1" || parts[1].empty() || parts[1].size() > 19 ||
      parts[1].find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(parts[1], &position) || parts[2].size() != kSignatureDigits) {
    return refuse();
  }
  const std::string expected = Signature(key, position, filter);
  if (CRYPTO_memcmp(expected.data(), parts[2].data(), kSignatureDigits) != 0) return refuse();
  return position;
}

std::string RandomPageTokenKey() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // Without the generator the key is still unknown to callers in practice; never fails a start.
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(reinterpret_cast<uintptr_t>(&b));
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace trainerd
