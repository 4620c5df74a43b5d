// Tests for the command line of `trainctl job model ID -o FILE` (client/cli.h): -o names the file
// for this command wherever it appears, --output keeps choosing the format, and the usage says so.
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<Invocation> Parse(std::vector<std::string> words) {
  words.insert(words.begin(), "trainctl");
  return ParseCommandLine(words, std::nullopt);
}

TEST(JobModelCliTest, DashOAfterCommandIsTheOutputFile) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "model", "job-1", "-o", "model.pt"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->command->path, "job model");
  EXPECT_THAT(invocation->args, ElementsAre("job-1"));
  EXPECT_EQ(invocation->Get("output-file"), "model.pt");
  EXPECT_EQ(invocation->global.output, OutputFormat::kTable);
}

TEST(JobModelCliTest, LongOutputFileFlagIsTheOutputFile) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"job", "model", "job-1", "--output-file=m.pt"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("output-file"), "m.pt");
}

TEST(JobModelCliTest, DashOBeforeCommandIsTheOutputFileWhenNotAFormat) {
  const absl::StatusOr<Invocation> invocation = Parse({"-o", "m.pt", "job", "model", "job-1"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("output-file"), "m.pt");
}

TEST(JobModelCliTest, LongOutputStillChoosesTheFormat) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"job", "model", "job-1", "-o", "m.pt", "--output", "json"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("output-file"), "m.pt");
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
}

TEST(JobModelCliTest, DashOWithFileBeforeOtherCommandIsUnknownFormat) {
  const absl::StatusOr<Invocation> invocation = Parse({"-o", "m.pt", "job", "get", "job-1"});
  EXPECT_EQ(invocation.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invocation.status().message(), HasSubstr("unknown output format 'm.pt'"));
}

TEST(JobModelCliTest, DashOAfterOtherCommandIsStillTheFormat) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "get", "job-1", "-o", "json"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
}

TEST(JobModelCliTest, UsageExplainsDashOAndTorchScript) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "model", "--help"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_THAT(invocation->help_text, HasSubstr("--output-file FILE"));
  EXPECT_THAT(invocation->help_text, HasSubstr("torch.jit.load"));
  EXPECT_THAT(TopLevelUsage(), HasSubstr("job model ID"));
}

}  // namespace
}  // namespace trainerd::client
