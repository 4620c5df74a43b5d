// Tests for client/cli.h: global flags, $TRAINERD_ADDR, commands and their positional arguments,
// aliases, command flags, help forms, parse errors, and the typed flag getters.
#include "client/cli.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::StartsWith;

// Parses "trainctl" followed by `words`, without $TRAINERD_ADDR unless given.
absl::StatusOr<Invocation> Parse(std::vector<std::string> words,
                                 std::optional<std::string> env_address = std::nullopt) {
  words.insert(words.begin(), "trainctl");
  return ParseCommandLine(words, std::move(env_address));
}

// The message of a parse that must fail with INVALID_ARGUMENT.
std::string ParseError(std::vector<std::string> words) {
  const absl::StatusOr<Invocation> invocation = Parse(words);
  EXPECT_EQ(invocation.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(invocation.status().message());
}

// ---- Global flags and the address ----------------------------------------------------------

TEST(ParseCommandLineTest, DefaultsWithoutFlagsOrEnvironment) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "list"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.address, "127.0.0.1:50051");
  EXPECT_EQ(invocation->global.output, OutputFormat::kTable);
  EXPECT_EQ(invocation->global.timeout, absl::Seconds(30));
  EXPECT_FALSE(invocation->show_help);
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "job list");
}

TEST(ParseCommandLineTest, EnvironmentAddressIsUsedWithoutAddrFlag) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "list"}, "10.0.0.7:6000");
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.address, "10.0.0.7:6000");
}

TEST(ParseCommandLineTest, EmptyEnvironmentAddressFallsBackToDefault) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "list"}, "");
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.address, "127.0.0.1:50051");
}

TEST(ParseCommandLineTest, AddrFlagBeforeCommandOverridesEnvironment) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"--addr", "gpu-box:7000", "job", "list"}, "10.0.0.7:6000");
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.address, "gpu-box:7000");
}

TEST(ParseCommandLineTest, AddrEqualsFormAfterCommandSetsAddress) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"dataset", "get", "iris", "--addr=unix:/run/trainerd.sock"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.address, "unix:/run/trainerd.sock");
  EXPECT_THAT(invocation->args, ElementsAre("iris"));
}

TEST(ParseCommandLineTest, EmptyAddrIsRejected) {
  EXPECT_EQ(ParseError({"--addr=", "job", "list"}), "--addr needs a HOST:PORT");
}

TEST(ParseCommandLineTest, ShortOutputFlagBeforeCommandSelectsJson) {
  const absl::StatusOr<Invocation> invocation = Parse({"-o", "json", "job", "list"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
}

TEST(ParseCommandLineTest, LongOutputEqualsFormAfterCommandSelectsJson) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "get", "job-1", "--output=json"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
  EXPECT_THAT(invocation->args, ElementsAre("job-1"));
}

TEST(ParseCommandLineTest, AttachedShortOutputValueSelectsJson) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "list", "-ojson"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
}

TEST(ParseCommandLineTest, LaterOutputFlagWins) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"-o", "json", "job", "list", "--output", "table"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.output, OutputFormat::kTable);
}

TEST(ParseCommandLineTest, UnknownOutputFormatIsRejectedByName) {
  EXPECT_EQ(ParseError({"-o", "xml", "job", "list"}),
            "unknown output format 'xml' (expected table, wide, json, yaml or name)");
  // -o is the format everywhere, job model included: a file name is no format.
  EXPECT_EQ(ParseError({"job", "model", "job-1", "-o", "model.pt"}),
            "unknown output format 'model.pt' (expected table, wide, json, yaml or name)");
}

TEST(ParseCommandLineTest, EveryOutputFormatAndNoHeadersParse) {
  const std::pair<const char*, OutputFormat> formats[] = {{"table", OutputFormat::kTable},
                                                          {"wide", OutputFormat::kWide},
                                                          {"json", OutputFormat::kJson},
                                                          {"yaml", OutputFormat::kYaml},
                                                          {"name", OutputFormat::kName}};
  for (const auto& [word, format] : formats) {
    const absl::StatusOr<Invocation> before = Parse({"-o", word, "job", "list"});
    ASSERT_TRUE(before.ok()) << before.status();
    EXPECT_EQ(before->global.output, format) << word;
    const absl::StatusOr<Invocation> after =
        Parse({"job", "list", absl::StrCat("--output=", word)});
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->global.output, format) << word;
  }
  EXPECT_THAT(OutputFormatNames(), ElementsAre("table", "wide", "json", "yaml", "name"));
  const absl::StatusOr<Invocation> bare = Parse({"job", "list"});
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE(bare->global.no_headers);
  const absl::StatusOr<Invocation> no_headers = Parse({"job", "list", "--no-headers"});
  ASSERT_TRUE(no_headers.ok()) << no_headers.status();
  EXPECT_TRUE(no_headers->global.no_headers);
  EXPECT_EQ(ParseError({"job", "list", "--no-headers=1"}), "flag --no-headers takes no value");
}

TEST(ParseCommandLineTest, JobWaitTakesForAndTheGlobalTimeout) {
  const absl::StatusOr<Invocation> wait =
      Parse({"job", "wait", "job-1", "--for", "failed", "--timeout", "10m"});
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_EQ(wait->command->path, "job wait");
  EXPECT_THAT(wait->args, ElementsAre("job-1"));
  EXPECT_EQ(wait->Get("for"), "failed");
  EXPECT_EQ(wait->global.timeout, absl::Minutes(10));
  EXPECT_TRUE(wait->global.timeout_given);
}

TEST(ParseCommandLineTest, VersionCompletionAndExitCodesHelp) {
  const absl::StatusOr<Invocation> version = Parse({"version", "--client"});
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_TRUE(version->Has("client"));
  const absl::StatusOr<Invocation> completion = Parse({"completion", "zsh"});
  ASSERT_TRUE(completion.ok()) << completion.status();
  EXPECT_THAT(completion->args, ElementsAre("zsh"));
  const absl::StatusOr<Invocation> codes = Parse({"help", "exit-codes"});
  ASSERT_TRUE(codes.ok()) << codes.status();
  EXPECT_TRUE(codes->show_help);
  EXPECT_EQ(codes->help_text, ExitCodesHelp());
  for (const char* line : {"  0  success\n", "  1  trainerd refused", "  2  bad command line",
                           "  3  the watched or awaited job FAILED",
                           "  4  the watched or awaited job was CANCELLED"}) {
    EXPECT_THAT(ExitCodesHelp(), HasSubstr(line));
  }
  EXPECT_EQ(kExitJobFailed, 3);
  EXPECT_EQ(kExitJobCancelled, 4);
}

TEST(ParseCommandLineTest, HiddenCompletionHelperIsLeftOutOfTheUsage) {
  const absl::StatusOr<Invocation> helper = Parse({"__complete", "jobs"});
  ASSERT_TRUE(helper.ok()) << helper.status();
  EXPECT_EQ(helper->command->path, "__complete");
  EXPECT_THAT(TopLevelUsage(), Not(HasSubstr("__complete")));
}

TEST(ParseCommandLineTest, TimeoutInSecondsAcceptsFractions) {
  const absl::StatusOr<Invocation> invocation = Parse({"--timeout", "2.5", "job", "list"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.timeout, absl::Milliseconds(2500));
}

TEST(ParseCommandLineTest, TimeoutAcceptsDurationAfterCommand) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "list", "--timeout=2m"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.timeout, absl::Minutes(2));
}

TEST(ParseCommandLineTest, NonNumericTimeoutIsRejectedByValue) {
  EXPECT_EQ(ParseError({"--timeout", "soon", "job", "list"}),
            "--timeout: 'soon' is not a number of seconds (or a duration like 2m)");
}

TEST(ParseCommandLineTest, ZeroTimeoutIsRejected) {
  EXPECT_EQ(ParseError({"--timeout", "0", "job", "list"}),
            "--timeout must be a positive, finite time, got '0'");
}

TEST(ParseCommandLineTest, InfiniteTimeoutIsRejected) {
  EXPECT_EQ(ParseError({"--timeout", "inf", "job", "list"}),
            "--timeout must be a positive, finite time, got 'inf'");
}

TEST(ParseCommandLineTest, GlobalFlagWithoutValueNamesTheFlag) {
  EXPECT_EQ(ParseError({"job", "list", "--addr"}), "flag --addr needs a value");
  EXPECT_EQ(ParseError({"job", "list", "-o"}), "flag -o needs a value");
}

// ---- Commands and positional arguments -----------------------------------------------------

struct ArgumentCounts {
  std::vector<std::string> words;  // the command words
  int min_args;
  int max_args;
};

void PrintTo(const ArgumentCounts& counts, std::ostream* out) {
  for (const std::string& word : counts.words) *out << word << " ";
  *out << counts.min_args << ".." << counts.max_args;
}

class PositionalArgumentsTest : public ::testing::TestWithParam<ArgumentCounts> {
 protected:
  // The command words followed by `count` arguments "a0", "a1", ...
  absl::StatusOr<Invocation> ParseWithArgs(int count) const {
    std::vector<std::string> words = GetParam().words;
    for (int i = 0; i < count; ++i) words.push_back("a" + std::to_string(i));
    return Parse(words);
  }
  std::string Path() const {
    std::string path;
    for (const std::string& word : GetParam().words) path += (path.empty() ? "" : " ") + word;
    return path;
  }
};

TEST_P(PositionalArgumentsTest, AcceptsEveryAllowedCount) {
  for (int count = GetParam().min_args; count <= GetParam().max_args; ++count) {
    const absl::StatusOr<Invocation> invocation = ParseWithArgs(count);
    ASSERT_TRUE(invocation.ok()) << count << ": " << invocation.status();
    ASSERT_NE(invocation->command, nullptr);
    EXPECT_EQ(invocation->command->path, Path());
    EXPECT_EQ(static_cast<int>(invocation->args.size()), count);
  }
}

TEST_P(PositionalArgumentsTest, RejectsOneArgumentTooManyNamingIt) {
  const absl::StatusOr<Invocation> invocation = ParseWithArgs(GetParam().max_args + 1);
  ASSERT_EQ(invocation.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invocation.status().message()),
              StartsWith("unexpected argument 'a" + std::to_string(GetParam().max_args) +
                         "' for '" + Path() + "'"));
  EXPECT_THAT(std::string(invocation.status().message()),
              HasSubstr("(see 'trainctl " + Path() + " --help')"));
}

// The commands with required arguments.
class RequiredArgumentsTest : public PositionalArgumentsTest {};

TEST_P(RequiredArgumentsTest, RejectsOneArgumentTooFewSayingWhatIsNeeded) {
  const absl::StatusOr<Invocation> invocation = ParseWithArgs(GetParam().min_args - 1);
  ASSERT_EQ(invocation.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invocation.status().message()), StartsWith("'" + Path() + "' needs "));
}

INSTANTIATE_TEST_SUITE_P(
    EveryCommand, PositionalArgumentsTest,
    ::testing::Values(ArgumentCounts{{"dataset", "upload"}, 2, 2},
                      ArgumentCounts{{"dataset", "list"}, 0, 0},
                      ArgumentCounts{{"dataset", "get"}, 1, 1},
                      ArgumentCounts{{"dataset", "rm"}, 1, 1}, ArgumentCounts{{"submit"}, 0, 0},
                      ArgumentCounts{{"job", "list"}, 0, 0}, ArgumentCounts{{"job", "get"}, 1, 1},
                      ArgumentCounts{{"job", "watch"}, 1, 1}, ArgumentCounts{{"job", "wait"}, 1, 1},
                      ArgumentCounts{{"version"}, 0, 0}, ArgumentCounts{{"completion"}, 1, 1},
                      ArgumentCounts{{"job", "cancel"}, 1, 1}, ArgumentCounts{{"health"}, 0, 1},
                      ArgumentCounts{{"devices"}, 0, 0}, ArgumentCounts{{"top"}, 0, 0},
                      ArgumentCounts{{"diagnose"}, 0, 0}));

INSTANTIATE_TEST_SUITE_P(CommandsWithArguments, RequiredArgumentsTest,
                         ::testing::Values(ArgumentCounts{{"dataset", "upload"}, 2, 2},
                                           ArgumentCounts{{"dataset", "get"}, 1, 1},
                                           ArgumentCounts{{"dataset", "rm"}, 1, 1},
                                           ArgumentCounts{{"job", "get"}, 1, 1},
                                           ArgumentCounts{{"job", "watch"}, 1, 1},
                                           ArgumentCounts{{"job", "cancel"}, 1, 1},
                                           ArgumentCounts{{"job", "rm"}, 1, 1}));

TEST(ParseCommandLineTest, DatasetUploadWithoutFileSaysNameAndFileAreNeeded) {
  EXPECT_EQ(ParseError({"dataset", "upload", "iris"}),
            "'dataset upload' needs NAME FILE (see 'trainctl dataset upload --help')");
}

TEST(ParseCommandLineTest, CommandTableHasEveryCommandOnce) {
  std::vector<std::string> paths;
  for (const CommandSpec& command : Commands()) paths.emplace_back(command.path);
  EXPECT_THAT(
      paths,
      ElementsAre("dataset upload", "dataset list", "dataset get", "dataset rm", "dataset share",
                  "dataset unshare", "submit", "sweep",
                  "job list", "job get", "job watch", "job wait", "job cancel", "job rm",
                  "job model", "job checkpoint", "devices", "config get-contexts",
                  "config current-context",
                  "config use-context", "config set-context", "config delete-context", "top",
                  "diagnose", "health", "version", "completion", "__complete", "help"));
}

TEST(ParseCommandLineTest, DatasetLsIsAnAliasOfDatasetList) {
  const absl::StatusOr<Invocation> invocation = Parse({"dataset", "ls"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "dataset list");
}

TEST(ParseCommandLineTest, JobLsIsAnAliasOfJobList) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "ls"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "job list");
}

TEST(ParseCommandLineTest, DatasetDeleteIsAnAliasOfDatasetRm) {
  const absl::StatusOr<Invocation> invocation = Parse({"dataset", "delete", "iris"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "dataset rm");
  EXPECT_THAT(invocation->args, ElementsAre("iris"));
}

TEST(ParseCommandLineTest, AliasAloneIsNotACommand) {
  EXPECT_EQ(ParseError({"ls"}), "unknown command 'ls' (see 'trainctl --help')");
}

TEST(ParseCommandLineTest, UnknownCommandIsNamed) {
  EXPECT_EQ(ParseError({"frobnicate"}), "unknown command 'frobnicate' (see 'trainctl --help')");
}

TEST(ParseCommandLineTest, UnknownSubcommandIsNamedWithItsGroup) {
  EXPECT_EQ(ParseError({"dataset", "frob", "x"}),
            "unknown command 'dataset frob' (see 'trainctl dataset --help')");
}

TEST(ParseCommandLineTest, GroupWithoutSubcommandIsRejected) {
  EXPECT_EQ(ParseError({"job"}), "'job' needs a subcommand (see 'trainctl job --help')");
}

TEST(ParseCommandLineTest, NoCommandIsRejected) {
  EXPECT_EQ(ParseError({"--addr", "host:1"}), "no command given (see 'trainctl --help')");
}

TEST(ParseCommandLineTest, DoubleDashMakesLaterDashWordsArguments) {
  const absl::StatusOr<Invocation> invocation = Parse({"dataset", "get", "--", "-odd-name"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_THAT(invocation->args, ElementsAre("-odd-name"));
  EXPECT_EQ(invocation->global.output, OutputFormat::kTable);
}

// ---- Command flags -------------------------------------------------------------------------

TEST(ParseCommandLineTest, CommandFlagsTakeSpacedAndEqualsValues) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"submit", "--dataset", "iris", "--model=linear:3", "--lr=0.5", "--no-shuffle"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_THAT(invocation->flags, ElementsAre(Pair("dataset", "iris"), Pair("lr", "0.5"),
                                             Pair("model", "linear:3"), Pair("no-shuffle", "")));
  EXPECT_TRUE(invocation->Has("no-shuffle"));
  EXPECT_FALSE(invocation->Has("watch"));
  EXPECT_EQ(invocation->Get("epochs", "10"), "10");
}

TEST(ParseCommandLineTest, SubmitTakesTheOptimizerScheduleAndClippingFlags) {
  const absl::StatusOr<Invocation> invocation = Parse(
      {"submit", "--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--schedule=step",
       "--step-epochs", "3", "--gamma", "0.5", "--warmup-epochs", "1", "--clip-grad-norm", "2"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("nesterov", "unset"), "");
  EXPECT_EQ(invocation->Get("schedule"), "step");
  EXPECT_EQ(invocation->Get("step-epochs"), "3");
  EXPECT_EQ(invocation->Get("gamma"), "0.5");
  EXPECT_EQ(invocation->Get("warmup-epochs"), "1");
  EXPECT_EQ(invocation->Get("clip-grad-norm"), "2");
}

TEST(ParseCommandLineTest, SubmitUsageListsTheNewFlags) {
  const absl::StatusOr<Invocation> invocation = Parse({"help", "submit"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  for (const char* flag :
       {"--huber-delta D", "--label-smoothing S", "--nesterov ", "--weight-decay W", "--beta1 B",
        "--beta2 B", "--eps E", "--alpha A", "--schedule KIND", "--step-epochs N", "--gamma G",
        "--min-lr RATE", "--warmup-epochs N", "--clip-grad-norm N", "--schedule-per-step",
        "--warmup-steps N", "--milestones N,N,...", "--t0 N", "--t-mult N", "--pct-start F",
        "--anneal-strategy S", "--div-factor D", "--final-div-factor D", "--three-phase",
        "--plateau-factor F", "--plateau-patience N", "--plateau-threshold T",
        "--plateau-cooldown N"}) {
    EXPECT_THAT(invocation->help_text, HasSubstr(absl::StrCat("\n  ", flag))) << flag;
  }
  for (const char* flag :
       {"--amsgrad ", "--centered ", "--momentum-decay D", "--decoupled-weight-decay",
        "--lr-decay D", "--initial-accumulator-value V", "--weight-decay-exclude-bias-and-norm"}) {
    EXPECT_THAT(invocation->help_text, HasSubstr(absl::StrCat("\n  ", flag))) << flag;
  }
}

TEST(ParseCommandLineTest, SubmitTakesTheValidationFlags) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"submit", "--validation-fraction", "0.2", "--validation-dataset=iris-test",
             "--early-stop-patience", "5"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("validation-fraction"), "0.2");
  EXPECT_EQ(invocation->Get("validation-dataset"), "iris-test");
  EXPECT_EQ(invocation->Get("early-stop-patience"), "5");
}

TEST(ParseCommandLineTest, SubmitUsageListsTheValidationFlags) {
  const absl::StatusOr<Invocation> invocation = Parse({"help", "submit"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  for (const char* flag :
       {"--validation-fraction F", "--validation-dataset NAME", "--early-stop-patience N"}) {
    EXPECT_THAT(invocation->help_text, HasSubstr(absl::StrCat("\n  ", flag))) << flag;
  }
}

TEST(ParseCommandLineTest, SubmitTakesCheckpointEveryAndListsItInUsage) {
  const absl::StatusOr<Invocation> invocation = Parse({"submit", "--checkpoint-every", "3"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("checkpoint-every"), "3");
  const absl::StatusOr<Invocation> help = Parse({"help", "submit"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_THAT(help->help_text, HasSubstr("\n  --checkpoint-every N"));
}

TEST(ParseCommandLineTest, DashedWordAfterValueFlagIsItsValue) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"submit", "--momentum", "-0.5", "--dataset", "iris"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("momentum"), "-0.5");
  EXPECT_EQ(invocation->Get("dataset"), "iris");
}

TEST(ParseCommandLineTest, GlobalFlagsMixWithCommandFlags) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"submit", "--dataset", "iris", "-o", "json", "--model", "linear:3", "--addr", "h:1"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->Get("dataset"), "iris");
  EXPECT_EQ(invocation->Get("model"), "linear:3");
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
  EXPECT_EQ(invocation->global.address, "h:1");
}

TEST(ParseCommandLineTest, UnknownFlagAfterCommandNamesFlagAndCommand) {
  EXPECT_EQ(ParseError({"submit", "--dataset", "iris", "--learning-rate", "0.1"}),
            "unknown flag '--learning-rate' for 'submit' (see 'trainctl submit --help')");
}

TEST(ParseCommandLineTest, UnknownShortFlagIsNamedAsWritten) {
  EXPECT_EQ(ParseError({"job", "list", "-x"}),
            "unknown flag '-x' for 'job list' (see 'trainctl job list --help')");
}

TEST(ParseCommandLineTest, CommandFlagBeforeCommandIsUnknown) {
  EXPECT_EQ(ParseError({"--dataset", "iris", "submit"}),
            "unknown flag '--dataset' (see 'trainctl --help')");
}

TEST(ParseCommandLineTest, FlagOfAnotherCommandIsUnknown) {
  EXPECT_THAT(ParseError({"job", "list", "--epochs", "3"}),
              StartsWith("unknown flag '--epochs' for 'job list'"));
}

TEST(ParseCommandLineTest, CommandFlagWithoutValueNamesTheFlag) {
  EXPECT_EQ(ParseError({"submit", "--model", "linear:1", "--dataset"}),
            "flag --dataset needs a value");
}

TEST(ParseCommandLineTest, BooleanFlagWithValueIsRejected) {
  EXPECT_EQ(ParseError({"submit", "--no-shuffle=yes"}), "flag --no-shuffle takes no value");
}

// ---- Help ----------------------------------------------------------------------------------

TEST(ParseCommandLineTest, SecurityFlagsAreGlobalBeforeOrAfterTheCommand) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"--token-file", "/t", "dataset", "list", "--tls-ca=/ca.crt", "--tls-cert", "/c.crt",
             "--tls-key", "/c.key", "--tls-server-name", "gpu-node-1"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->global.token_file, "/t");
  EXPECT_EQ(invocation->global.tls_ca, "/ca.crt");
  EXPECT_EQ(invocation->global.tls_cert, "/c.crt");
  EXPECT_EQ(invocation->global.tls_key, "/c.key");
  EXPECT_EQ(invocation->global.tls_server_name, "gpu-node-1");
  EXPECT_EQ(Parse({"dataset", "list", "--token-file"}).status().message(),
            "flag --token-file needs a value");
  EXPECT_EQ(Parse({"dataset", "list", "--tls-ca="}).status().message(), "--tls-ca needs a value");
  // Their values are not taken for command words by "--help".
  const absl::StatusOr<Invocation> help = Parse({"--token-file", "dataset", "--help", "submit"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(help->command->path, "submit");
}

TEST(ParseCommandLineTest, HelpFlagAloneShowsTopLevelUsage) {
  const absl::StatusOr<Invocation> invocation = Parse({"--help"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->show_help);
  EXPECT_EQ(invocation->command, nullptr);
  EXPECT_EQ(invocation->help_text, TopLevelUsage());
  EXPECT_THAT(invocation->help_text,
              StartsWith("Usage: trainctl [--addr HOST:PORT|unix:PATH | --context NAME]\n"
                         "                [-o table|wide|json|yaml|name] [--no-headers]\n"
                         "                [--timeout SECONDS] [--token-file FILE] "
                         "[--tls-ca FILE]\n                [--tls-cert FILE --tls-key FILE]\n"
                         "                COMMAND [ARGS...]\n"));
}

TEST(ParseCommandLineTest, ShortHelpFlagShowsTopLevelUsage) {
  const absl::StatusOr<Invocation> invocation = Parse({"-h"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->show_help);
  EXPECT_EQ(invocation->help_text, TopLevelUsage());
}

TEST(ParseCommandLineTest, HelpCommandAloneShowsTopLevelUsage) {
  const absl::StatusOr<Invocation> invocation = Parse({"help"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->show_help);
  EXPECT_EQ(invocation->help_text, TopLevelUsage());
}

TEST(ParseCommandLineTest, HelpCommandShowsCommandUsage) {
  const absl::StatusOr<Invocation> invocation = Parse({"help", "submit"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->show_help);
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "submit");
  EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl submit [FLAGS]\n"));
  EXPECT_THAT(invocation->help_text, HasSubstr("\n  --batch-size N"));
  EXPECT_THAT(invocation->help_text, HasSubstr("\n  --no-shuffle  "));
}

TEST(ParseCommandLineTest, CommandHelpFlagShowsCommandUsageWithoutItsArguments) {
  const absl::StatusOr<Invocation> invocation = Parse({"dataset", "upload", "--help"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->show_help);
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "dataset upload");
  EXPECT_THAT(invocation->help_text,
              StartsWith("Usage: trainctl dataset upload NAME FILE [FLAGS]\n"));
  EXPECT_THAT(invocation->help_text, HasSubstr("--target-dtype TYPE"));
}

TEST(ParseCommandLineTest, HelpFlagWinsOverLaterUnknownFlags) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "get", "-h", "--bogus"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl job get ID\n"));
}

TEST(ParseCommandLineTest, HelpForAliasShowsAliasedCommand) {
  const absl::StatusOr<Invocation> invocation = Parse({"help", "dataset", "delete"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  ASSERT_NE(invocation->command, nullptr);
  EXPECT_EQ(invocation->command->path, "dataset rm");
  EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl dataset rm NAME\n"));
  EXPECT_THAT(invocation->help_text, HasSubstr("\nAlias: trainctl dataset delete\n"));
}

TEST(ParseCommandLineTest, GroupHelpFlagListsTheGroupsCommands) {
  const absl::StatusOr<Invocation> invocation = Parse({"job", "--help"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->show_help);
  EXPECT_EQ(invocation->command, nullptr);
  EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl job SUBCOMMAND [ARGS...]"));
  EXPECT_THAT(invocation->help_text, HasSubstr("\n  job watch ID"));
  EXPECT_THAT(invocation->help_text, HasSubstr("\n  job cancel ID"));
  EXPECT_THAT(invocation->help_text, Not(HasSubstr("dataset upload")));
}

TEST(ParseCommandLineTest, HelpCommandForGroupListsTheGroupsCommands) {
  const absl::StatusOr<Invocation> invocation = Parse({"help", "dataset"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl dataset SUBCOMMAND"));
  EXPECT_THAT(invocation->help_text, HasSubstr("\n  dataset upload NAME FILE"));
  EXPECT_THAT(invocation->help_text, Not(HasSubstr("job watch")));
}

TEST(ParseCommandLineTest, HelpForUnknownCommandIsRejected) {
  EXPECT_EQ(ParseError({"help", "frob"}), "unknown command 'frob' (see 'trainctl --help')");
}

// "trainctl --help submit" is "trainctl submit --help", whatever global flags come between.
TEST(ParseCommandLineTest, HelpFlagBeforeCommandShowsCommandUsage) {
  const absl::StatusOr<Invocation> after = Parse({"submit", "--help"});
  ASSERT_TRUE(after.ok()) << after.status();
  for (const std::vector<std::string>& words : std::vector<std::vector<std::string>>{
           {"--help", "submit"},
           {"-h", "submit"},
           {"--help", "--addr", "host:1", "-o", "json", "--timeout", "5", "submit"},
           {"--help", "--", "submit"}}) {
    const absl::StatusOr<Invocation> before = Parse(words);
    ASSERT_TRUE(before.ok()) << before.status();
    EXPECT_TRUE(before->show_help);
    ASSERT_NE(before->command, nullptr);
    EXPECT_EQ(before->command->path, "submit");
    EXPECT_EQ(before->help_text, after->help_text);
  }
}

TEST(ParseCommandLineTest, HelpFlagBeforeTwoWordCommandShowsItsUsage) {
  for (const std::vector<std::string>& words :
       std::vector<std::vector<std::string>>{{"--help", "job", "get"}, {"job", "--help", "get"}}) {
    const absl::StatusOr<Invocation> invocation = Parse(words);
    ASSERT_TRUE(invocation.ok()) << invocation.status();
    EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl job get ID\n"));
  }
}

TEST(ParseCommandLineTest, HelpFlagBeforeGroupListsTheGroupsCommands) {
  const absl::StatusOr<Invocation> invocation = Parse({"--help", "dataset"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->command, nullptr);
  EXPECT_THAT(invocation->help_text, StartsWith("Usage: trainctl dataset SUBCOMMAND"));
}

TEST(ParseCommandLineTest, HelpFlagBeforeUnknownCommandIsRejected) {
  EXPECT_EQ(ParseError({"--help", "frob"}), "unknown command 'frob' (see 'trainctl --help')");
  EXPECT_EQ(ParseError({"--help", "job", "frob"}),
            "unknown command 'job frob' (see 'trainctl job --help')");
}

// ---- devices, top, diagnose ------------------------------------------------------------------

TEST(ParseCommandLineTest, DiagnoseTakesRefresh) {
  const absl::StatusOr<Invocation> invocation = Parse({"diagnose", "--refresh"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->command->path, "diagnose");
  EXPECT_TRUE(invocation->Has("refresh"));
  EXPECT_FALSE(invocation->global.timeout_given);
  EXPECT_EQ(ParseError({"diagnose", "--refresh=yes"}), "flag --refresh takes no value");
}

TEST(ParseCommandLineTest, TimeoutGivenIsRecordedForDiagnosesLongerDefault) {
  const absl::StatusOr<Invocation> invocation = Parse({"diagnose", "--timeout", "300"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_TRUE(invocation->global.timeout_given);
  EXPECT_EQ(invocation->global.timeout, absl::Seconds(300));
}

TEST(ParseCommandLineTest, TopTakesIntervalAndIterations) {
  const absl::StatusOr<Invocation> invocation =
      Parse({"top", "--interval", "0.5", "--iterations=3"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->command->path, "top");
  EXPECT_THAT(invocation->flags, ElementsAre(Pair("interval", "0.5"), Pair("iterations", "3")));
  EXPECT_EQ(*invocation->GetDouble("interval", 2), 0.5);
  EXPECT_EQ(*invocation->GetInt("iterations", 0, 1, 100), 3);
}

TEST(ParseCommandLineTest, DevicesTakesNoFlags) {
  const absl::StatusOr<Invocation> invocation = Parse({"-o", "json", "devices"});
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  EXPECT_EQ(invocation->command->path, "devices");
  EXPECT_EQ(invocation->global.output, OutputFormat::kJson);
  EXPECT_EQ(ParseError({"devices", "--refresh"}),
            "unknown flag '--refresh' for 'devices' (see 'trainctl devices --help')");
}

TEST(ParseCommandLineTest, HelpCommandShowsTheNewCommands) {
  const absl::StatusOr<Invocation> diagnose = Parse({"help", "diagnose"});
  ASSERT_TRUE(diagnose.ok()) << diagnose.status();
  EXPECT_THAT(diagnose->help_text, StartsWith("Usage: trainctl diagnose [FLAGS]\n"));
  EXPECT_THAT(diagnose->help_text, HasSubstr("\n  --refresh  "));
  EXPECT_THAT(diagnose->help_text, HasSubstr("120 s unless --timeout"));
  const absl::StatusOr<Invocation> top = Parse({"top", "--help"});
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_THAT(top->help_text, HasSubstr("\n  --interval SECONDS  "));
  EXPECT_THAT(top->help_text, HasSubstr("\n  --iterations N  "));
  const absl::StatusOr<Invocation> devices = Parse({"help", "devices"});
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(devices->help_text, StartsWith("Usage: trainctl devices [FLAGS]\n"));
}

TEST(UsageTest, TopLevelUsageListsEveryCommandSummary) {
  const std::string usage = TopLevelUsage();
  for (const CommandSpec& command : Commands()) {
    if (command.hidden) continue;
    EXPECT_THAT(usage, HasSubstr(std::string(command.summary))) << command.path;
  }
  EXPECT_THAT(usage, HasSubstr("submit --dataset NAME --model SPEC"));
  EXPECT_THAT(usage, HasSubstr("127.0.0.1:50051"));
}

TEST(ParseCommandLineTest, ContextAndWhereTheAddressCameFromAreRecorded) {
  absl::StatusOr<Invocation> named =
      ParseCommandLine({"trainctl", "--context", "gpu2", "devices"}, std::string("env:1"));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->global.context, "gpu2");
  EXPECT_TRUE(named->global.address_from_env);
  EXPECT_FALSE(named->global.address_given);

  absl::StatusOr<Invocation> flagged =
      ParseCommandLine({"trainctl", "config", "set-context", "a", "--addr", "h:1"}, std::nullopt);
  ASSERT_TRUE(flagged.ok()) << flagged.status();
  EXPECT_EQ(flagged->command->path, "config set-context");
  EXPECT_THAT(flagged->args, ElementsAre("a"));
  EXPECT_TRUE(flagged->global.address_given);
  EXPECT_EQ(flagged->global.address, "h:1");

  EXPECT_FALSE(ParseCommandLine({"trainctl", "--context=", "devices"}, std::nullopt).ok());
  absl::StatusOr<Invocation> all =
      ParseCommandLine({"trainctl", "devices", "--all-contexts"}, std::nullopt);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->Has("all-contexts"));
}

TEST(UsageTest, CommandUsageEndsWithGlobalFlagsLine) {
  for (const CommandSpec& command : Commands()) {
    const std::string usage = CommandUsage(command);
    EXPECT_THAT(usage, StartsWith("Usage: trainctl " + std::string(command.path))) << command.path;
    EXPECT_THAT(usage,
                ::testing::EndsWith(
                    "Global flags: --addr HOST:PORT, --context NAME, -o table|wide|json|yaml|name, "
                    "--no-headers,\n--timeout SECONDS, --token-file FILE, --tls-ca FILE, "
                    "--tls-cert FILE, --tls-key FILE,\n--tls-server-name NAME (see 'trainctl "
                    "--help').\n"));
  }
}

TEST(UsageTest, UsageLinesHaveNoTrailingSpaces) {
  std::vector<std::string> texts = {TopLevelUsage()};
  for (const CommandSpec& command : Commands()) texts.push_back(CommandUsage(command));
  for (const std::string& text : texts) {
    EXPECT_THAT(text, Not(HasSubstr(" \n"))) << text;
  }
}

// ---- Typed flag values ---------------------------------------------------------------------

Invocation WithFlag(const std::string& name, const std::string& value) {
  Invocation invocation;
  invocation.flags[name] = value;
  return invocation;
}

TEST(GetIntTest, AbsentFlagGivesFallback) {
  const absl::StatusOr<int64_t> value = Invocation().GetInt("epochs", 10, 1, 100);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 10);
}

TEST(GetIntTest, ValueWithinRangeIsReturned) {
  const absl::StatusOr<int64_t> value = WithFlag("epochs", "100").GetInt("epochs", 10, 1, 100);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 100);
}

TEST(GetIntTest, ValueBelowMinimumNamesFlagAndBound) {
  const absl::StatusOr<int64_t> value = WithFlag("epochs", "0").GetInt("epochs", 10, 1, 100);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(value.status().message(), "--epochs must be at least 1, got 0");
}

TEST(GetIntTest, ValueAboveMaximumNamesFlagAndBound) {
  const absl::StatusOr<int64_t> value = WithFlag("epochs", "101").GetInt("epochs", 10, 1, 100);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(value.status().message(), "--epochs must be at most 100, got 101");
}

TEST(GetIntTest, NonIntegerNamesFlagAndValue) {
  const absl::StatusOr<int64_t> value =
      WithFlag("batch-size", "3.5").GetInt("batch-size", 32, 1, 1000);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(value.status().message(), "--batch-size: '3.5' is not a whole number");
}

TEST(GetIntTest, ValueBeyondInt64IsNotAWholeNumber) {
  const absl::StatusOr<int64_t> value =
      WithFlag("epochs", "9223372036854775808")
          .GetInt("epochs", 10, 1, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(value.status().message()), StartsWith("--epochs: '9223372036854775808'"));
}

TEST(GetUintTest, AbsentFlagGivesFallback) {
  const absl::StatusOr<uint64_t> value = Invocation().GetUint("seed", 7);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 7u);
}

TEST(GetUintTest, LargestUint64IsAccepted) {
  const absl::StatusOr<uint64_t> value =
      WithFlag("seed", "18446744073709551615").GetUint("seed", 0);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::numeric_limits<uint64_t>::max());
}

TEST(GetUintTest, NegativeValueIsRejectedWithRange) {
  const absl::StatusOr<uint64_t> value = WithFlag("seed", "-1").GetUint("seed", 0);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(value.status().message(),
            "--seed: '-1' is not a whole number between 0 and 18446744073709551615");
}

TEST(GetUintTest, ValueBeyondUint64IsRejected) {
  const absl::StatusOr<uint64_t> value =
      WithFlag("seed", "18446744073709551616").GetUint("seed", 0);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(value.status().message()),
              StartsWith("--seed: '18446744073709551616' is not"));
}

TEST(GetDoubleTest, AbsentFlagGivesFallback) {
  const absl::StatusOr<double> value = Invocation().GetDouble("lr", 0.01);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 0.01);
}

TEST(GetDoubleTest, ExponentNotationIsParsed) {
  const absl::StatusOr<double> value = WithFlag("lr", "1e-3").GetDouble("lr", 0.01);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_DOUBLE_EQ(*value, 0.001);
}

TEST(GetDoubleTest, TextIsRejectedNamingFlagAndValue) {
  const absl::StatusOr<double> value = WithFlag("lr", "fast").GetDouble("lr", 0.01);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(value.status().message(), "--lr: 'fast' is not a number");
}

TEST(GetDoubleTest, NonFiniteValuesAreRejected) {
  for (const char* text : {"nan", "inf", "-inf", "1e999"}) {
    const absl::StatusOr<double> value = WithFlag("momentum", text).GetDouble("momentum", 0);
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(value.status().message(), std::string("--momentum: '") + text + "' is not a number");
  }
}

}  // namespace
}  // namespace trainerd::client
