#include "common/memory_size.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/checked_size.h"

namespace trainerd {

int64_t MemorySize::Resolve(int64_t total) const {
  if (bytes > 0) return bytes;
  if (fraction > 0) return static_cast<int64_t>(std::floor(fraction * static_cast<double>(total)));
  return 0;
}

absl::StatusOr<MemorySize> ParseMemorySize(std::string_view text) {
  const std::string original(text);
  const auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", original.substr(0, 64), "' is not a memory size: ", why,
                     " (write bytes, e.g. 12GiB or 500MB, or a share of the device, e.g. 80%)"));
  };
  std::string s(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  MemorySize size;
  if (!s.empty() && s.back() == '%') {
    double percent = 0;
    if (!absl::SimpleAtod(s.substr(0, s.size() - 1), &percent) || !std::isfinite(percent)) {
      return invalid("the share is not a number");
    }
    if (percent <= 0 || percent > 100)
      return invalid("the share must be above 0% and at most 100%");
    size.fraction = percent / 100.0;
    return size;
  }
  // The number, then the unit.
  size_t digits = 0;
  while (digits < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return invalid("it does not start with a whole number");
  int64_t number = 0;
  if (!absl::SimpleAtoi(s.substr(0, digits), &number)) return invalid("the number is too large");
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(absl::string_view(s).substr(digits)));
  static const std::pair<const char*, int64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1000},
      {"kb", 1000},
      {"m", 1000 * 1000},
      {"mb", 1000 * 1000},
      {"g", int64_t{1000} * 1000 * 1000},
      {"gb", int64_t{1000} * 1000 * 1000},
      {"t", int64_t{1000} * 1000 * 1000 * 1000},
      {"tb", int64_t{1000} * 1000 * 1000 * 1000},
      {"kib", int64_t{1} << 10},
      {"mib", int64_t{1} << 20},
      {"gib", int64_t{1} << 30},
      {"tib", int64_t{1} << 40},
  };
  for (const auto& [name, factor] : kUnits) {
    if (unit != name) continue;
    absl::StatusOr<int64_t> bytes = CheckedMul(number, factor, "the memory size");
    if (!bytes.ok()) return invalid("it is too large");
    size.bytes = *bytes;
    return size;
  }
  return invalid(absl::StrCat("unknown unit '", unit, "'"));
}

}  // namespace trainerd
