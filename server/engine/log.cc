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

namespace {

// Whether `name` (what comes before ": " on a line) names an exception as the interpreter writes
// one: "RuntimeError", "builtins.ValueError", "builtins.Exception", "torch.jit.Error".
bool IsExceptionName(absl::string_view name) {
  if (name.empty()) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.') return false;
  }
  return absl::EndsWith(name, "Error") || absl::EndsWith(name, "Exception");
}

// Where LibTorch's own C++ context starts after a message (never for a user).
bool IsBacktraceLine(absl::string_view line) {
  return absl::StartsWith(line, "Exception raised from ") || absl::StartsWith(line, "frame #");
}

}  // namespace

std::string FirstLineOf(const std::exception& e) {
  const std::string what = e.what();
  const std::string first = what.substr(0, what.find('\n'));
  // The TorchScript interpreter's errors open with a fixed sentence and a traceback of the
  // module's code; the cause ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (10x4 and
  // 5x2)", "builtins.Exception: ...") comes after them, the last line that opens with an
  // exception's name, with the lines that continue its message.
  if (absl::StartsWith(first, "The following operation failed in the TorchScript interpreter")) {
    const std::vector<absl::string_view> lines = absl::StrSplit(what, '\n', absl::SkipWhitespace());
    for (size_t i = lines.size(); i-- > 1;) {
      const absl::string_view line = absl::StripAsciiWhitespace(lines[i]);
      const size_t colon = line.find(": ");
      if (colon == absl::string_view::npos || !IsExceptionName(line.substr(0, colon))) continue;
      std::string cause(line);
      for (size_t j = i + 1; j < lines.size(); ++j) {
        const absl::string_view more = absl::StripAsciiWhitespace(lines[j]);
        if (IsBacktraceLine(more)) break;
        absl::StrAppend(&cause, " ", more);
      }
      constexpr size_t kMaxCause = 500;
      return absl::StrCat(absl::StripSuffix(first, "."), ": ", cause.substr(0, kMaxCause));
    }
  }
  return first;
}

}  // namespace trainerd::engine
