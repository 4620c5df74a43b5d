// Tests for the sandbox report's one-line form (common/sandbox_report.h), which a checker or a
// worker sends the daemon before it reads submitted code: what it encodes comes back, and a line
// that was tampered with or garbled is refused rather than read as a confinement it is not.
#include "common/sandbox_report.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

TEST(SandboxReportTest, ItsLineComesBackAsItWas) {
  SandboxReport r;
  r.program = "trainerd-worker";
  r.landlock_abi = 7;
  r.landlock = true;
  r.seccomp = true;
  r.no_new_privileges = true;
  r.not_dumpable = true;
  r.network_namespace = false;
  r.network_error = "EPERM";
  r.uid = 65534;
  const std::string line = EncodeSandboxReport(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  absl::StatusOr<SandboxReport> back = DecodeSandboxReport(line);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->program, "trainerd-worker");
  EXPECT_EQ(back->landlock_abi, 7);
  EXPECT_TRUE(back->landlock);
  EXPECT_TRUE(back->seccomp);
  EXPECT_TRUE(back->no_new_privileges);
  EXPECT_TRUE(back->not_dumpable);
  EXPECT_FALSE(back->network_namespace);
  EXPECT_EQ(back->network_error, "EPERM");
  EXPECT_EQ(back->uid, 65534);
  EXPECT_TRUE(back->landlock_error.empty());
}

TEST(SandboxReportTest, AnEmptyLineIsAnUnconfinedProcess) {
  absl::StatusOr<SandboxReport> r = DecodeSandboxReport("");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->landlock || r->seccomp || r->no_new_privileges || r->not_dumpable);
}

TEST(SandboxReportTest, UnknownKeysAreSkippedAndBadValuesRefused) {
  EXPECT_TRUE(DecodeSandboxReport("landlock=1 future_part=1").ok());
  EXPECT_THAT(DecodeSandboxReport("landlock=yes").status().message(), HasSubstr("'landlock'"));
  EXPECT_FALSE(DecodeSandboxReport("landlock").ok());
  EXPECT_FALSE(DecodeSandboxReport("landlock_abi=-1").ok());
  EXPECT_FALSE(DecodeSandboxReport("landlock_abi=99999999999999999999").ok());
  EXPECT_FALSE(DecodeSandboxReport("uid=abc").ok());
  EXPECT_FALSE(DecodeSandboxReport("uid=4294967296").ok());
  EXPECT_FALSE(DecodeSandboxReport("landlock_error=E\x1b[2J").ok());
  EXPECT_FALSE(DecodeSandboxReport(std::string(2000, 'x')).ok());
  // A key with control characters is not echoed.
  EXPECT_THAT(DecodeSandboxReport("\x1b[2J=1 landlock=2").status().message(),
              HasSubstr("'landlock'"));
}

TEST(SandboxReportTest, ReasonsThatAreNotTokensAreNotSent) {
  SandboxReport r;
  r.landlock_error = "refused by\nsomething";
  r.program = "x y";
  absl::StatusOr<SandboxReport> back = DecodeSandboxReport(EncodeSandboxReport(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->landlock_error, "other");
  EXPECT_EQ(back->program, "other");
}

}  // namespace
}  // namespace trainerd
