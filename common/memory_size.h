// Sizes of memory as operators write them on command lines: bytes ("1073741824"), with a binary or
// decimal unit ("12GiB", "512MiB", "4G", "500MB"), or a share of what the device has ("80%").
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace trainerd {

// A parsed size: exactly one of the two is set (bytes > 0 or fraction > 0), or neither ("0": no
// size, e.g. no budget).
struct MemorySize {
  int64_t bytes = 0;
  double fraction = 0.0;  // (0, 1]: of the device's memory

  bool unset() const { return bytes == 0 && fraction == 0.0; }
  // bytes, or fraction * total (rounded down), or 0 when unset.
  int64_t Resolve(int64_t total) const;
};

// Parses "0", "N" (bytes), "N<unit>" with unit KiB, MiB, GiB, TiB (powers of 1024) or K, M, G, T,
// KB, MB, GB, TB (powers of 1000), any case, or "P%" with 0 < P <= 100. INVALID_ARGUMENT with a
// sentence otherwise (negative, overflowing, an unknown unit, a share over 100%).
absl::StatusOr<MemorySize> ParseMemorySize(std::string_view text);

}  // namespace trainerd
