#include "server/engine/log.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainerd::engine {

void Log(LogLevel level, std::string_view message) {
  const char tag = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  std::string line = absl::StrCat(
      std::string(1, tag), absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(), absl::UTCTimeZone()),
      " trainerd] ", std::string(message), "\n");
  // One write(2), so that lines from different threads never interleave.
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

std::string FirstLineOf(const std::exception& e) {
  const std::string what = e.what();
  const std::string first = what.substr(0, what.find('\n'));
  // The TorchScript interpreter's errors open with a fixed sentence and a traceback of the
  // module's code; the line that names the cause ("RuntimeError: ... DefaultCPUAllocator: not
  // enough memory ...") comes after them.
  if (absl::StartsWith(first, "The following operation failed in the TorchScript interpreter")) {
    const std::vector<absl::string_view> lines = absl::StrSplit(what, '\n', absl::SkipWhitespace());
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
      const absl::string_view line = absl::StripAsciiWhitespace(*it);
      const size_t colon = line.find(": ");
      if (colon != absl::string_view::npos && colon > 0 &&
          absl::EndsWith(line.substr(0, colon), "Error")) {
        constexpr size_t kMaxCause = 500;
        return absl::StrCat(absl::StripSuffix(first, "."), ": ", line.substr(0, kMaxCause));
      }
    }
  }
  return first;
}

}  // namespace trainerd::engine
