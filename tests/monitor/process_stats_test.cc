#include "server/monitor/process_stats.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::monitor {
namespace {

// Fields 14 (utime) and 15 (stime) are 250 and 150 ticks.
constexpr char kStat[] =
    "4242 (trainerd) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 150 0 0 20 0 9 0 123 "
    "1000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";

TEST(ProcessStatsTest, ParsesCpuSecondsFromStat) {
  absl::StatusOr<double> seconds = ParseProcStatCpuSeconds(kStat, /*ticks_per_second=*/100);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_DOUBLE_EQ(*seconds, 4.0);
}

TEST(ProcessStatsTest, CountsStatFieldsFromTheLastParenthesis) {
  // A command name may hold spaces and parentheses, even ") S 1 2 3".
  constexpr char kOddName[] =
      "77 (a (b) ) S 1 2 3 (x) S 1 77 77 0 -1 0 0 0 0 0 30 20 0 0 20 0 1 0 5 100 10\n";
  absl::StatusOr<double> seconds = ParseProcStatCpuSeconds(kOddName, /*ticks_per_second=*/10);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_DOUBLE_EQ(*seconds, 5.0);
}

TEST(ProcessStatsTest, RejectsMalformedStat) {
  EXPECT_FALSE(ParseProcStatCpuSeconds("", 100).ok());
  EXPECT_FALSE(ParseProcStatCpuSeconds("1 (x) S 1 2", 100).ok());
  EXPECT_FALSE(ParseProcStatCpuSeconds("1 x S 1 2 3 4 5 6 7 8 9 10 11 12 13", 100).ok());
  EXPECT_FALSE(ParseProcStatCpuSeconds(kStat, 0).ok());
}

TEST(ProcessStatsTest, ParsesResidentBytesFromStatm) {
  absl::StatusOr<int64_t> bytes = ParseProcStatmResidentBytes("10000 2500 300 1 0 4000 0\n", 4096);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 2500 * 4096);
  EXPECT_FALSE(ParseProcStatmResidentBytes("10000", 4096).ok());
  EXPECT_FALSE(ParseProcStatmResidentBytes("10000 x", 4096).ok());
}

TEST(ProcessStatsTest, ParsesCpuModelNameWithFallback) {
  EXPECT_EQ(ParseCpuModelName("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                              "model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t: fpu\n\n"
                              "processor\t: 1\nmodel name\t: Other\n"),
            "Intel(R) Xeon(R) CPU @ 2.20GHz");
  EXPECT_EQ(ParseCpuModelName("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n"),
            "cpu");
  EXPECT_EQ(ParseCpuModelName(""), "cpu");
}

TEST(ProcessStatsTest, ParsesMemTotal) {
  absl::StatusOr<int64_t> total =
      ParseMemTotalBytes("MemTotal:       16303268 kB\nMemFree:         1234 kB\n");
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(*total, int64_t{16303268} * 1024);
  EXPECT_FALSE(ParseMemTotalBytes("MemFree: 1 kB\n").ok());
  EXPECT_FALSE(ParseMemTotalBytes("MemTotal: lots kB\n").ok());
}

TEST(ProcessStatsTest, ReadsThisProcess) {
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->resident_bytes, 0);
  EXPECT_GE(stats->cpu_seconds, 0.0);
  EXPECT_GE(OnlineCpus(), 1);
  EXPECT_FALSE(CpuModelName().empty());
  EXPECT_GT(TotalMemoryBytes(), 0);
}

// Descriptors: counted exactly (three more open, three more counted) against the soft limit.
TEST(ProcessStatsTest, CountsOpenDescriptorsAgainstTheLimit) {
  const DescriptorStats before = ReadDescriptorStats();
  EXPECT_GE(before.open_fds, 3);  // stdin, stdout, stderr at least
  struct rlimit limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(before.max_fds, static_cast<int64_t>(limit.rlim_cur));
  int fds[3];
  for (int& fd : fds) fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const DescriptorStats after = ReadDescriptorStats();
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(after.open_fds, before.open_fds + 3);
}

}  // namespace
}  // namespace trainerd::monitor
