// The daemon process's own CPU time and memory, and the host's CPUs and memory, from /proc.
// The parsers take file contents so that tests run them on canned text.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainerd::monitor {

struct ProcessStats {
  double cpu_seconds = 0;      // user + system, every thread, since the process started
  int64_t resident_bytes = 0;  // resident set size
};

// Open file descriptors (the entries of /proc/self/fd) and the soft RLIMIT_NOFILE; -1 when
// unknown. A resident CPU dataset holds two (its shared memory), so these are the budget that
// --max_datasets guards.
struct DescriptorStats {
  int64_t open_fds = -1;
  int64_t max_fds = -1;
};

// utime + stime of a /proc/<pid>/stat line, in seconds. The command name (field 2) may hold
// spaces and parentheses, so fields are counted from the last ')'. INVALID_ARGUMENT when the
// line is malformed.
absl::StatusOr<double> ParseProcStatCpuSeconds(absl::string_view stat, int64_t ticks_per_second);

// Resident bytes from /proc/<pid>/statm (its second field, in pages).
absl::StatusOr<int64_t> ParseProcStatmResidentBytes(absl::string_view statm, int64_t page_size);

// The first "model name" of /proc/cpuinfo; "cpu" where there is none (many ARM kernels).
std::string ParseCpuModelName(absl::string_view cpuinfo);

// MemTotal of /proc/meminfo, in bytes. INVALID_ARGUMENT when absent or malformed.
absl::StatusOr<int64_t> ParseMemTotalBytes(absl::string_view meminfo);

// This process, now. CPU seconds come from clock_gettime(CLOCK_PROCESS_CPUTIME_ID), which counts
// the same user + system time as /proc/self/stat in nanoseconds rather than 10 ms clock ticks
// (short measurement windows need the resolution); /proc/self/stat is the fallback.
// Cheap enough for every job's start and end (the sampler's windows): two small reads.
absl::StatusOr<ProcessStats> ReadProcessStats();

// This process's descriptors, now. Counting them walks /proc/self/fd, whose cost grows with every
// open descriptor (thousands on a busy daemon: datasets' shared memory, connections), so only a
// /metrics scrape asks: it was once part of ReadProcessStats and took a fifth of a busy daemon's
// CPU at every job's start and end.
DescriptorStats ReadDescriptorStats();

// Host facts, read once by the sampler.
int OnlineCpus();            // at least 1
std::string CpuModelName();  // "cpu" when unknown
int64_t TotalMemoryBytes();  // 0 when unknown

}  // namespace trainerd::monitor
