#include "server/monitor/process_stats.h"

#include <time.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainerd::monitor {
namespace {

// Fields after the command name's closing ')' start at field 3 (state); utime and stime are
// fields 14 and 15 (proc(5)).
constexpr int kUtimeAfterName = 14 - 3;
constexpr int kStimeAfterName = 15 - 3;

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

absl::StatusOr<double> ParseProcStatCpuSeconds(absl::string_view stat, int64_t ticks_per_second) {
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos || ticks_per_second <= 0) {
    return absl::InvalidArgumentError("malformed /proc/<pid>/stat: no ')' after the name");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), absl::ByAnyChar(" \n\t"), absl::SkipEmpty());
  uint64_t utime = 0;
  uint64_t stime = 0;
  if (static_cast<int>(fields.size()) <= kStimeAfterName ||
      !absl::SimpleAtoi(fields[kUtimeAfterName], &utime) ||
      !absl::SimpleAtoi(fields[kStimeAfterName], &stime)) {
    return absl::InvalidArgumentError("malformed /proc/<pid>/stat: no utime and stime");
  }
  return static_cast<double>(utime + stime) / static_cast<double>(ticks_per_second);
}

absl::StatusOr<int64_t> ParseProcStatmResidentBytes(absl::string_view statm, int64_t page_size) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(statm, absl::ByAnyChar(" \n\t"), absl::SkipEmpty());
  int64_t pages = 0;
  if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &pages) || pages < 0) {
    return absl::InvalidArgumentError("malformed /proc/<pid>/statm: no resident pages");
  }
  return pages * page_size;
}

std::string ParseCpuModelName(absl::string_view cpuinfo) {
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::StripAsciiWhitespace(line.substr(0, colon)) != "model name") continue;
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (!value.empty()) return std::string(value);
  }
  return "cpu";
}

absl::StatusOr<int64_t> ParseMemTotalBytes(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::StartsWith(line, "MemTotal:")) continue;
    // "MemTotal:       16303268 kB": the kernel always writes kB (KiB).
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line.substr(9), ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (fields.empty() || !absl::SimpleAtoi(fields[0], &kib) || kib < 0 ||
        (fields.size() > 1 && fields[1] != "kB")) {
      break;
    }
    return kib * 1024;
  }
  return absl::InvalidArgumentError("malformed /proc/meminfo: no MemTotal in kB");
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  ProcessStats stats;
  timespec cpu = {};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0) {
    stats.cpu_seconds = static_cast<double>(cpu.tv_sec) + cpu.tv_nsec * 1e-9;
  } else {
    absl::StatusOr<std::string> stat = ReadFile("/proc/self/stat");
    if (!stat.ok()) return stat.status();
    absl::StatusOr<double> seconds = ParseProcStatCpuSeconds(*stat, sysconf(_SC_CLK_TCK));
    if (!seconds.ok()) return seconds.status();
    stats.cpu_seconds = *seconds;
  }
  absl::StatusOr<std::string> statm = ReadFile("/proc/self/statm");
  if (!statm.ok()) return statm.status();
  absl::StatusOr<int64_t> resident = ParseProcStatmResidentBytes(*statm, sysconf(_SC_PAGESIZE));
  if (!resident.ok()) return resident.status();
  stats.resident_bytes = *resident;
  return stats;
}

DescriptorStats ReadDescriptorStats() {
  DescriptorStats stats;
  if (DIR* fds = ::opendir("/proc/self/fd"); fds != nullptr) {
    int64_t count = 0;
    while (const dirent* entry = ::readdir(fds)) {
      if (entry->d_name[0] != '.') ++count;
    }
    ::closedir(fds);
    stats.open_fds = count - 1;  // not the descriptor opendir itself holds
  }
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    stats.max_fds = static_cast<int64_t>(limit.rlim_cur);
  }
  return stats;
}

int OnlineCpus() {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 ? static_cast<int>(cpus) : 1;
}

std::string CpuModelName() {
  absl::StatusOr<std::string> cpuinfo = ReadFile("/proc/cpuinfo");
  return cpuinfo.ok() ? ParseCpuModelName(*cpuinfo) : "cpu";
}

int64_t TotalMemoryBytes() {
  absl::StatusOr<std::string> meminfo = ReadFile("/proc/meminfo");
  if (!meminfo.ok()) return 0;
  absl::StatusOr<int64_t> total = ParseMemTotalBytes(*meminfo);
  return total.ok() ? *total : 0;
}

}  // namespace trainerd::monitor
