#include "server/engine/log.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
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
  return what.substr(0, what.find('\n'));
}

}  // namespace trainerd::engine
