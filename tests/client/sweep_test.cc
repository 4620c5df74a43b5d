// Tests for `trainctl sweep`: the command line (submit's flags with lists, --torchscript
// refused, the usage texts), the lists' parsing and the SubmitSweepRequest built from them
// (client/requests.h), the member tables and the summary line (client/output.h), the block
// redrawn in place (client/progress_bar.h), and the command against a fake trainerd in this
// process: what it sends, what it prints and how it exits.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/output.h"
#include "client/progress_bar.h"
#include "client/requests.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/client/run_captured.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Parses "trainctl" followed by `words`; the command line must be valid.
Invocation Parse(std::vector<std::string> words) {
  words.insert(words.begin(), "trainctl");
  absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
  EXPECT_TRUE(invocation.ok()) << invocation.status();
  return invocation.ok() ? *std::move(invocation) : Invocation();
}

// The message of a parse that must fail with INVALID_ARGUMENT.
std::string ParseError(std::vector<std::string> words) {
  words.insert(words.begin(), "trainctl");
  const absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
  EXPECT_EQ(invocation.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(invocation.status().message());
}

// `sweep --dataset iris --model linear:3` followed by `more`.
Invocation Sweep(const std::vector<std::string>& more) {
  std::vector<std::string> words = {"sweep", "--dataset", "iris", "--model", "linear:3"};
  words.insert(words.end(), more.begin(), more.end());
  return Parse(words);
}

// The message of a SweepRequestFromFlags that must fail with INVALID_ARGUMENT.
std::string RequestError(const Invocation& invocation) {
  const absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(invocation);
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(request.status().message());
}

// "0,1,...,count-1".
std::string Count(int count) {
  std::vector<int> values;
  for (int i = 0; i < count; ++i) values.push_back(i);
  return absl::StrJoin(values, ",");
}

const CommandSpec& CommandNamed(absl::string_view path) {
  for (const CommandSpec& command : Commands()) {
    if (command.path == path) return command;
  }
  ADD_FAILURE() << "no command " << path;
  return Commands().front();
}

// ---- The command line ----------------------------------------------------------------------

TEST(SweepCommandLineTest, SweepTakesEverySubmitFlagButTorchScriptAndPoints) {
  std::vector<std::string> submit;
  for (const FlagSpec& flag : CommandNamed("submit").flags) {
    if (flag.name != "torchscript") submit.emplace_back(flag.name);
    if (flag.name == "seed") {
      submit.emplace_back("points");
      submit.emplace_back("search");
      submit.emplace_back("trials");
      submit.emplace_back("search-seed");
      submit.emplace_back("halving-min-epochs");
      submit.emplace_back("halving-reduction-factor");
    }
  }
  std::vector<std::string> sweep;
  for (const FlagSpec& flag : CommandNamed("sweep").flags) sweep.emplace_back(flag.name);
  EXPECT_EQ(sweep, submit);
  EXPECT_EQ(sweep.size(), CommandNamed("submit").flags.size() + 5);
}

TEST(SweepRequestTest, HalvingFlagsSetTheSpecsRungs) {
  absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(
      Sweep({"--lr", "0.1,0.01", "--epochs", "27", "--halving-min-epochs", "3"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->spec().halving().min_epochs(), 3);
  EXPECT_EQ(request->spec().halving().reduction_factor(), 3);
  request = SweepRequestFromFlags(
      Sweep({"--lr", "0.1,0.01", "--halving-min-epochs", "1", "--halving-reduction-factor", "4"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->spec().halving().reduction_factor(), 4);
  // The accuracy metric applies to halving's rungs without early stopping.
  request = SweepRequestFromFlags(
      Sweep({"--lr", "0.1,0.01", "--halving-min-epochs", "1", "--early-stop-metric", "accuracy"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->spec().early_stop_metric(), v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY);
  EXPECT_EQ(request->spec().early_stop_patience(), 0);
  request = SweepRequestFromFlags(Sweep({"--lr", "0.1,0.01"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_FALSE(request->spec().has_halving());
  EXPECT_THAT(RequestError(Sweep({"--halving-reduction-factor", "2"})),
              HasSubstr("give --halving-min-epochs N too"));
  EXPECT_THAT(RequestError(Sweep({"--halving-min-epochs", "1", "--halving-reduction-factor", "1"})),
              HasSubstr("halving-reduction-factor"));
  // Submit has no rungs to compare against.
  EXPECT_THAT(ParseError({"submit", "--halving-min-epochs", "1"}), HasSubstr("halving-min-epochs"));
}

TEST(SweepCommandLineTest, ListFlagsAreKeptAsWritten) {
  const Invocation invocation =
      Sweep({"--lr", "0.1,0.03,0.01", "--seed=1,2,3,4", "--momentum", "0.9", "--watch"});
  ASSERT_NE(invocation.command, nullptr);
  EXPECT_EQ(invocation.command->path, "sweep");
  EXPECT_EQ(invocation.Get("lr"), "0.1,0.03,0.01");
  EXPECT_EQ(invocation.Get("seed"), "1,2,3,4");
  EXPECT_EQ(invocation.Get("momentum"), "0.9");
  EXPECT_TRUE(invocation.Has("watch"));
}

TEST(SweepCommandLineTest, TorchScriptIsRefusedSayingItIsForSubmit) {
  EXPECT_EQ(ParseError({"sweep", "--dataset", "iris", "--torchscript", "net.pt"}),
            "--torchscript is for 'trainctl submit' only: the members of a sweep train a --model "
            "spec (see 'trainctl sweep --help')");
  EXPECT_EQ(ParseError({"sweep", "--torchscript=net.pt"}),
            "--torchscript is for 'trainctl submit' only: the members of a sweep train a --model "
            "spec (see 'trainctl sweep --help')");
  // Submit still takes it.
  EXPECT_EQ(Parse({"submit", "--torchscript", "net.pt"}).Get("torchscript"), "net.pt");
}

TEST(SweepCommandLineTest, HelpDescribesTheListFlags) {
  const Invocation help = Parse({"sweep", "--help"});
  ASSERT_TRUE(help.show_help);
  EXPECT_THAT(help.help_text, ::testing::StartsWith("Usage: trainctl sweep [FLAGS]\n"));
  EXPECT_THAT(help.help_text,
              HasSubstr("\n  --lr RATE,...               learning rates, each > 0, e.g. "
                        "0.1,0.03,0.01; the peak\n"));
  EXPECT_THAT(help.help_text, HasSubstr("\n  --momentum M,...  "));
  EXPECT_THAT(help.help_text, HasSubstr("\n  --weight-decay W,...  "));
  EXPECT_THAT(help.help_text, HasSubstr("\n  --seed S,...  "));
  EXPECT_THAT(help.help_text, HasSubstr("comma-separated list"));
  EXPECT_THAT(help.help_text, HasSubstr("at most 256 values per list and 256 members in all"));
  EXPECT_THAT(help.help_text, HasSubstr("one packed model"));
  EXPECT_THAT(help.help_text, HasSubstr("  trainctl sweep --dataset iris "));
  // Submit's other flags, with submit's help.
  EXPECT_THAT(help.help_text,
              HasSubstr("\n  --batch-size N              rows per batch (default 32)\n"));
  EXPECT_THAT(help.help_text, Not(HasSubstr("--torchscript FILE")));
  EXPECT_EQ(Parse({"help", "sweep"}).help_text, help.help_text);
}

TEST(SweepCommandLineTest, TopLevelUsageListsSweepWithAnExample) {
  EXPECT_THAT(TopLevelUsage(),
              HasSubstr("\n  sweep --dataset NAME --model SPEC --lr 0.1,0.01 --seed 1,2\n"
                        "                              Submit a hyperparameter sweep (a job per "
                        "combination)\n"));
}

// ---- The lists -----------------------------------------------------------------------------

TEST(ParseSweepValuesTest, CommaSeparatedValuesInOrder) {
  const absl::StatusOr<std::vector<double>> values = ParseSweepValues("lr", "0.1,0.03,1e-3");
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre(0.1, 0.03, 0.001));
}

TEST(ParseSweepValuesTest, OneValueAndSpacesAroundValues) {
  EXPECT_THAT(*ParseSweepValues("lr", "0.5"), ElementsAre(0.5));
  EXPECT_THAT(*ParseSweepValues("momentum", " 0 , 0.9"), ElementsAre(0.0, 0.9));
}

TEST(ParseSweepValuesTest, EmptyElementIsRefusedByPosition) {
  EXPECT_EQ(ParseSweepValues("lr", "0.1,,0.2").status().message(),
            "--lr: value 2 of '0.1,,0.2' is empty (give comma-separated values, e.g. 0.1,0.01)");
  EXPECT_EQ(ParseSweepValues("lr", "0.1,").status().message(),
            "--lr: value 2 of '0.1,' is empty (give comma-separated values, e.g. 0.1,0.01)");
  EXPECT_EQ(ParseSweepValues("momentum", "").status().message(),
            "--momentum: value 1 of '' is empty (give comma-separated values, e.g. 0.1,0.01)");
}

TEST(ParseSweepValuesTest, NonNumbersAreRefusedByValue) {
  EXPECT_EQ(ParseSweepValues("lr", "abc").status().message(), "--lr: 'abc' is not a number");
  EXPECT_EQ(ParseSweepValues("weight-decay", "0.1,0.2x").status().message(),
            "--weight-decay: '0.2x' is not a number");
  EXPECT_EQ(ParseSweepValues("lr", "0.1,inf").status().message(), "--lr: 'inf' is not a number");
  EXPECT_EQ(ParseSweepValues("lr", "nan").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseSweepValuesTest, AtMost256Values) {
  const absl::StatusOr<std::vector<double>> most = ParseSweepValues("lr", Count(256));
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(most->size(), 256u);
  EXPECT_EQ(most->back(), 255.0);
  EXPECT_EQ(ParseSweepValues("lr", Count(257)).status().message(),
            "--lr has 257 values; a sweep takes at most 256 per list");
}

TEST(ParseSweepSeedsTest, WholeNumbersUpToTheLargest) {
  const absl::StatusOr<std::vector<uint64_t>> seeds = ParseSweepSeeds("1,2,0,18446744073709551615");
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  EXPECT_THAT(*seeds, ElementsAre(1u, 2u, 0u, std::numeric_limits<uint64_t>::max()));
}

TEST(ParseSweepSeedsTest, NegativeFractionalAndTooLargeSeedsAreRefused) {
  EXPECT_EQ(ParseSweepSeeds("1,-1").status().message(),
            "--seed: '-1' is not a whole number between 0 and 18446744073709551615");
  EXPECT_EQ(ParseSweepSeeds("1.5").status().message(),
            "--seed: '1.5' is not a whole number between 0 and 18446744073709551615");
  EXPECT_EQ(ParseSweepSeeds("18446744073709551616").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSweepSeeds("1,,2").status().message(),
            "--seed: value 2 of '1,,2' is empty (give comma-separated values, e.g. 0.1,0.01)");
  EXPECT_EQ(ParseSweepSeeds(Count(257)).status().message(),
            "--seed has 257 values; a sweep takes at most 256 per list");
}

// ---- The request ---------------------------------------------------------------------------

TEST(SweepRequestFromFlagsTest, ListsFillTheRepeatedFieldsAndOtherFlagsTheSpec) {
  const std::vector<std::string> words = absl::StrSplit(
      "sweep --dataset mnist --model Linear:16,RELU,linear:10 --loss cross_entropy --optimizer "
      "sgd --lr 0.1,0.03,0.01 --momentum 0,0.9 --weight-decay 0.0001 --seed 1,2,3,4 "
      "--batch-size 128 --epochs 20 --validation-fraction 0.2 --early-stop-patience 3 "
      "--schedule cosine --min-lr 0.001 --precision bf16 --priority high --device cuda:1 "
      "--no-shuffle --watch",
      ' ');
  const absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(Parse(words));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_THAT(request->learning_rates(), ElementsAre(0.1, 0.03, 0.01));
  EXPECT_THAT(request->momenta(), ElementsAre(0.0, 0.9));
  EXPECT_THAT(request->weight_decays(), ElementsAre(0.0001));
  EXPECT_THAT(request->seeds(), ElementsAre(1u, 2u, 3u, 4u));

  const v1::JobSpec& spec = request->spec();
  EXPECT_EQ(spec.dataset(), "mnist");
  EXPECT_EQ(spec.model(), "linear:16,relu,linear:10");  // canonical, as submit sends it
  EXPECT_EQ(spec.loss(), v1::LOSS_CROSS_ENTROPY);
  EXPECT_EQ(spec.optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_EQ(spec.batch_size(), 128);
  EXPECT_EQ(spec.epochs(), 20);
  EXPECT_DOUBLE_EQ(spec.validation_fraction(), 0.2);
  EXPECT_EQ(spec.early_stop_patience(), 3);
  EXPECT_EQ(spec.schedule().kind(), v1::Schedule::COSINE);
  EXPECT_DOUBLE_EQ(spec.schedule().min_learning_rate(), 0.001);
  EXPECT_EQ(spec.precision(), v1::PRECISION_BF16);
  EXPECT_EQ(spec.priority(), v1::JOB_PRIORITY_HIGH);
  EXPECT_EQ(spec.device(), "cuda:1");
  ASSERT_TRUE(spec.has_shuffle());
  EXPECT_FALSE(spec.shuffle());
  // The swept fields hold the first member's values (the daemon sets each member's own).
  EXPECT_DOUBLE_EQ(spec.optimizer().learning_rate(), 0.1);
  EXPECT_DOUBLE_EQ(spec.optimizer().momentum(), 0.0);
  ASSERT_TRUE(spec.optimizer().has_weight_decay());
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0.0001);
  ASSERT_TRUE(spec.has_seed());
  EXPECT_EQ(spec.seed(), 1u);
}

TEST(SweepRequestFromFlagsTest, FlagsNotGivenLeaveTheirListsEmpty) {
  const absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(Sweep({}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_THAT(request->learning_rates(), IsEmpty());
  EXPECT_THAT(request->momenta(), IsEmpty());
  EXPECT_THAT(request->weight_decays(), IsEmpty());
  EXPECT_THAT(request->seeds(), IsEmpty());
  EXPECT_DOUBLE_EQ(request->spec().optimizer().learning_rate(), 0.01);  // submit's default
  EXPECT_FALSE(request->spec().has_seed());
  EXPECT_FALSE(request->spec().optimizer().has_weight_decay());
}

TEST(SweepRequestFromFlagsTest, ProductOfAtMost256MembersIsAccepted) {
  const absl::StatusOr<v1::SubmitSweepRequest> request =
      SweepRequestFromFlags(Sweep({"--lr", "0.1,0.2,0.3,0.4", "--seed", Count(64)}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->learning_rates_size() * request->seeds_size(), 256);
}

TEST(SweepRequestFromFlagsTest, ProductOverTheLimitIsRefusedWithItsFactors) {
  EXPECT_EQ(RequestError(Sweep({"--lr", "0.1,0.2,0.3,0.4,0.5", "--seed", Count(52)})),
            "a sweep has at most 256 members; 5 learning rates x 52 seeds make 260");
  // Lists of one value are no factor of the message.
  EXPECT_EQ(RequestError(Sweep({"--lr", Count(17).substr(2), "--momentum", "0,0.5", "--seed",
                                "1,2,3,4,5,6,7,8,9", "--weight-decay", "0"})),
            "a sweep has at most 256 members; 16 learning rates x 2 momenta x 9 seeds make 288");
}

TEST(SweepRequestFromFlagsTest, BadListsAreRefusedAsTheirParsersSay) {
  EXPECT_EQ(RequestError(Sweep({"--lr", "0.1,,0.2"})),
            "--lr: value 2 of '0.1,,0.2' is empty (give comma-separated values, e.g. 0.1,0.01)");
  EXPECT_EQ(RequestError(Sweep({"--momentum", "abc"})), "--momentum: 'abc' is not a number");
  EXPECT_EQ(RequestError(Sweep({"--seed", "3,-1"})),
            "--seed: '-1' is not a whole number between 0 and 18446744073709551615");
  EXPECT_EQ(RequestError(Sweep({"--weight-decay", Count(257)})),
            "--weight-decay has 257 values; a sweep takes at most 256 per list");
}

TEST(SweepRequestFromFlagsTest, EveryValueMeetsSubmitsChecks) {
  // Not only the first value: the third rate is out of range.
  EXPECT_EQ(RequestError(Sweep({"--lr", "0.1,0.2,-0.5"})), "--lr must be > 0, got -0.5");
  EXPECT_EQ(RequestError(Sweep({"--momentum", "0.5,1"})), "--momentum must be in [0, 1), got 1");
  EXPECT_EQ(RequestError(Sweep({"--weight-decay", "0,-0.01"})),
            "--weight-decay must be >= 0, got -0.01");
  // Checks that tie a swept value to another flag.
  EXPECT_EQ(RequestError(Sweep({"--schedule", "cosine", "--min-lr", "0.05", "--lr", "0.1,0.01"})),
            "--min-lr must be in [0, 0.01), got 0.05");
  EXPECT_EQ(RequestError(Sweep({"--optimizer", "adam", "--momentum", "0.1,0.2"})),
            "--momentum applies to --optimizer sgd and rmsprop only");
}

TEST(SweepRequestFromFlagsTest, MissingFlagsNameTheSweep) {
  EXPECT_EQ(RequestError(Parse({"sweep", "--model", "linear:1", "--lr", "0.1,0.2"})),
            "sweep needs --dataset NAME (see 'trainctl sweep --help')");
  EXPECT_EQ(RequestError(Parse({"sweep", "--dataset", "iris"})),
            "sweep needs --model SPEC, e.g. --model linear:64,relu,linear:1");
}

// ---- The tables ----------------------------------------------------------------------------

// A sweep member: sgd with momentum unless `optimizer` says otherwise.
v1::Job Member(const std::string& id, double lr, std::optional<double> momentum,
               std::optional<double> weight_decay, std::optional<uint64_t> seed,
               v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_sweep_id("sweep-0123456789ab");
  job.set_state(state);
  v1::Optimizer* optimizer = job.mutable_spec()->mutable_optimizer();
  optimizer->set_kind(momentum.has_value() ? v1::OPTIMIZER_KIND_SGD : v1::OPTIMIZER_KIND_ADAM);
  optimizer->set_learning_rate(lr);
  if (momentum.has_value()) optimizer->set_momentum(*momentum);
  if (weight_decay.has_value()) optimizer->set_weight_decay(*weight_decay);
  if (seed.has_value()) job.mutable_spec()->set_seed(*seed);
  job.mutable_spec()->set_epochs(20);
  return job;
}

// `epochs` finished epochs, the last with `loss` (and `validation_loss` when given), as GetJob's
// full view has them.
void Train(v1::Job* job, int epochs, double loss, std::optional<double> validation_loss) {
  for (int i = 1; i <= epochs; ++i) {
    v1::EpochResult* epoch = job->add_epochs();
    epoch->set_epoch(i);
    epoch->set_loss(i == epochs ? loss : loss + 1);
    if (validation_loss.has_value()) epoch->set_validation_loss(*validation_loss + epochs - i);
  }
  job->set_epochs_completed(epochs);
  job->set_final_loss(loss);
}

TEST(SweepSubmitTableTest, SweepIdThenMembersInProductOrder) {
  v1::SubmitSweepResponse response;
  response.set_sweep_id("sweep-0123456789ab");
  *response.add_members() = Member("job-01", 0.1, 0.0, std::nullopt, 1, v1::JOB_STATE_QUEUED);
  *response.add_members() = Member("job-02", 0.1, 0.0, std::nullopt, 2, v1::JOB_STATE_QUEUED);
  *response.add_members() = Member("job-03", 0.03, 0.9, 0.001, 1, v1::JOB_STATE_QUEUED);
  // Adam: no momentum; no seed set.
  *response.add_members() =
      Member("job-04", 0.03, std::nullopt, 0.01, std::nullopt, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(SweepSubmitTable(response),
            "sweep-0123456789ab\n"
            "ID      LR    MOMENTUM  WEIGHT DECAY  SEED  STATE\n"
            "job-01  0.1   0         -             1     QUEUED\n"
            "job-02  0.1   0         -             2     QUEUED\n"
            "job-03  0.03  0.9       0.001         1     QUEUED\n"
            "job-04  0.03  -         0.01          -     RUNNING\n");
}

// Five members in product order, in every state, with losses out of order.
v1::SubmitSweepResponse WatchedSweep() {
  v1::SubmitSweepResponse sweep;
  sweep.set_sweep_id("sweep-0123456789ab");
  v1::Job* succeeded = sweep.add_members();
  *succeeded = Member("job-01", 0.1, 0.9, std::nullopt, 1, v1::JOB_STATE_SUCCEEDED);
  Train(succeeded, 20, 0.05, 0.07);
  v1::Job* running = sweep.add_members();
  *running = Member("job-02", 0.1, 0.9, std::nullopt, 2, v1::JOB_STATE_RUNNING);
  Train(running, 5, 0.02, std::nullopt);
  *sweep.add_members() = Member("job-03", 0.01, 0.9, std::nullopt, 1, v1::JOB_STATE_QUEUED);
  v1::Job* failed = sweep.add_members();
  *failed = Member("job-04", 1.5, 0.9, std::nullopt, 2, v1::JOB_STATE_FAILED);
  Train(failed, 3, std::nan(""), std::nullopt);
  failed->set_error("loss became NaN at epoch 3");
  v1::Job* cancelled = sweep.add_members();
  *cancelled = Member("job-05", 0.001, 0.9, 0.0001, 1, v1::JOB_STATE_CANCELLED);
  Train(cancelled, 2, 0.3, 0.25);
  return sweep;
}

TEST(SweepWatchTableTest, MembersSortedByLossWithoutEpochsLast) {
  // job-01 and job-05 validate: the table ranks by validation loss, job-02 (running, no
  // validation loss yet) after them.
  EXPECT_EQ(SweepWatchTable(WatchedSweep().members()),
            "ID      LR     MOMENTUM  WD      SEED  STATE      EPOCH  LOSS      VAL LOSS  VAL ACC\n"
            "job-01  0.1    0.9       -       1     SUCCEEDED  20/20  0.050000  0.070000  -\n"
            "job-05  0.001  0.9       0.0001  1     CANCELLED  2/20   0.300000  0.250000  -\n"
            "job-02  0.1    0.9       -       2     RUNNING    5/20   0.020000  -         -\n"
            "job-04  1.5    0.9       -       2     FAILED     3/20   NaN       -         -\n"
            "job-03  0.01   0.9       -       1     QUEUED     0/20   -         -         -\n");
}

// On scikit-learn's digits a sweep named the member with the second-worst validation loss of
// eight as the best, by its training loss: with validation, the validation loss ranks.
TEST(SweepWatchTableTest, ValidatingMembersRankByValidationLossWithAccuracy) {
  v1::SubmitSweepResponse sweep;
  const struct {
    const char* id;
    double loss;
    double validation_loss;
    double accuracy;
  } members[] = {{"job-01", 0.001, 0.31, 0.912},
                 {"job-02", 0.020, 0.09, 0.975},
                 {"job-03", 0.008, 0.12, 0.961}};
  for (const auto& m : members) {
    v1::Job* job = sweep.add_members();
    *job = Member(m.id, 0.1, 0.0, std::nullopt, 1, v1::JOB_STATE_SUCCEEDED);
    job->mutable_spec()->set_validation_fraction(0.2);
    Train(job, 20, m.loss, m.validation_loss);
    job->mutable_epochs(19)->set_validation_accuracy(m.accuracy);
  }
  EXPECT_EQ(SweepWatchTable(sweep.members()),
            "ID      LR   MOMENTUM  WD  SEED  STATE      EPOCH  LOSS      VAL LOSS  VAL ACC\n"
            "job-02  0.1  0         -   1     SUCCEEDED  20/20  0.020000  0.090000  97.5%\n"
            "job-03  0.1  0         -   1     SUCCEEDED  20/20  0.008000  0.120000  96.1%\n"
            "job-01  0.1  0         -   1     SUCCEEDED  20/20  0.001000  0.310000  91.2%\n");
  EXPECT_EQ(SweepSummaryLine(sweep.members()),
            "3 succeeded, 0 failed, 0 cancelled; best job-02 by validation loss 0.090000, "
            "validation accuracy 97.5% (training loss 0.020000)");
}

// A search over widths and batch sizes shows them, and a member halving stopped says where; the
// summary counts what halving saved.
TEST(SweepWatchTableTest, ASearchShowsItsModelsBatchesAndRungs) {
  v1::SubmitSweepResponse sweep;
  const struct {
    const char* id;
    const char* model;
    int64_t batch;
    int epochs;
    double validation_loss;
  } members[] = {{"job-01", "linear:8,relu,linear:1", 16, 20, 0.05},
                 {"job-02", "linear:1", 64, 5, 0.4}};
  for (const auto& m : members) {
    v1::Job* job = sweep.add_members();
    *job = Member(m.id, 0.1, 0.0, std::nullopt, 1, v1::JOB_STATE_SUCCEEDED);
    job->mutable_spec()->set_model(m.model);
    job->mutable_spec()->set_batch_size(m.batch);
    job->mutable_spec()->set_validation_fraction(0.2);
    Train(job, m.epochs, 0.1, m.validation_loss);
  }
  sweep.mutable_members(1)->set_stopped_early(true);
  sweep.mutable_members(1)->set_stop_reason("stopped at the rung of epoch 5: validation loss 0.4");
  EXPECT_EQ(SweepWatchTable(sweep.members()),
            "ID      LR   MOMENTUM  WD  SEED  MODEL                   BATCH  STATE         EPOCH  "
            "LOSS      VAL LOSS  VAL ACC\n"
            "job-01  0.1  0         -   1     linear:8,relu,linear:1  16     SUCCEEDED     20/20  "
            "0.100000  0.050000  -\n"
            "job-02  0.1  0         -   1     linear:1                64     STOPPED AT 5  5/20   "
            "0.100000  0.400000  -\n");
  EXPECT_THAT(SweepSummaryLine(sweep.members()),
              HasSubstr("2 succeeded, 0 failed, 0 cancelled; halving stopped 1 at their rungs, 15 "
                        "epochs not trained; best job-01"));
}

TEST(SweepWatchTableTest, EqualLossesKeepProductOrderAndBasicViewCountsEpochs) {
  v1::SubmitSweepResponse sweep;
  for (const char* id : {"job-01", "job-02", "job-03"}) {
    v1::Job* job = sweep.add_members();
    *job = Member(id, 0.1, 0.0, std::nullopt, 7, v1::JOB_STATE_RUNNING);
    // No epochs in the message: a count and a loss, as a listing's basic view has them.
    job->set_epochs_completed(4);
    job->set_final_loss(std::string(id) == "job-01" ? 0.5 : 0.25);
  }
  const std::string table = SweepWatchTable(sweep.members());
  const std::vector<std::string> lines = absl::StrSplit(table, '\n');
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[1], "job-02  0.1  0         -   7     RUNNING  4/20   0.250000  -         -");
  EXPECT_EQ(lines[2], "job-03  0.1  0         -   7     RUNNING  4/20   0.250000  -         -");
  EXPECT_EQ(lines[3], "job-01  0.1  0         -   7     RUNNING  4/20   0.500000  -         -");
}

TEST(SweepWatchTableTest, MaxMembersCutsTheTableWithACount) {
  const v1::SubmitSweepResponse sweep = WatchedSweep();
  EXPECT_EQ(SweepWatchTable(sweep.members(), /*max_members=*/2),
            "ID      LR     MOMENTUM  WD      SEED  STATE      EPOCH  LOSS      VAL LOSS  VAL ACC\n"
            "job-01  0.1    0.9       -       1     SUCCEEDED  20/20  0.050000  0.070000  -\n"
            "job-05  0.001  0.9       0.0001  1     CANCELLED  2/20   0.300000  0.250000  -\n"
            "... and 3 more\n");
  EXPECT_EQ(SweepWatchTable(sweep.members(), /*max_members=*/5), SweepWatchTable(sweep.members()));
}

TEST(SweepSummaryLineTest, CountsOutcomesAndNamesTheBestSucceededMember) {
  // job-02 has the lowest loss but is still running: the best is among those that succeeded.
  EXPECT_EQ(SweepSummaryLine(WatchedSweep().members()),
            "1 succeeded, 1 failed, 1 cancelled; best job-01 by validation loss 0.070000 "
            "(training loss 0.050000)");
}

TEST(SweepSummaryLineTest, LowestLossWinsAndTheFirstOfEqualOnes) {
  v1::SubmitSweepResponse sweep;
  const std::pair<const char*, double> members[] = {
      {"job-01", 0.4}, {"job-02", 0.0125}, {"job-03", 0.0125}, {"job-04", 0.9}};
  for (const auto& [id, loss] : members) {
    v1::Job* job = sweep.add_members();
    *job = Member(id, 0.1, 0.0, std::nullopt, 1, v1::JOB_STATE_SUCCEEDED);
    Train(job, 20, loss, std::nullopt);
  }
  EXPECT_EQ(SweepSummaryLine(sweep.members()),
            "4 succeeded, 0 failed, 0 cancelled; best job-02 by training loss 0.012500 (the "
            "members do not validate)");
}

TEST(SweepSummaryLineTest, NoMemberSucceeded) {
  v1::SubmitSweepResponse sweep;
  *sweep.add_members() = Member("job-01", 0.1, 0.0, std::nullopt, 1, v1::JOB_STATE_FAILED);
  *sweep.add_members() = Member("job-02", 0.1, 0.0, std::nullopt, 2, v1::JOB_STATE_FAILED);
  *sweep.add_members() = Member("job-03", 0.1, 0.0, std::nullopt, 3, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(SweepSummaryLine(sweep.members()),
            "0 succeeded, 2 failed, 1 cancelled; no member succeeded");
}

TEST(SweepJobDetailsTest, JobGetShowsTheSweepAndThePack) {
  v1::Job job = Member("job-01", 0.1, 0.9, std::nullopt, 1, v1::JOB_STATE_SUCCEEDED);
  job.mutable_report()->set_packed_members(6);
  job.mutable_report()->set_steps_per_second(100);
  job.mutable_report()->set_packed_bitwise(true);
  job.mutable_report()->set_packed_numerics("bitwise the job alone: its own path, in turn");
  const std::string details = JobDetails(job);
  EXPECT_THAT(details, ::testing::ContainsRegex("\nsweep: +sweep-0123456789ab\n"));
  EXPECT_THAT(details,
              ::testing::ContainsRegex("\n  packed: +6 sweep members trained as one pack\n"));
  // What the daemon says of the member's values against the job alone.
  EXPECT_THAT(details, ::testing::ContainsRegex(
                           "\n  numerics: +bitwise the job alone: its own path, in turn\n"));
  EXPECT_THAT(
      JobDetails(Member("job-02", 0.1, 0.9, std::nullopt, 1, v1::JOB_STATE_QUEUED)).find("packed"),
      std::string::npos);
}

// ---- The block redrawn in place ------------------------------------------------------------

TEST(LiveBlockTest, RedrawsOverThePreviousBlockOnlyWhenItChanged) {
  std::ostringstream out;
  LiveBlock block(out, /*columns=*/0);
  block.Show("a\nb\n");
  EXPECT_EQ(out.str(), "a\nb\n");
  block.Show("a\nb\n");
  EXPECT_EQ(out.str(), "a\nb\n");  // unchanged: nothing written
  block.Show("c\nd\ne\n");
  EXPECT_EQ(out.str(), "a\nb\n\x1b[2A\r\x1b[Jc\nd\ne\n");
  block.Show("f\n");
  EXPECT_EQ(out.str(), "a\nb\n\x1b[2A\r\x1b[Jc\nd\ne\n\x1b[3A\r\x1b[Jf\n");
}

TEST(LiveBlockTest, RowsCountWrappedLines) {
  EXPECT_EQ(LiveBlock::Rows("", 80), 0);
  EXPECT_EQ(LiveBlock::Rows("abc\nde\n", 0), 2);
  EXPECT_EQ(LiveBlock::Rows("abcd\n", 4), 1);  // exactly the width: one row
  EXPECT_EQ(LiveBlock::Rows("abcdefghij\nab\n", 4), 4);
  EXPECT_EQ(LiveBlock::Rows("µµµµµ\n", 4), 2);  // columns, not bytes

  std::ostringstream out;
  LiveBlock block(out, /*columns=*/4);
  block.Show("abcdefghij\n");
  block.Show("x\n");
  EXPECT_EQ(out.str(), "abcdefghij\n\x1b[3A\r\x1b[Jx\n");
}

// ---- The command against a fake trainerd ---------------------------------------------------

// SubmitSweep makes one member per learning rate (ids job-01, ...); GetJob answers RUNNING with
// one epoch the first time it is asked about a member and its outcome (`outcomes`, else
// SUCCEEDED) with every epoch the second time. A member's final loss is 0.5 / its position, so
// that the last member has the lowest loss.
class FakeSweepJobs final : public v1::JobService::Service {
 public:
  grpc::Status SubmitSweep(grpc::ServerContext*, const v1::SubmitSweepRequest* request,
                           v1::SubmitSweepResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests.push_back(*request);
    response->set_sweep_id("sweep-00000000000a");
    for (int i = 0; i < request->learning_rates_size(); ++i) {
      v1::Job* job = response->add_members();
      job->set_id(absl::StrCat("job-0", i + 1));
      job->set_sweep_id(response->sweep_id());
      job->set_state(v1::JOB_STATE_QUEUED);
      *job->mutable_spec() = request->spec();
      job->mutable_spec()->mutable_optimizer()->set_learning_rate(request->learning_rates(i));
      members_[job->id()] = *job;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = members_.find(request->id());
    if (it == members_.end() || request->id() == missing) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("job '", request->id(), "' not found"));
    }
    const int asked = ++asked_[request->id()];
    *response = it->second;
    const int position = request->id().back() - '0';
    const double loss = 0.5 / position;
    if (asked == 1) {
      response->set_state(v1::JOB_STATE_RUNNING);
      Train(response, 1, loss * 2, std::nullopt);
      return grpc::Status::OK;
    }
    auto outcome = outcomes.find(request->id());
    response->set_state(outcome == outcomes.end() ? v1::JOB_STATE_SUCCEEDED : outcome->second);
    Train(response, response->spec().epochs(), loss, std::nullopt);
    return grpc::Status::OK;
  }

  // The member's outcome (as the second GetJob gives it) as the stream's one Job, then the end:
  // what the daemon sends a watcher of a job that ended.
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    v1::JobEvent event;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = members_.find(request->id());
      if (it == members_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "not found");
      ++watched_[request->id()];
      v1::Job* job = event.mutable_job();
      *job = it->second;
      auto outcome = outcomes.find(request->id());
      job->set_state(outcome == outcomes.end() ? v1::JOB_STATE_SUCCEEDED : outcome->second);
      Train(job, job->spec().epochs(), 0.5 / (request->id().back() - '0'), std::nullopt);
    }
    // As the daemon sends a late watcher the history: each epoch, then the job.
    if (history_first) {
      for (const v1::EpochResult& epoch : event.job().epochs()) {
        v1::JobEvent e;
        *e.mutable_epoch() = epoch;
        writer->Write(e);
      }
    }
    writer->Write(event);
    return grpc::Status::OK;
  }

  int Watched(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return watched_[id];
  }

  int Asked(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return asked_[id];
  }

  std::vector<v1::SubmitSweepRequest> requests;
  std::map<std::string, v1::JobState> outcomes;
  std::string missing;         // an id GetJob answers NOT_FOUND for
  bool history_first = false;  // WatchJob sends the epochs as events before the job

 private:
  std::mutex mu_;
  std::map<std::string, v1::Job> members_;
  std::map<std::string, int> asked_;
  std::map<std::string, int> watched_;
};

class SweepCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&jobs_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs `trainctl sweep --dataset iris --model linear:3 --epochs 4` followed by `more` against
  // the fake; its stdout in out_, its stderr in err_. Stdout is pointed away from any terminal
  // meanwhile, so that the command prints as it does into a pipe.
  int Run(const std::vector<std::string>& more) {
    std::vector<std::string> words = {"trainctl", "--addr",    absl::StrCat("127.0.0.1:", port_),
                                      "sweep",    "--dataset", "iris",
                                      "--model",  "linear:3",  "--epochs",
                                      "4"};
    words.insert(words.end(), more.begin(), more.end());
    return RunWords(words);
  }
  // Runs `trainctl --addr <fake> <words...>`.
  int RunTrainctl(const std::vector<std::string>& more) {
    std::vector<std::string> words = {"trainctl", "--addr", absl::StrCat("127.0.0.1:", port_)};
    words.insert(words.end(), more.begin(), more.end());
    return RunWords(words);
  }
  int RunWords(const std::vector<std::string>& words) {
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    if (!invocation.ok()) return -1;
    CapturedRun run = RunCaptured(*invocation);
    out_ = std::move(run.out);
    err_ = std::move(run.err);
    return run.code;
  }

  std::vector<std::string> OutLines() const { return absl::StrSplit(out_, '\n'); }

  FakeSweepJobs jobs_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string out_;
  std::string err_;
};

TEST_F(SweepCommandTest, PrintsTheSweepIdAndTheMembers) {
  EXPECT_EQ(Run({"--lr", "0.1,0.01", "--seed", "7"}), kExitOk) << err_;
  ASSERT_EQ(jobs_.requests.size(), 1u);
  EXPECT_THAT(jobs_.requests[0].learning_rates(), ElementsAre(0.1, 0.01));
  EXPECT_THAT(jobs_.requests[0].seeds(), ElementsAre(7u));
  EXPECT_EQ(jobs_.requests[0].spec().epochs(), 4);
  EXPECT_EQ(out_,
            "sweep-00000000000a\n"
            "ID      LR    MOMENTUM  WEIGHT DECAY  SEED  STATE\n"
            "job-01  0.1   0         -             7     QUEUED\n"
            "job-02  0.01  0         -             7     QUEUED\n");
  EXPECT_EQ(jobs_.Asked("job-01"), 0);  // no --watch: nothing polled
  EXPECT_THAT(err_, IsEmpty());
}

TEST_F(SweepCommandTest, JsonPrintsTheResponse) {
  EXPECT_EQ(Run({"--lr", "0.1,0.01", "-o", "json"}), kExitOk) << err_;
  v1::SubmitSweepResponse printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &printed).ok()) << out_;
  EXPECT_EQ(printed.sweep_id(), "sweep-00000000000a");
  ASSERT_EQ(printed.members_size(), 2);
  EXPECT_EQ(printed.members(1).id(), "job-02");
  EXPECT_DOUBLE_EQ(printed.members(1).spec().optimizer().learning_rate(), 0.01);
}

TEST_F(SweepCommandTest, WatchPrintsTheFinalTableOnceAndExitsZeroWhenAllSucceeded) {
  EXPECT_EQ(Run({"--lr", "0.3,0.2,0.1", "--watch"}), kExitOk) << err_;
  // Every member asked (RUNNING), then the first one's end awaited on its stream, then the others
  // asked again (SUCCEEDED).
  EXPECT_EQ(jobs_.Asked("job-01"), 1);
  EXPECT_EQ(jobs_.Watched("job-01"), 1);
  EXPECT_EQ(jobs_.Asked("job-03"), 2);
  EXPECT_EQ(jobs_.Watched("job-03"), 0);
  // Into a pipe: the id, one table (the final one, lowest loss first), the summary.
  EXPECT_EQ(out_,
            "sweep-00000000000a\n"
            "ID      LR   MOMENTUM  WD  SEED  STATE      EPOCH  LOSS      VAL LOSS  VAL ACC\n"
            "job-03  0.1  0         -   -     SUCCEEDED  4/4    0.166667  -         -\n"
            "job-02  0.2  0         -   -     SUCCEEDED  4/4    0.250000  -         -\n"
            "job-01  0.3  0         -   -     SUCCEEDED  4/4    0.500000  -         -\n"
            "3 succeeded, 0 failed, 0 cancelled; best job-03 by training loss 0.166667 (the "
            "members do not validate)\n");
  EXPECT_THAT(out_, Not(HasSubstr("\x1b[")));
  EXPECT_THAT(err_, IsEmpty());
}

TEST_F(SweepCommandTest, WatchExitsAsAFailedJobWhenAMemberFailed) {
  jobs_.outcomes["job-02"] = v1::JOB_STATE_FAILED;
  jobs_.outcomes["job-03"] = v1::JOB_STATE_CANCELLED;
  // A failure outranks a cancellation: 3.
  EXPECT_EQ(Run({"--lr", "0.3,0.2,0.1", "--watch"}), kExitJobFailed) << err_;
  EXPECT_EQ(OutLines().at(5),
            "1 succeeded, 1 failed, 1 cancelled; best job-01 by training loss "
            "0.500000 (the members do not validate)");
}

TEST_F(SweepCommandTest, WatchExitsAsACancelledJobWhenAMemberWasCancelled) {
  jobs_.outcomes["job-01"] = v1::JOB_STATE_CANCELLED;
  EXPECT_EQ(Run({"--lr", "0.3,0.2", "--watch"}), kExitJobCancelled) << err_;
  EXPECT_EQ(OutLines().at(4),
            "1 succeeded, 0 failed, 1 cancelled; best job-02 by training loss "
            "0.250000 (the members do not validate)");
}

TEST_F(SweepCommandTest, NameOutputPrintsTheMembersIdsAndWatchingKeepsTheExitCode) {
  EXPECT_EQ(Run({"--lr", "0.3,0.2", "-o", "name"}), kExitOk) << err_;
  EXPECT_EQ(out_, "job-01\njob-02\n");
  jobs_.outcomes["job-02"] = v1::JOB_STATE_FAILED;
  EXPECT_EQ(Run({"--lr", "0.3,0.2", "--watch", "-o", "name"}), kExitJobFailed) << err_;
  EXPECT_EQ(out_, "job-01\njob-02\n");  // no table, no summary
}

TEST_F(SweepCommandTest, WatchWithJsonPrintsTheResponseThenEachMemberAsItEnds) {
  EXPECT_EQ(Run({"--lr", "0.3,0.2", "--watch", "-o", "json"}), kExitOk) << err_;
  const std::vector<std::string> lines = absl::StrSplit(out_, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << out_;
  v1::SubmitSweepResponse response;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines[0], &response).ok());
  EXPECT_EQ(response.members_size(), 2);
  for (int i = 1; i <= 2; ++i) {
    v1::Job job;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines[i], &job).ok()) << lines[i];
    EXPECT_EQ(job.id(), absl::StrCat("job-0", i));
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  }
}

TEST_F(SweepCommandTest, MemberTheDaemonLostEndsTheWatchWithItsMessage) {
  jobs_.missing = "job-02";
  EXPECT_EQ(Run({"--lr", "0.3,0.2", "--watch"}), kExitFailure);
  EXPECT_THAT(err_, HasSubstr("job 'job-02' not found"));
  EXPECT_EQ(jobs_.Asked("job-01"), 1);  // the members before it were asked once
}

// `job watch` of a job that already ran (the history comes as epoch events before the Job that
// says how many epochs are planned): every line still reads "epoch N/M".
TEST_F(SweepCommandTest, JobWatchOfAnEndedJobNumbersEveryEpochOutOfThePlan) {
  ASSERT_EQ(Run({"--lr", "0.3"}), kExitOk) << err_;
  jobs_.history_first = true;
  EXPECT_EQ(RunTrainctl({"job", "watch", "job-01"}), kExitOk) << err_;
  const std::vector<std::string> lines = OutLines();
  ASSERT_GE(lines.size(), 4u) << out_;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lines[i].rfind(absl::StrCat("epoch ", i + 1, "/4 "), 0), 0u) << lines[i];
  }
  EXPECT_THAT(out_, HasSubstr("SUCCEEDED"));
}

TEST_F(SweepCommandTest, BadListsAreRefusedBeforeAnythingIsSent) {
  EXPECT_EQ(Run({"--lr", "0.1,,0.2"}), kExitUsage);
  EXPECT_EQ(err_,
            "trainctl: --lr: value 2 of '0.1,,0.2' is empty (give comma-separated values, e.g. "
            "0.1,0.01)\n");
  EXPECT_EQ(Run({"--lr", Count(17).substr(2), "--seed", Count(17)}), kExitUsage);
  EXPECT_EQ(err_,
            "trainctl: a sweep has at most 256 members; 16 learning rates x 17 seeds make 272\n");
  EXPECT_TRUE(jobs_.requests.empty());
  EXPECT_THAT(out_, IsEmpty());
}

}  // namespace
}  // namespace trainerd::client
