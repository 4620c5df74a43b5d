#include "common/flags_from_env.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, envtest_listen, "127.0.0.1:1", "test flag");
ABSL_FLAG(int32_t, envtest_jobs, 1, "test flag");
ABSL_FLAG(absl::Duration, envtest_timeout, absl::Seconds(1), "test flag");
ABSL_FLAG(bool, envtest_preload, false, "test flag");

namespace trainerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FlagsFromEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_envtest_listen, "127.0.0.1:1");
    absl::SetFlag(&FLAGS_envtest_jobs, 1);
    absl::SetFlag(&FLAGS_envtest_timeout, absl::Seconds(1));
    absl::SetFlag(&FLAGS_envtest_preload, false);
  }
};

TEST_F(FlagsFromEnvironmentTest, EachTypeIsParsedFromItsVariable) {
  std::vector<std::string> unknown;
  ASSERT_TRUE(
      ApplyFlagsFromEnvironment("TRAINERD_",
                                {"TRAINERD_ENVTEST_LISTEN=0.0.0.0:50051", "TRAINERD_ENVTEST_JOBS=4",
                                 "TRAINERD_ENVTEST_TIMEOUT=90s", "TRAINERD_ENVTEST_PRELOAD=true",
                                 "HOME=/root", "ENVTEST_JOBS=9"},
                                {}, &unknown)
          .ok());

  EXPECT_EQ(absl::GetFlag(FLAGS_envtest_listen), "0.0.0.0:50051");
  EXPECT_EQ(absl::GetFlag(FLAGS_envtest_jobs), 4);
  EXPECT_EQ(absl::GetFlag(FLAGS_envtest_timeout), absl::Seconds(90));
  EXPECT_TRUE(absl::GetFlag(FLAGS_envtest_preload));
  EXPECT_TRUE(unknown.empty());
}

TEST_F(FlagsFromEnvironmentTest, AValueThatDoesNotParseNamesTheVariable) {
  const absl::Status status =
      ApplyFlagsFromEnvironment("TRAINERD_", {"TRAINERD_ENVTEST_JOBS=four"}, {}, nullptr);

  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("TRAINERD_ENVTEST_JOBS='four'"));
  EXPECT_THAT(status.message(), HasSubstr("--envtest_jobs"));
  EXPECT_EQ(absl::GetFlag(FLAGS_envtest_jobs), 1);
}

TEST_F(FlagsFromEnvironmentTest, UnknownNamesAreReportedAndOtherProgramsVariablesAreLeftAlone) {
  std::vector<std::string> unknown;
  ASSERT_TRUE(ApplyFlagsFromEnvironment(
                  "TRAINERD_",
                  {"TRAINERD_ENVTEST_LISTN=x", "TRAINERD_TOKEN=secret", "TRAINERD_FLAGFILE=/etc/x"},
                  {"TRAINERD_TOKEN"}, &unknown)
                  .ok());

  // Abseil's own flags are not settings: --flagfile is never read from the environment.
  EXPECT_THAT(unknown, ElementsAre("TRAINERD_ENVTEST_LISTN", "TRAINERD_FLAGFILE"));
  EXPECT_EQ(absl::GetFlag(FLAGS_envtest_listen), "127.0.0.1:1");
}

TEST_F(FlagsFromEnvironmentTest, AnEmptyValueSetsAnEmptyString) {
  absl::SetFlag(&FLAGS_envtest_listen, "set");
  ASSERT_TRUE(
      ApplyFlagsFromEnvironment("TRAINERD_", {"TRAINERD_ENVTEST_LISTEN="}, {}, nullptr).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_envtest_listen), "");
}

}  // namespace
}  // namespace trainerd
