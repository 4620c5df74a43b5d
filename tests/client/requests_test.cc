// Tests for client/requests.h: the JobSpec that `submit` sends (flags, defaults, local errors),
// and what `dataset upload` reads (CSV / .npy selection, flag checks) and the header it sends.
#include "client/requests.h"
#include "client/upload_input.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "common/sha256.h"
#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// Parses "trainctl" followed by `words`; the command line must be valid.
Invocation Parse(std::vector<std::string> words) {
  words.insert(words.begin(), "trainctl");
  absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
  EXPECT_TRUE(invocation.ok()) << invocation.status();
  return invocation.ok() ? *std::move(invocation) : Invocation();
}

// `submit --dataset iris --model linear:3` followed by `more`.
Invocation Submit(const std::vector<std::string>& more = {}) {
  std::vector<std::string> words = {"submit", "--dataset", "iris", "--model", "linear:3"};
  words.insert(words.end(), more.begin(), more.end());
  return Parse(words);
}

// The message of a JobSpecFromFlags that must fail with INVALID_ARGUMENT.
std::string SpecError(const Invocation& invocation) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(invocation);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

// ---- submit --------------------------------------------------------------------------------

TEST(JobSpecFromFlagsTest, DefaultsWhenOnlyDatasetAndModelAreGiven) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dataset(), "iris");
  EXPECT_EQ(spec->model(), "linear:3");
  // No --loss: unset, for the daemon to pick by the dataset's targets.
  EXPECT_EQ(spec->loss(), v1::LOSS_UNSPECIFIED);
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.01);
  EXPECT_EQ(spec->optimizer().momentum(), 0.0);
  EXPECT_EQ(spec->batch_size(), 32);
  EXPECT_EQ(spec->epochs(), 10);
  ASSERT_TRUE(spec->has_shuffle());
  EXPECT_TRUE(spec->shuffle());
  EXPECT_FALSE(spec->has_seed());
  EXPECT_EQ(spec->device(), "");
}

TEST(JobSpecFromFlagsTest, MaxJobTimeTakesSecondsOrADurationAndRefusesTheRest) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--max-job-time", "90m"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_job_seconds(), 5400);
  spec = JobSpecFromFlags(Submit({"--max-job-time", "2.5"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_job_seconds(), 2.5);
  EXPECT_EQ(JobSpecFromFlags(Submit())->max_job_seconds(), 0);  // the daemon's default
  for (const char* bad : {"0", "-5", "nan", "inf", "1e400", "abc", "-1h"}) {
    EXPECT_THAT(SpecError(Submit({"--max-job-time", bad})), HasSubstr("--max-job-time")) << bad;
  }
}

TEST(JobSpecFromFlagsTest, EveryFlagReachesTheSpec) {
  const std::vector<std::string> words = absl::StrSplit(
      "submit --dataset mnist --model linear:16,relu,linear:10 --loss cross_entropy --optimizer "
      "sgd --lr 0.25 --momentum 0.9 --batch-size 128 --epochs 3 --seed 42 --device cuda:1 "
      "--no-shuffle",
      ' ');
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Parse(words));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dataset(), "mnist");
  EXPECT_EQ(spec->model(), "linear:16,relu,linear:10");
  EXPECT_EQ(spec->loss(), v1::LOSS_CROSS_ENTROPY);
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.25);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_EQ(spec->batch_size(), 128);
  EXPECT_EQ(spec->epochs(), 3);
  ASSERT_TRUE(spec->has_seed());
  EXPECT_EQ(spec->seed(), 42u);
  ASSERT_TRUE(spec->has_shuffle());
  EXPECT_FALSE(spec->shuffle());
  EXPECT_EQ(spec->device(), "cuda:1");
}

TEST(JobSpecFromFlagsTest, AdamOptimizerIsSelected) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--optimizer", "adam"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_ADAM);
  EXPECT_EQ(spec->optimizer().momentum(), 0.0);
}

TEST(JobSpecFromFlagsTest, CrossEntropyWithHyphenIsAccepted) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--loss", "cross-entropy"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->loss(), v1::LOSS_CROSS_ENTROPY);
}

TEST(JobSpecFromFlagsTest, ModelSpecIsSentInCanonicalForm) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(
      Parse({"submit", "--dataset", "iris", "--model", " Linear:16 , RELU,linear:3 "}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), "linear:16,relu,linear:3");
}

TEST(JobSpecFromFlagsTest, SeedZeroIsSetExplicitly) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--seed", "0"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_seed());
  EXPECT_EQ(spec->seed(), 0u);
}

TEST(JobSpecFromFlagsTest, LargestSeedIsAccepted) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--seed", "18446744073709551615"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seed(), std::numeric_limits<uint64_t>::max());
}

TEST(JobSpecFromFlagsTest, MissingDatasetIsRejected) {
  EXPECT_EQ(SpecError(Parse({"submit", "--model", "linear:1"})),
            "submit needs --dataset NAME (see 'trainctl submit --help')");
}

TEST(JobSpecFromFlagsTest, MissingModelIsRejected) {
  EXPECT_EQ(SpecError(Parse({"submit", "--dataset", "iris"})),
            "submit needs --model SPEC, e.g. --model linear:64,relu,linear:1, or --torchscript "
            "FILE");
}

TEST(JobSpecFromFlagsTest, TorchScriptReplacesModel) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Parse({"submit", "--dataset", "iris", "--torchscript", "net.pt"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), "torchscript");
}

TEST(JobSpecFromFlagsTest, ModelAndTorchScriptTogetherAreRejected) {
  EXPECT_EQ(SpecError(Parse(
                {"submit", "--dataset", "iris", "--model", "linear:1", "--torchscript", "net.pt"})),
            "give either --model SPEC or --torchscript FILE, not both");
}

TEST(JobSpecFromFlagsTest, BadDatasetNameIsRejected) {
  for (const char* bad : {"alice/..", "a b", "alice/"}) {
    const absl::StatusOr<v1::JobSpec> spec =
        JobSpecFromFlags(Parse({"submit", "--dataset", bad, "--model", "linear:1"}));
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(SpecError(Parse({"submit", "--dataset", "iris", "--model", "linear:1",
                               "--validation-dataset", "alice/x y"})),
              HasSubstr("x y"));
}

// Names are per owner: another owner's dataset is OWNER/NAME (its owner may hold '/'), sent as
// given for the daemon to resolve.
TEST(JobSpecFromFlagsTest, AnotherOwnersDatasetIsNamedWithItsOwner) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(
      Parse({"submit", "--dataset", "alice/digits", "--model", "linear:1", "--validation-dataset",
             "CN=bob/O=Acme/held-out"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dataset(), "alice/digits");
  EXPECT_EQ(spec->validation_dataset(), "CN=bob/O=Acme/held-out");
}

TEST(JobSpecFromFlagsTest, BadModelSpecIsRejectedNamingTheLayer) {
  EXPECT_THAT(SpecError(Parse({"submit", "--dataset", "iris", "--model", "linear:16,relux"})),
              StartsWith("--model: layer 2: unknown layer 'relux'"));
}

TEST(JobSpecFromFlagsTest, EmptyModelSpecIsRejected) {
  EXPECT_EQ(SpecError(Parse({"submit", "--dataset", "iris", "--model", ""})),
            "--model: the model spec is empty");
}

TEST(JobSpecFromFlagsTest, UnknownLossIsRejectedByName) {
  EXPECT_EQ(SpecError(Submit({"--loss", "hinge"})),
            "--loss: unknown loss 'hinge' (expected mse, cross_entropy, l1, huber, "
            "bce_with_logits or nll)");
}

TEST(JobSpecFromFlagsTest, UnknownOptimizerIsRejectedByName) {
  EXPECT_EQ(SpecError(Submit({"--optimizer", "lamb"})),
            "--optimizer: unknown optimizer 'lamb' (expected sgd, adam, adamw, rmsprop, nadam, "
            "radam or adagrad)");
}

TEST(JobSpecFromFlagsTest, MomentumWithAdamIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--momentum", "0.9"})),
            "--momentum applies to --optimizer sgd and rmsprop only");
}

TEST(JobSpecFromFlagsTest, DefaultsLeaveTheNewOptionsUnset) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->optimizer().nesterov());
  EXPECT_FALSE(spec->optimizer().has_weight_decay());
  EXPECT_FALSE(spec->optimizer().has_beta1());
  EXPECT_FALSE(spec->optimizer().has_beta2());
  EXPECT_FALSE(spec->optimizer().has_eps());
  EXPECT_FALSE(spec->optimizer().has_alpha());
  EXPECT_EQ(spec->huber_delta(), 0.0);
  EXPECT_EQ(spec->label_smoothing(), 0.0);
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::CONSTANT);
  EXPECT_EQ(spec->schedule().warmup_epochs(), 0);
  EXPECT_EQ(spec->clip_grad_norm(), 0.0);
}

TEST(JobSpecFromFlagsTest, EveryLossNameIsAccepted) {
  const std::pair<const char*, v1::Loss> losses[] = {
      {"mse", v1::LOSS_MSE},
      {"cross_entropy", v1::LOSS_CROSS_ENTROPY},
      {"l1", v1::LOSS_L1},
      {"huber", v1::LOSS_HUBER},
      {"bce_with_logits", v1::LOSS_BCE_WITH_LOGITS},
      {"nll", v1::LOSS_NLL},
  };
  for (const auto& [name, loss] : losses) {
    const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--loss", name}));
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->loss(), loss) << name;
  }
}

TEST(JobSpecFromFlagsTest, HuberDeltaReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--loss", "huber", "--huber-delta", "0.5"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->huber_delta(), 0.5);
}

TEST(JobSpecFromFlagsTest, HuberDeltaWithAnotherLossIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--huber-delta", "0.5"})),
            "--huber-delta applies to --loss huber only");
}

TEST(JobSpecFromFlagsTest, ZeroHuberDeltaIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--loss", "huber", "--huber-delta", "0"})),
            "--huber-delta must be > 0, got 0");
}

TEST(JobSpecFromFlagsTest, LabelSmoothingReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--loss", "cross_entropy", "--label-smoothing", "0.1"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->label_smoothing(), 0.1);
}

TEST(JobSpecFromFlagsTest, LabelSmoothingWithNllIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--loss", "nll", "--label-smoothing", "0.1"})),
            "--label-smoothing applies to --loss cross_entropy only");
}

TEST(JobSpecFromFlagsTest, LabelSmoothingOfOneIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--loss", "cross_entropy", "--label-smoothing", "1"})),
            "--label-smoothing must be in [0, 1), got 1");
}

TEST(JobSpecFromFlagsTest, ClassWeightsAndIgnoreIndexReachTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(
      Submit({"--loss", "nll", "--class-weights", "0.5, 2,1.25", "--ignore-index", "-100"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->class_weights_size(), 3);
  EXPECT_DOUBLE_EQ(spec->class_weights(0), 0.5);
  EXPECT_DOUBLE_EQ(spec->class_weights(1), 2.0);
  EXPECT_DOUBLE_EQ(spec->class_weights(2), 1.25);
  ASSERT_TRUE(spec->has_ignore_index());
  EXPECT_EQ(spec->ignore_index(), -100);
  // Unset means no row is ignored (not PyTorch's -100).
  const absl::StatusOr<v1::JobSpec> plain = JobSpecFromFlags(Submit({"--loss", "cross_entropy"}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->has_ignore_index());
  EXPECT_EQ(plain->class_weights_size(), 0);
}

TEST(JobSpecFromFlagsTest, PosWeightReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--loss", "bce_with_logits", "--pos-weight", "3"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->pos_weight_size(), 1);
  EXPECT_DOUBLE_EQ(spec->pos_weight(0), 3.0);
}

TEST(JobSpecFromFlagsTest, LossWeightsAreCheckedBeforeSending) {
  EXPECT_EQ(SpecError(Submit({"--loss", "mse", "--class-weights", "1,2"})),
            "--class-weights applies to --loss cross_entropy and nll only");
  EXPECT_EQ(SpecError(Submit({"--loss", "huber", "--ignore-index", "-1"})),
            "--ignore-index applies to --loss cross_entropy and nll only");
  EXPECT_EQ(SpecError(Submit({"--loss", "cross_entropy", "--pos-weight", "2"})),
            "--pos-weight applies to --loss bce_with_logits only");
  EXPECT_EQ(SpecError(Submit({"--loss", "cross_entropy", "--class-weights", "1,0,2"})),
            "--class-weights takes comma-separated positive numbers, one per class; '0' is not "
            "one");
  EXPECT_EQ(SpecError(Submit({"--loss", "bce_with_logits", "--pos-weight", "1,inf"})),
            "--pos-weight takes comma-separated positive numbers, one per output column; 'inf' "
            "is not one");
  EXPECT_EQ(SpecError(Submit({"--loss", "nll", "--ignore-index", "x"})),
            "--ignore-index: 'x' is not a whole number");
}

TEST(JobSpecFromFlagsTest, SgdWithNesterovAndWeightDecayReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--momentum", "0.9", "--nesterov", "--weight-decay", "0.0001"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->optimizer().nesterov());
  ASSERT_TRUE(spec->optimizer().has_weight_decay());
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 0.0001);
}

TEST(JobSpecFromFlagsTest, NesterovWithoutMomentumIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--nesterov"})), "--nesterov needs --momentum above 0");
}

TEST(JobSpecFromFlagsTest, NesterovWithAdamIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--nesterov"})),
            "--nesterov applies to --optimizer sgd only");
}

TEST(JobSpecFromFlagsTest, AdamWWithBetasAndEpsReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--optimizer", "adamw", "--beta1", "0.8", "--beta2", "0.95", "--eps",
                               "1e-6", "--weight-decay", "0"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::Optimizer& optimizer = spec->optimizer();
  EXPECT_EQ(optimizer.kind(), v1::OPTIMIZER_KIND_ADAMW);
  EXPECT_DOUBLE_EQ(optimizer.beta1(), 0.8);
  EXPECT_DOUBLE_EQ(optimizer.beta2(), 0.95);
  EXPECT_DOUBLE_EQ(optimizer.eps(), 1e-6);
  ASSERT_TRUE(optimizer.has_weight_decay());  // an explicit 0 overrides adamw's 0.01
  EXPECT_EQ(optimizer.weight_decay(), 0.0);
}

TEST(JobSpecFromFlagsTest, RmspropWithAlphaAndMomentumReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--optimizer", "rmsprop", "--alpha", "0.9", "--momentum", "0.5"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_RMSPROP);
  EXPECT_DOUBLE_EQ(spec->optimizer().alpha(), 0.9);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.5);
}

TEST(JobSpecFromFlagsTest, BetaWithSgdIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--beta1", "0.9"})),
            "--beta1 applies to --optimizer adam, adamw, nadam and radam only");
}

TEST(JobSpecFromFlagsTest, NewOptimizersAndTheirOptionsReachTheSpec) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(
      Submit({"--optimizer", "nadam", "--momentum-decay", "0.01", "--decoupled-weight-decay",
              "--weight-decay", "0.1", "--weight-decay-exclude-bias-and-norm", "--beta1", "0.8"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_NADAM);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum_decay(), 0.01);
  EXPECT_TRUE(spec->optimizer().decoupled_weight_decay());
  EXPECT_TRUE(spec->optimizer().weight_decay_exclude_bias_and_norm());
  EXPECT_DOUBLE_EQ(spec->optimizer().beta1(), 0.8);

  spec = JobSpecFromFlags(Submit({"--optimizer", "adagrad", "--lr-decay", "0.5",
                                  "--initial-accumulator-value", "0.1", "--eps", "1e-10"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_ADAGRAD);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr_decay(), 0.5);
  EXPECT_DOUBLE_EQ(spec->optimizer().initial_accumulator_value(), 0.1);
  EXPECT_FALSE(spec->optimizer().has_momentum_decay());

  spec = JobSpecFromFlags(
      Submit({"--optimizer", "adamw", "--amsgrad", "--weight-decay-exclude-bias-and-norm"}));
  ASSERT_TRUE(spec.ok()) << spec.status();  // adamw's default decay 0.01 is above 0
  EXPECT_TRUE(spec->optimizer().amsgrad());

  spec = JobSpecFromFlags(Submit({"--optimizer", "rmsprop", "--centered"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->optimizer().centered());

  spec = JobSpecFromFlags(Submit({"--optimizer", "radam", "--decoupled-weight-decay"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_KIND_RADAM);
}

TEST(JobSpecFromFlagsTest, NewOptionsWithAnOptimizerThatDoesNotTakeThemAreRejected) {
  EXPECT_EQ(SpecError(Submit({"--amsgrad"})),
            "--amsgrad applies to --optimizer adam and adamw only");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--centered"})),
            "--centered applies to --optimizer rmsprop only");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "radam", "--momentum-decay", "0.1"})),
            "--momentum-decay applies to --optimizer nadam only");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adamw", "--decoupled-weight-decay"})),
            "--decoupled-weight-decay applies to --optimizer nadam and radam only");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--lr-decay", "0.1"})),
            "--lr-decay applies to --optimizer adagrad only");
  EXPECT_EQ(SpecError(Submit({"--initial-accumulator-value", "0.1"})),
            "--initial-accumulator-value applies to --optimizer adagrad only");
  EXPECT_EQ(SpecError(Submit({"--eps", "1e-8"})),
            "--eps applies to --optimizer other than sgd only");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adagrad", "--lr-decay", "-1"})),
            "--lr-decay must be >= 0, got -1");
  EXPECT_EQ(SpecError(Submit({"--weight-decay-exclude-bias-and-norm"})),
            "--weight-decay-exclude-bias-and-norm needs a weight decay above 0 (--weight-decay; "
            "adamw's default is 0.01)");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "lion"})),
            "--optimizer: unknown optimizer 'lion' (expected sgd, adam, adamw, rmsprop, nadam, "
            "radam or adagrad)");
}

TEST(JobSpecFromFlagsTest, AlphaWithAdamIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--alpha", "0.9"})),
            "--alpha applies to --optimizer rmsprop only");
}

TEST(JobSpecFromFlagsTest, OutOfRangeOptimizerOptionsAreRejected) {
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--beta2", "1"})),
            "--beta2 must be in [0, 1), got 1");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "adam", "--eps", "0"})), "--eps must be > 0, got 0");
  EXPECT_EQ(SpecError(Submit({"--weight-decay", "-1"})), "--weight-decay must be >= 0, got -1");
  EXPECT_EQ(SpecError(Submit({"--optimizer", "rmsprop", "--alpha", "1"})),
            "--alpha must be in (0, 1), got 1");
}

TEST(JobSpecFromFlagsTest, StepScheduleReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit(
      {"--schedule", "step", "--step-epochs", "5", "--gamma", "0.5", "--warmup-epochs", "2"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::STEP);
  EXPECT_EQ(spec->schedule().step_epochs(), 5);
  EXPECT_DOUBLE_EQ(spec->schedule().gamma(), 0.5);
  EXPECT_EQ(spec->schedule().warmup_epochs(), 2);
}

TEST(JobSpecFromFlagsTest, StepScheduleWithoutStepEpochsIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--schedule", "step"})), "--schedule step needs --step-epochs N");
}

TEST(JobSpecFromFlagsTest, CosineScheduleReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--lr", "0.1", "--schedule", "cosine", "--min-lr", "0.001"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::COSINE);
  EXPECT_DOUBLE_EQ(spec->schedule().min_learning_rate(), 0.001);
}

TEST(JobSpecFromFlagsTest, MinLrAtTheLearningRateIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--lr", "0.1", "--schedule", "cosine", "--min-lr", "0.1"})),
            "--min-lr must be in [0, 0.1), got 0.1");
}

TEST(JobSpecFromFlagsTest, ScheduleOptionsOfAnotherScheduleAreRejected) {
  EXPECT_EQ(SpecError(Submit({"--schedule", "cosine", "--gamma", "0.5"})),
            "--gamma applies to --schedule step, multistep and exponential only");
  EXPECT_EQ(SpecError(Submit({"--min-lr", "0.001"})),
            "--min-lr applies to --schedule cosine, cosine_restarts and plateau only");
  EXPECT_EQ(SpecError(Submit({"--schedule", "cosine", "--milestones", "2"})),
            "--milestones applies to --schedule multistep only");
  EXPECT_EQ(SpecError(Submit({"--schedule", "step", "--step-epochs", "2", "--three-phase"})),
            "--three-phase applies to --schedule onecycle only");
  EXPECT_EQ(SpecError(Submit({"--plateau-patience", "2"})),
            "--plateau-patience applies to --schedule plateau only");
  EXPECT_EQ(SpecError(Submit({"--schedule", "exponential", "--t0", "2"})),
            "--t0 applies to --schedule cosine_restarts only");
}

TEST(JobSpecFromFlagsTest, UnknownScheduleIsRejectedByName) {
  EXPECT_EQ(SpecError(Submit({"--schedule", "linear"})),
            "--schedule: unknown schedule 'linear' (expected constant, step, multistep, "
            "exponential, cosine, cosine_restarts, onecycle or plateau)");
}

TEST(JobSpecFromFlagsTest, PerStepMultiStepReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--schedule", "multistep", "--milestones", "30,80,80", "--gamma",
                               "0.5", "--schedule-per-step", "--warmup-steps", "10"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::MULTI_STEP);
  EXPECT_THAT(spec->schedule().milestones(), testing::ElementsAre(30, 80, 80));
  EXPECT_DOUBLE_EQ(spec->schedule().gamma(), 0.5);
  EXPECT_TRUE(spec->schedule().per_step());
  EXPECT_EQ(spec->schedule().warmup_steps(), 10);
  EXPECT_EQ(SpecError(Submit({"--schedule", "multistep"})),
            "--schedule multistep needs --milestones N,N,...");
  EXPECT_EQ(SpecError(Submit({"--schedule", "multistep", "--milestones", "5,3"})),
            "--milestones: '3' is not a whole number of at least 5 (milestones are >= 1 and "
            "ascending)");
}

TEST(JobSpecFromFlagsTest, OneCycleCosineRestartsAndPlateauReachTheSpec) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(
      Submit({"--schedule", "onecycle", "--pct-start", "0.25", "--anneal-strategy", "linear",
              "--div-factor", "10", "--final-div-factor", "100", "--three-phase"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::ONE_CYCLE);
  EXPECT_DOUBLE_EQ(spec->schedule().pct_start(), 0.25);
  EXPECT_EQ(spec->schedule().anneal_strategy(), "linear");
  EXPECT_DOUBLE_EQ(spec->schedule().div_factor(), 10);
  EXPECT_DOUBLE_EQ(spec->schedule().final_div_factor(), 100);
  EXPECT_TRUE(spec->schedule().three_phase());
  spec = JobSpecFromFlags(Submit({"--lr", "0.1", "--schedule", "cosine_restarts", "--t0", "5",
                                  "--t-mult", "2", "--min-lr", "0.01"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::COSINE_WARM_RESTARTS);
  EXPECT_EQ(spec->schedule().t_0(), 5);
  EXPECT_EQ(spec->schedule().t_mult(), 2);
  EXPECT_DOUBLE_EQ(spec->schedule().min_learning_rate(), 0.01);
  spec = JobSpecFromFlags(Submit({"--schedule", "plateau", "--plateau-factor", "0.5",
                                  "--plateau-patience", "0", "--plateau-threshold", "0.01",
                                  "--plateau-cooldown", "2", "--min-lr", "0.5",
                                  "--validation-fraction", "0.2"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule().kind(), v1::Schedule::REDUCE_ON_PLATEAU);
  EXPECT_TRUE(spec->schedule().has_patience());
  EXPECT_EQ(spec->schedule().patience(), 0);
  EXPECT_DOUBLE_EQ(spec->schedule().factor(), 0.5);
  EXPECT_DOUBLE_EQ(spec->schedule().threshold(), 0.01);
  EXPECT_EQ(spec->schedule().cooldown(), 2);
  EXPECT_DOUBLE_EQ(spec->schedule().min_learning_rate(), 0.5);
}

TEST(JobSpecFromFlagsTest, WarmUpsAndPerStepAreChecked) {
  EXPECT_EQ(SpecError(Submit({"--warmup-steps", "5"})),
            "--warmup-steps needs --schedule-per-step");
  EXPECT_EQ(SpecError(Submit({"--schedule-per-step", "--warmup-epochs", "1"})),
            "--warmup-epochs: a per-step schedule warms up by steps (--warmup-steps)");
  EXPECT_EQ(SpecError(Submit({"--schedule", "onecycle", "--warmup-epochs", "1"})),
            "--schedule onecycle takes no --warmup-epochs or --warmup-steps");
  EXPECT_EQ(SpecError(Submit({"--schedule", "plateau", "--schedule-per-step"})),
            "--schedule-per-step: plateau steps once per epoch, on the validation loss");
  EXPECT_EQ(SpecError(Submit({"--schedule", "onecycle", "--anneal-strategy", "exp"})),
            "--anneal-strategy: unknown strategy 'exp' (expected cos or linear)");
}

TEST(JobSpecFromFlagsTest, ClipGradNormReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--clip-grad-norm", "1.5"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->clip_grad_norm(), 1.5);
}

TEST(JobSpecFromFlagsTest, NegativeClipGradNormIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--clip-grad-norm", "-1"})), "--clip-grad-norm must be >= 0, got -1");
}

TEST(JobSpecFromFlagsTest, NoValidationByDefault) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->validation_fraction(), 0.0);
  EXPECT_TRUE(spec->validation_dataset().empty());
  EXPECT_EQ(spec->early_stop_patience(), 0);
}

TEST(JobSpecFromFlagsTest, ValidationFractionAndPatienceReachTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--validation-fraction", "0.2", "--early-stop-patience", "5"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->validation_fraction(), 0.2);
  EXPECT_TRUE(spec->validation_dataset().empty());
  EXPECT_EQ(spec->early_stop_patience(), 5);
}

TEST(JobSpecFromFlagsTest, ValidationDatasetReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--validation-dataset", "iris-test", "--early-stop-patience", "3"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->validation_dataset(), "iris-test");
  EXPECT_EQ(spec->validation_fraction(), 0.0);
  EXPECT_EQ(spec->early_stop_patience(), 3);
}

TEST(JobSpecFromFlagsTest, ValidationFractionOfOneIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--validation-fraction", "1"})),
            "--validation-fraction must be in [0, 1), got 1");
}

TEST(JobSpecFromFlagsTest, ValidationFractionAndDatasetTogetherAreRejected) {
  EXPECT_EQ(SpecError(Submit({"--validation-fraction", "0.2", "--validation-dataset", "t"})),
            "give either --validation-fraction or --validation-dataset, not both");
}

TEST(JobSpecFromFlagsTest, EmptyValidationDatasetIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--validation-dataset="})),
            "--validation-dataset needs a dataset name");
}

TEST(JobSpecFromFlagsTest, CheckpointEveryReachesTheSpec) {
  const absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromFlags(Submit({"--epochs", "10", "--checkpoint-every", "5"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint_every(), 5);
}

TEST(JobSpecFromFlagsTest, CheckpointEveryIsOffByDefault) {
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint_every(), 0);
}

TEST(JobSpecFromFlagsTest, CheckpointEveryBeyondTheEpochsIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--epochs", "4", "--checkpoint-every", "5"})),
            "--checkpoint-every must be at most 4, got 5");
}

TEST(JobSpecFromFlagsTest, PatienceWithoutValidationIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--early-stop-patience", "4"})),
            "--early-stop-patience watches the validation loss; add --validation-fraction F or "
            "--validation-dataset NAME");
}

TEST(JobSpecFromFlagsTest, NegativePatienceIsRejected) {
  EXPECT_THAT(SpecError(Submit({"--validation-fraction", "0.2", "--early-stop-patience", "-1"})),
              HasSubstr("--early-stop-patience"));
}

TEST(JobSpecFromFlagsTest, LoopFlagsReachTheSpec) {
  const absl::StatusOr<v1::JobSpec> plain = JobSpecFromFlags(Submit());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->gradient_accumulation_steps(), 0);  // unset: 1
  EXPECT_FALSE(plain->drop_last());
  EXPECT_EQ(plain->early_stop_min_delta(), 0.0);
  EXPECT_EQ(plain->early_stop_metric(), v1::EARLY_STOP_METRIC_UNSPECIFIED);
  const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(
      Submit({"--gradient-accumulation-steps", "4", "--drop-last", "--validation-fraction", "0.2",
              "--early-stop-patience", "3", "--early-stop-min-delta", "0.01",
              "--early-stop-metric", "accuracy", "--loss", "cross_entropy"}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->gradient_accumulation_steps(), 4);
  EXPECT_TRUE(spec->drop_last());
  EXPECT_DOUBLE_EQ(spec->early_stop_min_delta(), 0.01);
  EXPECT_EQ(spec->early_stop_metric(), v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY);
}

TEST(JobSpecFromFlagsTest, LoopFlagsOutOfRangeOrWithoutWhatTheyNeedAreRejected) {
  EXPECT_THAT(SpecError(Submit({"--gradient-accumulation-steps", "0"})),
              HasSubstr("--gradient-accumulation-steps"));
  EXPECT_EQ(SpecError(Submit({"--early-stop-min-delta", "0.1"})),
            "--early-stop-min-delta applies to early stopping (--early-stop-patience N) only");
  EXPECT_EQ(SpecError(Submit({"--early-stop-metric", "accuracy"})),
            "--early-stop-metric applies to early stopping (--early-stop-patience N) or a "
            "sweep's halving (--halving-min-epochs N) only");
  EXPECT_EQ(SpecError(Submit({"--validation-fraction", "0.2", "--early-stop-patience", "2",
                              "--early-stop-min-delta", "-1"})),
            "--early-stop-min-delta must be >= 0, got -1");
  EXPECT_EQ(SpecError(Submit({"--validation-fraction", "0.2", "--early-stop-patience", "2",
                              "--early-stop-metric", "f1"})),
            "--early-stop-metric: unknown metric 'f1' (expected loss or accuracy)");
  EXPECT_EQ(SpecError(Submit({"--validation-fraction", "0.2", "--early-stop-patience", "2",
                              "--early-stop-metric", "accuracy", "--loss", "mse"})),
            "--early-stop-metric accuracy needs a class loss (--loss cross_entropy or nll)");
}

TEST(JobSpecFromFlagsTest, ModelFromReachesTheSpecAndBestNeedsValidation) {
  EXPECT_EQ(JobSpecFromFlags(Submit())->model_from(), v1::MODEL_FROM_UNSPECIFIED);
  const absl::StatusOr<v1::JobSpec> last = JobSpecFromFlags(Submit({"--model-from", "last"}));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->model_from(), v1::MODEL_FROM_LAST);
  const absl::StatusOr<v1::JobSpec> best =
      JobSpecFromFlags(Submit({"--validation-fraction", "0.2", "--model-from", "best"}));
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->model_from(), v1::MODEL_FROM_BEST);
  EXPECT_EQ(SpecError(Submit({"--model-from", "best"})),
            "--model-from best hands back the best validation epoch's weights; add "
            "--validation-fraction F or --validation-dataset NAME");
  EXPECT_EQ(SpecError(Submit({"--model-from", "first"})),
            "--model-from: unknown choice 'first' (expected best or last)");
}

TEST(JobSpecFromFlagsTest, MomentumOfOneIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--momentum", "1"})), "--momentum must be in [0, 1), got 1");
}

TEST(JobSpecFromFlagsTest, NegativeMomentumIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--momentum", "-0.5"})), "--momentum must be in [0, 1), got -0.5");
}

TEST(JobSpecFromFlagsTest, ZeroLearningRateIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--lr", "0"})), "--lr must be > 0, got 0");
}

TEST(JobSpecFromFlagsTest, NonNumericLearningRateIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--lr", "fast"})), "--lr: 'fast' is not a number");
}

TEST(JobSpecFromFlagsTest, ZeroBatchSizeIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--batch-size", "0"})), "--batch-size must be at least 1, got 0");
}

// The daemon's limits (common/job_limits.h), checked before anything is sent.
TEST(JobSpecFromFlagsTest, EpochsBeyondTheDaemonsLimitAreRejected) {
  EXPECT_EQ(SpecError(Submit({"--epochs", "2147483648"})),
            "--epochs must be at most 1000000, got 2147483648");
  EXPECT_EQ(SpecError(Submit({"--epochs", "1000001"})),
            "--epochs must be at most 1000000, got 1000001");
}

TEST(JobSpecFromFlagsTest, TooManyCheckpointsAreRejected) {
  EXPECT_THAT(SpecError(Submit({"--epochs", "5000", "--checkpoint-every", "1"})),
              StartsWith("a checkpoint every 1 epochs over 5000 epochs writes 5000 checkpoints; at "
                         "most 1000 are allowed"));
}

TEST(JobSpecFromFlagsTest, NegativeSeedIsRejected) {
  EXPECT_THAT(SpecError(Submit({"--seed", "-3"})),
              StartsWith("--seed: '-3' is not a whole number"));
}

TEST(JobSpecFromFlagsTest, EmptyDeviceIsRejected) {
  EXPECT_EQ(SpecError(Submit({"--device="})), "--device needs a device, e.g. cpu, cuda or cuda:0");
}

// ---- dataset upload: flags -----------------------------------------------------------------

// `dataset upload data FILE` followed by `more`.
Invocation Upload(const std::string& file, const std::vector<std::string>& more = {}) {
  std::vector<std::string> words = {"dataset", "upload", "data", file};
  words.insert(words.end(), more.begin(), more.end());
  return Parse(words);
}

// The daemon's header checks run before anything is sent: a name it would refuse, and shapes
// whose byte size overflows (a table whose vectors were never filled, as an NPY header may
// declare).
TEST(CheckUploadAgainstLimitsTest, RefusesWhatTheDaemonWouldBeforeSending) {
  Table table;
  table.feature_shape = {4};
  table.rows = 10;
  EXPECT_TRUE(CheckUploadAgainstLimits("iris", table).ok());
  EXPECT_THAT(CheckUploadAgainstLimits("../iris", table).message(), HasSubstr("is invalid"));
  table.feature_shape = {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31};
  EXPECT_THAT(CheckUploadAgainstLimits("iris", table).message(), HasSubstr("overflow"));
}

TEST(UploadInputFromFlagsTest, CsvFileWithDefaults) {
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(Upload("iris.csv"));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->features_path, "iris.csv");
  EXPECT_FALSE(input->npy);
  EXPECT_FALSE(input->targets_path.has_value());
  EXPECT_EQ(input->target_columns, 1);
  EXPECT_EQ(input->target_dtype, TargetDType::kFloat32);
}

TEST(UploadInputFromFlagsTest, NpyExtensionSelectsNpyWhateverItsCase) {
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(Upload("IMAGES.NPY"));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_TRUE(input->npy);
}

TEST(UploadInputFromFlagsTest, FileWithoutExtensionIsCsv) {
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(Upload("data"));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_FALSE(input->npy);
}

TEST(UploadInputFromFlagsTest, TargetsFileIsTakenWithNpyFeatures) {
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(
      Upload("images.npy", {"--targets", "labels.npy", "--target-dtype", "int64"}));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_TRUE(input->npy);
  EXPECT_EQ(input->targets_path, std::optional<std::string>("labels.npy"));
  EXPECT_EQ(input->target_dtype, TargetDType::kInt64);
}

TEST(UploadInputFromFlagsTest, TargetColumnsAreTaken) {
  const absl::StatusOr<UploadInput> input =
      UploadInputFromFlags(Upload("data.csv", {"--target-columns", "3"}));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->target_columns, 3);
}

TEST(UploadInputFromFlagsTest, TargetsWithCsvFeaturesAreRejected) {
  const absl::StatusOr<UploadInput> input =
      UploadInputFromFlags(Upload("data.csv", {"--targets", "labels.npy"}));
  EXPECT_EQ(input.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(input.status().message(),
            "--targets needs the features as a .npy file too; 'data.csv' is not");
}

TEST(UploadInputFromFlagsTest, TargetsWithTargetColumnsAreRejected) {
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(
      Upload("images.npy", {"--targets", "labels.npy", "--target-columns", "1"}));
  EXPECT_EQ(input.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(input.status().message()),
              StartsWith("--target-columns does not apply with --targets"));
}

TEST(UploadInputFromFlagsTest, Int64TargetsWithTwoColumnsAreRejected) {
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(
      Upload("data.csv", {"--target-dtype", "int64", "--target-columns", "2"}));
  EXPECT_EQ(input.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(input.status().message(),
            "--target-dtype int64 takes one target column (a class index), got --target-columns 2");
}

TEST(UploadInputFromFlagsTest, UnknownTargetDtypeIsRejectedByName) {
  const absl::StatusOr<UploadInput> input =
      UploadInputFromFlags(Upload("data.csv", {"--target-dtype", "float16"}));
  EXPECT_EQ(input.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(input.status().message(),
            "--target-dtype: unknown dtype 'float16' (expected float32 or int64)");
}

TEST(UploadInputFromFlagsTest, ZeroTargetColumnsAreRejected) {
  const absl::StatusOr<UploadInput> input =
      UploadInputFromFlags(Upload("data.csv", {"--target-columns", "0"}));
  EXPECT_EQ(input.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(input.status().message(), "--target-columns must be at least 1, got 0");
}

// ---- dataset upload: reading the files and the header --------------------------------------

// The raw little-endian bytes of `values`.
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A .npy version 1.0 file, the way numpy/lib/format.py writes one.
std::string MakeNpy(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  return file + header + data;
}

// Writes files under the test's temporary directory (named per process and test, since ctest
// may run tests in parallel) and removes them at the end.
class UploadFilesTest : public ::testing::Test {
 protected:
  ~UploadFilesTest() override {
    for (const std::string& path : written_) std::remove(path.c_str());
  }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = ::testing::TempDir() + "client_test_" + std::to_string(getpid()) +
                             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                             "_" + name;
    std::ofstream(path, std::ios::binary) << contents;
    written_.push_back(path);
    return path;
  }

 private:
  std::vector<std::string> written_;
};

TEST_F(UploadFilesTest, CsvHeaderCarriesShapeDtypeRowsAndPayloadDigest) {
  const std::string path = Write("data.csv", "x1,x2,y\n1,2,3\n4,5.5,-6\n");
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(Upload(path));
  ASSERT_TRUE(input.ok()) << input.status();
  const absl::StatusOr<Table> table = ReadUploadInput(*input);
  ASSERT_TRUE(table.ok()) << table.status();

  // The payload as datasets.proto defines it: all features, then all targets, little-endian.
  const std::string expected_payload =
      Bytes<float>({1.0f, 2.0f, 4.0f, 5.5f}) + Bytes<float>({3.0f, -6.0f});
  const std::string payload = EncodePayload(*table);
  EXPECT_EQ(payload, expected_payload);

  const v1::DatasetHeader header = MakeDatasetHeader("pairs", *table, Sha256Hex(payload));
  EXPECT_EQ(header.name(), "pairs");
  EXPECT_THAT(header.feature_shape(), ElementsAre(2));
  EXPECT_THAT(header.target_shape(), ElementsAre(1));
  EXPECT_EQ(header.target_dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(header.row_count(), 2);
  EXPECT_EQ(header.sha256(), Sha256Hex(expected_payload));
  EXPECT_EQ(header.sha256().size(), 64u);
}

TEST_F(UploadFilesTest, CsvWithInt64TargetsGivesScalarClassTargets) {
  const std::string path = Write("classes.csv", "1,2,0\n3,4,2\n5,6,1\n");
  const absl::StatusOr<UploadInput> input =
      UploadInputFromFlags(Upload(path, {"--target-dtype", "int64"}));
  ASSERT_TRUE(input.ok()) << input.status();
  const absl::StatusOr<Table> table = ReadUploadInput(*input);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->targets_i64, ElementsAre(0, 2, 1));

  const v1::DatasetHeader header = MakeDatasetHeader("classes", *table, "");
  EXPECT_THAT(header.feature_shape(), ElementsAre(2));
  EXPECT_THAT(header.target_shape(), IsEmpty());
  EXPECT_EQ(header.target_dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(header.row_count(), 3);
}

TEST_F(UploadFilesTest, CsvWithTwoTargetColumnsSplitsTheLastTwo) {
  const std::string path = Write("two.csv", "1,2,3,4\n5,6,7,8\n");
  const absl::StatusOr<Table> table =
      ReadUploadInput(*UploadInputFromFlags(Upload(path, {"--target-columns", "2"})));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->target_shape, ElementsAre(2));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, 4.0f, 7.0f, 8.0f));
}

TEST_F(UploadFilesTest, BadCsvValueNamesFileAndLine) {
  const std::string path = Write("bad.csv", "1,2\n3,abc\n");
  const absl::StatusOr<Table> table = ReadUploadInput(*UploadInputFromFlags(Upload(path)));
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()), StartsWith(path));
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("line 2"));
}

TEST_F(UploadFilesTest, MissingCsvFileIsNotFoundNamingThePath) {
  const std::string path = ::testing::TempDir() + "client_test_no_such_dir/missing.csv";
  const absl::StatusOr<Table> table = ReadUploadInput(*UploadInputFromFlags(Upload(path)));
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.status().message(), "cannot open '" + path + "': No such file or directory");
}

TEST_F(UploadFilesTest, TwoDimensionalNpySplitsTrailingTargetColumn) {
  const std::string path =
      Write("table.npy", MakeNpy("<f4", "(2, 3)", Bytes<float>({1, 2, 3, 4, 5, 6})));
  const absl::StatusOr<UploadInput> input = UploadInputFromFlags(Upload(path));
  ASSERT_TRUE(input.ok()) << input.status();
  ASSERT_TRUE(input->npy);
  const absl::StatusOr<Table> table = ReadUploadInput(*input);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 4.0f, 5.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, 6.0f));

  const v1::DatasetHeader header = MakeDatasetHeader("table", *table, "");
  EXPECT_THAT(header.feature_shape(), ElementsAre(2));
  EXPECT_THAT(header.target_shape(), ElementsAre(1));
  EXPECT_EQ(header.target_dtype(), v1::DTYPE_FLOAT32);
}

TEST_F(UploadFilesTest, NpyFeaturesWithSeparateInt64Targets) {
  const std::string features =
      Write("images.npy",
            MakeNpy("<f4", "(3, 2, 2)", Bytes<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})));
  const std::string targets =
      Write("labels.npy", MakeNpy("<i8", "(3,)", Bytes<int64_t>({2, 0, 1})));
  const absl::StatusOr<UploadInput> input =
      UploadInputFromFlags(Upload(features, {"--targets", targets, "--target-dtype", "int64"}));
  ASSERT_TRUE(input.ok()) << input.status();
  const absl::StatusOr<Table> table = ReadUploadInput(*input);
  ASSERT_TRUE(table.ok()) << table.status();

  const v1::DatasetHeader header = MakeDatasetHeader("images", *table, "");
  EXPECT_THAT(header.feature_shape(), ElementsAre(2, 2));
  EXPECT_THAT(header.target_shape(), IsEmpty());
  EXPECT_EQ(header.target_dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(header.row_count(), 3);
  EXPECT_EQ(EncodePayload(*table),
            Bytes<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) + Bytes<int64_t>({2, 0, 1}));
}

TEST_F(UploadFilesTest, NpyRowMismatchNamesBothFiles) {
  const std::string features =
      Write("f.npy", MakeNpy("<f4", "(3, 2)", Bytes<float>({0, 1, 2, 3, 4, 5})));
  const std::string targets = Write("t.npy", MakeNpy("<i8", "(2,)", Bytes<int64_t>({0, 1})));
  const absl::StatusOr<Table> table = ReadUploadInput(
      *UploadInputFromFlags(Upload(features, {"--targets", targets, "--target-dtype", "int64"})));
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()),
              StartsWith(features + " and " + targets + ": "));
}

TEST_F(UploadFilesTest, TorchScriptFileBytesAreReadAsTheyAre) {
  const std::string bytes("PK\x03\x04\0binary", 11);
  const std::string path = Write("net.pt", bytes);
  const absl::StatusOr<std::string> read =
      ReadTorchScriptFlag(Parse({"submit", "--dataset", "iris", "--torchscript", path}));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
}

TEST_F(UploadFilesTest, NoTorchScriptFlagReadsNothing) {
  const absl::StatusOr<std::string> read =
      ReadTorchScriptFlag(Parse({"submit", "--dataset", "iris", "--model", "linear:1"}));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->empty());
}

TEST_F(UploadFilesTest, EmptyTorchScriptFileIsRejected) {
  const std::string path = Write("empty.pt", "");
  const absl::StatusOr<std::string> read =
      ReadTorchScriptFlag(Parse({"submit", "--dataset", "iris", "--torchscript", path}));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("is empty"));
}

TEST_F(UploadFilesTest, MissingTorchScriptFileIsNotFound) {
  const absl::StatusOr<std::string> read = ReadTorchScriptFlag(
      Parse({"submit", "--dataset", "iris", "--torchscript", "/no/such/net.pt"}));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
}

// --torchscript FILE takes an exported program too: a zip holding <name>/models/model.json,
// which then travels as SubmitJobRequest.exported_program.
TEST(IsExportedProgramFileTest, TellsAPt2FromATorchScriptArchiveByContent) {
  EXPECT_TRUE(IsExportedProgramFile(std::string("PK\x03\x04....net/models/model.json....", 33)));
  EXPECT_FALSE(IsExportedProgramFile(std::string("PK\x03\x04....net/data.pkl....code/", 29)));
  EXPECT_FALSE(IsExportedProgramFile("net/models/model.json"));  // not a zip
  EXPECT_FALSE(IsExportedProgramFile(""));
}

TEST(JobSpecFromFlagsTest, PrecisionReachesTheSpecAndDefaultsToFp32) {
  const absl::StatusOr<v1::JobSpec> plain = JobSpecFromFlags(Submit());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->precision(), v1::PRECISION_FP32);
  for (const auto& [flag, precision] :
       std::vector<std::pair<std::string, v1::Precision>>{{"fp32", v1::PRECISION_FP32},
                                                          {"bf16", v1::PRECISION_BF16},
                                                          {"fp16", v1::PRECISION_FP16}}) {
    const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--precision", flag}));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->precision(), precision) << flag;
  }
}

TEST(JobSpecFromFlagsTest, UnknownPrecisionNamesTheChoices) {
  EXPECT_EQ(SpecError(Submit({"--precision", "fp8"})),
            "--precision: unknown precision 'fp8' (expected fp32, bf16 or fp16)");
}

TEST(JobSpecFromFlagsTest, PriorityReachesTheSpecAndDefaultsToNormal) {
  const absl::StatusOr<v1::JobSpec> plain = JobSpecFromFlags(Submit());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->priority(), v1::JOB_PRIORITY_NORMAL);
  for (const auto& [flag, priority] : std::vector<std::pair<std::string, v1::JobPriority>>{
           {"high", v1::JOB_PRIORITY_HIGH}, {"low", v1::JOB_PRIORITY_LOW}}) {
    const absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(Submit({"--priority", flag}));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->priority(), priority) << flag;
  }
  EXPECT_EQ(SpecError(Submit({"--priority", "urgent"})),
            "--priority: unknown priority 'urgent' (expected high, normal or low)");
}

}  // namespace
}  // namespace trainerd::client
