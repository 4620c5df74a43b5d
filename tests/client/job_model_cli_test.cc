// Tests for the command line of `trainctl job model ID [-f FILE]` (client/cli.h): --file/-f names
// the file, -o is the output format as for every other command (never a file named json), and the
// usage says so.
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

TEST(JobModelCliTest, DashFIsTheFile) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "model", "job-1", "-f", "model.pt"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->command->path, "job model");
  EXPECT_THAT(invocation->args, ElementsAre("job-1"));
  EXPECT_EQ(invocation->Get("file"), "model.pt");
  EXPECT_EQ(invocation->global.output, OutputFormat::kTable);
}

TEST(JobModelCliTest, LongAndAttachedFormsOfTheFileFlag) {
  for (const std::vector<std::string>& words :
       {std::vector<std::string>{"job", "model", "job-1", "--file=m.pt"},
        std::vector<std::string>{"job", "model", "job-1", "--file", "m.pt"},
        std::vector<std::string>{"job", "model", "-fm.pt", "job-1"},
        std::vector<std::string>{"job", "model", "job-1", "-f=m.pt"}}) {
    const absl::StatusOr<Invocation> invocation = Parse(words);
    ASSERT_TRUE(invocation.ok()) << invocation.status();
    EXPECT_EQ(invocation->Get("file"), "m.pt");
    EXPECT_THAT(invocation->args, ElementsAre("job-1"));
  }
}

TEST(JobModelCliTest, DashOIsTheFormatNeverAFileName) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"job", "model", "job-1", "-o", "json", "-f", "m.pt"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("file"), "m.pt");
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
  const absl::StatusOr<Invocation> no_file = Parse({"job", "model", "job-1", "-o", "json"});
  ASSERT_TRUE(no_file.ok()) << no_file.status();
  EXPECT_FALSE(no_file->Has("file"));  // the command refuses it: JSON describes a --file
}

TEST(JobModelCliTest, FormatIsTheModelsFormatBesideDashO) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"job", "model", "job-1", "--format", "safetensors", "-o", "json", "-f", "m.st"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("format"), "safetensors");
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
  EXPECT_THAT(CommandUsage(*invocation->command), HasSubstr("--format FORMAT"));
  EXPECT_THAT(CommandUsage(*invocation->command), HasSubstr("nn.Sequential"));
}

TEST(JobModelCliTest, DashFIsNotAFlagOfOtherCommands) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "get", "job-1", "-f", "x"});
  EXPECT_EQ(invocation.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invocation.status().message(), HasSubstr("unknown flag '-f' for 'job get'"));
}

TEST(JobModelCliTest, UsageShowsTheFileFlagStdoutAndTorchScript) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "model", "--help"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_THAT(invocation->help_text, HasSubstr("  -f, --file FILE "));
  EXPECT_THAT(invocation->help_text, HasSubstr("standard output"));
  EXPECT_THAT(invocation->help_text, HasSubstr("torch.jit.load"));
  EXPECT_THAT(TopLevelUsage(), HasSubstr("job model ID"));
}

}  // namespace
}  // namespace trainerd::client
