// `trainctl sweep --points FILE`: the points file's parser and the request it makes, without a
// daemon (the e2e test sends one to a real daemon).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/requests.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A points file in the test's folder, removed at the end.
class SweepPointsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& path : written_) std::filesystem::remove(path);
  }

  std::string Write(const std::string& text) {
    const std::string path =
        absl::StrCat(::testing::TempDir(), "sweep_points_", getpid(), "_", written_.size(), ".csv");
    std::ofstream(path) << text;
    written_.push_back(path);
    return path;
  }

  // `sweep --dataset iris --model linear:3 --points <file of text>` followed by `more`.
  absl::StatusOr<v1::SubmitSweepRequest> Request(const std::string& text,
                                                 std::vector<std::string> more = {}) {
    std::vector<std::string> words = {"trainctl", "sweep",    "--dataset", "iris",
                                      "--model",  "linear:3", "--points",  Write(text)};
    words.insert(words.end(), more.begin(), more.end());
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    if (!invocation.ok()) return invocation.status();
    return SweepRequestFromFlags(*invocation);
  }

  std::string Error(const std::string& text, std::vector<std::string> more = {}) {
    const absl::StatusOr<v1::SubmitSweepRequest> request = Request(text, std::move(more));
    EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument) << request.status();
    return std::string(request.status().message());
  }

 private:
  std::vector<std::string> written_;
};

std::optional<double> Lr(const v1::SweepPoint& p) {
  return p.has_learning_rate() ? std::optional<double>(p.learning_rate()) : std::nullopt;
}
std::optional<uint64_t> Seed(const v1::SweepPoint& p) {
  return p.has_seed() ? std::optional<uint64_t>(p.seed()) : std::nullopt;
}

TEST(ParseSweepPointsTest, HeaderNamesTheColumnsInAnyOrderAndEmptyCellsKeepTheSpec) {
  const absl::StatusOr<std::vector<SweepPointRow>> rows = ParseSweepPoints(
      "# a random search\r\nSeed, learning_rate ,weight_decay\r\n\r\n7,0.1,\r\n"
      "8,,0.001\r\n18446744073709551615,3e-4,0\r\n");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].line, 4);
  EXPECT_EQ(Seed((*rows)[0].point), 7u);
  EXPECT_EQ(Lr((*rows)[0].point), 0.1);
  EXPECT_FALSE((*rows)[0].point.has_weight_decay());
  EXPECT_FALSE((*rows)[0].point.has_momentum());
  EXPECT_EQ(Lr((*rows)[1].point), std::nullopt);
  EXPECT_DOUBLE_EQ((*rows)[1].point.weight_decay(), 0.001);
  EXPECT_EQ(Seed((*rows)[2].point), 18446744073709551615u);
  EXPECT_DOUBLE_EQ((*rows)[2].point.learning_rate(), 3e-4);
  ASSERT_TRUE((*rows)[2].point.has_weight_decay());
  EXPECT_EQ((*rows)[2].point.weight_decay(), 0);
  // The values as written, for submit's checks of each flag.
  EXPECT_EQ((*rows)[2].flags.at("lr"), "3e-4");
  EXPECT_EQ((*rows)[2].flags.at("weight-decay"), "0");
  EXPECT_EQ((*rows)[1].flags.count("lr"), 0u);
}

TEST(ParseSweepPointsTest, BadFilesAreRefusedNamingTheLine) {
  auto error = [](const std::string& text) {
    const absl::StatusOr<std::vector<SweepPointRow>> rows = ParseSweepPoints(text);
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(rows.status().message());
  };
  EXPECT_EQ(error(""),
            "--points: the file is empty (a header such as 'lr,seed', then a line per member)");
  EXPECT_EQ(error("lr,seed\n"), "--points: the file has a header but no members");
  EXPECT_EQ(error("lr,widht\n0.1,3\n"),
            "--points: line 1: the header names columns lr, momentum, weight-decay, seed and "
            "submit's other flags that take a value (model, batch-size, epochs, optimizer, ...) "
            "but those of the data and placement, not 'widht'");
  EXPECT_THAT(error("lr,validation_fraction\n0.1,0.5\n"),
              ::testing::EndsWith("not 'validation_fraction'"));
  EXPECT_EQ(error("lr,learning-rate\n"), "--points: line 1: column lr is named twice");
  EXPECT_EQ(error("lr,seed\n0.1,1\n0.2\n"),
            "--points: line 3: has 1 values; the header names 2 (lr,seed)");
  EXPECT_EQ(error("lr\n0.1\nnan\n"), "--points: line 3: lr 'nan' is not a number");
  EXPECT_EQ(error("momentum\nabc\n"), "--points: line 2: momentum 'abc' is not a number");
  EXPECT_EQ(error("weight_decay\n1e400\n"),
            "--points: line 2: weight-decay '1e400' is not a number");  // overflows to inf
  EXPECT_EQ(error("seed\n18446744073709551616\n"),
            "--points: line 2: seed '18446744073709551616' is not a whole number in [0, 2^64)");
  EXPECT_EQ(error("seed\n-1\n"), "--points: line 2: seed '-1' is not a whole number in [0, 2^64)");
  EXPECT_EQ(error("seed\n1.5\n"),
            "--points: line 2: seed '1.5' is not a whole number in [0, 2^64)");
  std::string many = "seed\n";
  for (int i = 0; i < 257; ++i) absl::StrAppend(&many, i, "\n");
  EXPECT_EQ(error(many), "--points: line 258: a sweep has at most 256 members");
}

TEST_F(SweepPointsTest, PointsFillTheRequestInOrderAndOtherFlagsTheSpec) {
  const absl::StatusOr<v1::SubmitSweepRequest> request =
      Request("lr,momentum,seed\n0.1,0.9,1\n0.02,,2\n,0.5,\n",
              {"--optimizer", "sgd", "--lr", "0.05", "--seed", "9", "--epochs", "7"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_THAT(request->learning_rates(), IsEmpty());
  EXPECT_THAT(request->momenta(), IsEmpty());
  EXPECT_THAT(request->seeds(), IsEmpty());
  ASSERT_EQ(request->points_size(), 3);
  EXPECT_EQ(Lr(request->points(0)), 0.1);
  EXPECT_DOUBLE_EQ(request->points(0).momentum(), 0.9);
  EXPECT_EQ(Seed(request->points(0)), 1u);
  EXPECT_EQ(Lr(request->points(1)), 0.02);
  EXPECT_FALSE(request->points(1).has_momentum());
  EXPECT_EQ(Lr(request->points(2)), std::nullopt);  // the spec's 0.05
  EXPECT_EQ(Seed(request->points(2)), std::nullopt);
  // The single values are the spec's, for the members that leave them out.
  EXPECT_DOUBLE_EQ(request->spec().optimizer().learning_rate(), 0.05);
  EXPECT_EQ(request->spec().seed(), 9u);
  EXPECT_EQ(request->spec().epochs(), 7);
}

TEST_F(SweepPointsTest, EveryPointMeetsSubmitsChecksNamingItsLine) {
  EXPECT_EQ(Error("lr\n0.1\n-0.5\n"), "--points: line 3: --lr must be > 0, got -0.5");
  EXPECT_EQ(Error("momentum\n0.5\n1\n", {"--optimizer", "sgd"}),
            "--points: line 3: --momentum must be in [0, 1), got 1");
  // A check that ties a point's value to another flag.
  EXPECT_EQ(Error("lr\n0.1\n0.01\n", {"--schedule", "cosine", "--min-lr", "0.05"}),
            "--points: line 3: --min-lr must be in [0, 0.01), got 0.05");
  // That check does not hold the spec's default rate (0.01) against --min-lr when every member
  // gives its own rate: the spec then has the first member's.
  const absl::StatusOr<v1::SubmitSweepRequest> above =
      Request("lr,seed\n0.1,1\n0.2,\n", {"--schedule", "cosine", "--min-lr", "0.05"});
  ASSERT_TRUE(above.ok()) << above.status();
  EXPECT_DOUBLE_EQ(above->spec().optimizer().learning_rate(), 0.1);
  EXPECT_FALSE(above->spec().has_seed());  // not every member gives one
  EXPECT_EQ(Lr(above->points(1)), 0.2);
  EXPECT_EQ(Error("momentum\n0.1\n", {"--optimizer", "adam"}),
            "--points: line 2: --momentum applies to --optimizer sgd and rmsprop only");
}

TEST_F(SweepPointsTest, ListsAreRefusedWithPointsAndAMissingFileIsNamed) {
  EXPECT_EQ(Error("seed\n1\n", {"--lr", "0.1,0.2"}),
            "--points gives each member's values: --lr takes one value with it (the members' "
            "default), not a list");
  std::vector<std::string> words = {"trainctl", "sweep",    "--dataset", "iris",
                                    "--model",  "linear:3", "--points",  "/nonexistent/p.csv"};
  const absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  const absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(*invocation);
  EXPECT_EQ(request.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(request.status().message()),
              ::testing::StartsWith("--points: cannot open '/nonexistent/p.csv'"));
}

TEST_F(SweepPointsTest, DashReadsThePointsFromStandardInput) {
  std::istringstream input("lr,seed\n0.2,4\n0.3,5\n");
  std::streambuf* const saved = std::cin.rdbuf(input.rdbuf());
  const absl::StatusOr<Invocation> invocation = ParseCommandLine(
      {"trainctl", "sweep", "--dataset", "iris", "--model", "linear:3", "--points", "-"},
      std::nullopt);
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  const absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(*invocation);
  std::cin.rdbuf(saved);
  ASSERT_TRUE(request.ok()) << request.status();
  ASSERT_EQ(request->points_size(), 2);
  EXPECT_EQ(Lr(request->points(1)), 0.3);
  EXPECT_EQ(Seed(request->points(1)), 5u);
}

// Any other column of submit's: a member that differs from the sweep's spec carries its own, and
// the fields in which it differs; one that does not, none; each is checked as submit's flags.
TEST_F(SweepPointsTest, OtherColumnsGiveAMemberItsOwnSpecAndTheFieldsThatDiffer) {
  const absl::StatusOr<v1::SubmitSweepRequest> widths =
      Request("model,lr\nlinear:3,0.1\n\"linear:8,relu,linear:3\",0.01\n");
  ASSERT_TRUE(widths.ok()) << widths.status();
  EXPECT_FALSE(widths->points(0).has_spec());
  EXPECT_EQ(widths->points(1).spec().model(), "linear:8,relu,linear:3");
  EXPECT_THAT(widths->points(1).fields().paths(), ::testing::ElementsAre("model"));
  EXPECT_EQ(Error("model\n\"linear:8,relu\n"), "--points: line 2: a quote is not closed");
  const absl::StatusOr<v1::SubmitSweepRequest> ok =
      Request("batch-size,optimizer,lr,epochs\n,,0.1,\n64,adam,0.01,5\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->points_size(), 2);
  EXPECT_FALSE(ok->points(0).has_spec());
  EXPECT_EQ(ok->points(0).fields().paths_size(), 0);
  const v1::SweepPoint& other = ok->points(1);
  EXPECT_EQ(Lr(other), 0.01);
  EXPECT_THAT(
      std::vector<std::string>(other.fields().paths().begin(), other.fields().paths().end()),
      ::testing::UnorderedElementsAre("batch_size", "epochs", "optimizer.kind"));
  EXPECT_EQ(other.spec().batch_size(), 64);
  EXPECT_EQ(other.spec().epochs(), 5);
  EXPECT_EQ(other.spec().optimizer().kind(), v1::OPTIMIZER_KIND_ADAM);
  EXPECT_EQ(ok->spec().batch_size(), 32);  // the sweep's: the flag's default
  EXPECT_EQ(Error("batch-size\n0\n"), "--points: line 2: --batch-size must be at least 1, got 0");
}

// `--search FILE --trials N`: each line's flag becomes the field it sets (found by building the
// spec with it), its distribution as written; a choice's values as the API reads them.
TEST_F(SweepPointsTest, ASearchFileNamesEachFlagsFieldAndDistribution) {
  std::vector<std::string> words = {
      "trainctl",
      "sweep",
      "--dataset",
      "iris",
      "--model",
      "linear:3",
      "--search",
      Write("# the space\nlr log-uniform 1e-4 1e-1\nbatch-size log-integer 16 256\n"
            "optimizer choice sgd adam\nmodel choice linear:3 linear:16,relu,linear:3\n"),
      "--trials",
      "12",
      "--search-seed",
      "7"};
  absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
  ASSERT_TRUE(invocation.ok()) << invocation.status();
  absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(*invocation);
  ASSERT_TRUE(request.ok()) << request.status();
  const v1::SearchSpace& space = request->search();
  EXPECT_EQ(space.trials(), 12);
  EXPECT_EQ(space.seed(), 7u);
  ASSERT_EQ(space.parameters_size(), 4);
  EXPECT_EQ(space.parameters(0).field(), "optimizer.learning_rate");
  EXPECT_EQ(space.parameters(0).log_uniform().low(), 1e-4);
  EXPECT_EQ(space.parameters(1).field(), "batch_size");
  EXPECT_TRUE(space.parameters(1).integer().log());
  EXPECT_EQ(space.parameters(1).integer().high(), 256);
  EXPECT_EQ(space.parameters(2).field(), "optimizer.kind");
  EXPECT_THAT(space.parameters(2).choice().values(),
              ::testing::ElementsAre("OPTIMIZER_KIND_SGD", "OPTIMIZER_KIND_ADAM"));
  EXPECT_EQ(space.parameters(3).field(), "model");
  EXPECT_THAT(space.parameters(3).choice().values(),
              ::testing::ElementsAre("linear:3", "linear:16,relu,linear:3"));
  EXPECT_EQ(request->learning_rates_size(), 0);
  EXPECT_EQ(request->points_size(), 0);

  auto error = [&](const std::string& file, std::vector<std::string> more) {
    std::vector<std::string> w = {"trainctl", "sweep",    "--dataset", "iris",
                                  "--model",  "linear:3", "--search",  Write(file)};
    w.insert(w.end(), more.begin(), more.end());
    absl::StatusOr<Invocation> parsed = ParseCommandLine(w, std::nullopt);
    if (!parsed.ok()) return std::string(parsed.status().message());
    absl::StatusOr<v1::SubmitSweepRequest> refused = SweepRequestFromFlags(*parsed);
    EXPECT_FALSE(refused.ok());
    return std::string(refused.status().message());
  };
  EXPECT_EQ(error("lr uniform 0.1 0.2\n", {}),
            "--search needs --trials N, the members to draw (1 to 256)");
  EXPECT_EQ(error("lr gaussian 0 1\n", {"--trials", "2"}),
            "--search: line 1: 'gaussian' is no distribution");
  EXPECT_THAT(error("batch-size integer 0 4\n", {"--trials", "2"}),
              ::testing::HasSubstr("--search: line 1: --batch-size must be at least 1"));
  EXPECT_THAT(error("dataset choice a b\n", {"--trials", "2"}),
              ::testing::HasSubstr("write FLAG KIND VALUES"));
}

TEST_F(SweepPointsTest, AFileOverTheSizeLimitIsRefusedBeforeParsing) {
  const std::string big(static_cast<size_t>(kMaxSweepPointsFileBytes) + 1, '#');
  const std::string message = Error(big);
  EXPECT_THAT(message, ::testing::HasSubstr("is larger than 1048576 bytes"));
}

}  // namespace
}  // namespace trainerd::client
