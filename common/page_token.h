// Page tokens that a caller cannot forge or carry to another listing: a position signed, with a
// key the issuer keeps, together with the filter of the listing that made it. A token whose
// signature does not match (forged, altered, from another filter, from another daemon's records)
// is refused, so that an API that promises INVALID_ARGUMENT for a token it did not give keeps
// that promise.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainerd {

// "p1.<position>.<16 hex digits of SHA-256 over key, position and filter>".
std::string MakePageToken(absl::string_view key, int64_t position, absl::string_view filter);

// The position of a token MakePageToken made with the same key and filter. INVALID_ARGUMENT
// ("page token '<first 64 characters>' is not one this daemon gave for this listing") otherwise.
absl::StatusOr<int64_t> ReadPageToken(absl::string_view key, absl::string_view token,
                                      absl::string_view filter);

// 32 random hex digits from the operating system's generator, for a key.
std::string RandomPageTokenKey();

}  // namespace trainerd
