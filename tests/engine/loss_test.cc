// Tests for server/engine/loss.h: every loss's value and gradient on a tiny batch against a
// reference written out by hand in double precision, and CheckLoss's rejections.
#include "server/engine/training/loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

// fp32 against a float64 reference: relative error (in the L2 norm for vectors) below this.
constexpr double kTolerance = 1e-5;

constexpr int64_t kRows = 4;

// A 4 x 3 batch of outputs (logits, or log-probabilities for nll), C order.
const std::vector<double> kOutput = {0.5,  -1.25, 2.0,    //
                                     1.5,  0.25,  -0.75,  //
                                     -2.0, 3.0,   0.125,  //
                                     0.75, -0.5,  1.0};
// Float targets of the same shape (in [0, 1], so that bce_with_logits can use them too). The
// differences output - target cover both sides of huber's delta and both signs.
const std::vector<double> kFloatTargets = {0.0, 1.0,  0.25,  //
                                           1.0, 0.5,  0.0,   //
                                           0.5, 0.0,  1.0,   //
                                           0.2, 0.75, 0.9};
const std::vector<int64_t> kClassTargets = {2, 0, 1, 2};

double RelativeError(const torch::Tensor& actual, const std::vector<double>& expected) {
  torch::Tensor a = actual.detach().to(torch::kFloat64).contiguous().view({-1});
  EXPECT_EQ(a.numel(), static_cast<int64_t>(expected.size()));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = a[static_cast<int64_t>(i)].item<double>() - expected[i];
    diff += d * d;
    norm += expected[i] * expected[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// The loss's value and its gradient with respect to the outputs, in fp32.
struct LossAndGradient {
  torch::Tensor loss;
  torch::Tensor grad;
};

LossAndGradient Compute(const JobSpec& spec, const torch::Tensor& targets) {
  torch::Tensor output = torch::tensor(kOutput, torch::kFloat64)
                             .to(torch::kFloat32)
                             .view({kRows, 3})
                             .set_requires_grad(true);
  torch::Tensor loss = ComputeLoss(spec, output, targets);
  loss.backward();
  return {loss, output.grad()};
}

torch::Tensor FloatTargets() {
  return torch::tensor(kFloatTargets, torch::kFloat64).to(torch::kFloat32).view({kRows, 3});
}

torch::Tensor ClassTargets() {
  // As the dataset holds them: one int64 index per row, shaped [rows, 1].
  return torch::tensor(kClassTargets, torch::kInt64).view({kRows, 1});
}

JobSpec SpecFor(LossKind loss) {
  JobSpec spec;
  spec.loss = loss;
  return spec;
}

// An element-wise loss: reference value mean(f(o - t)) and gradient f'(o - t) / n, where the
// per-element function and its derivative are written out in `element`.
template <typename Element>
void ExpectElementwiseLossMatches(const JobSpec& spec, Element element) {
  const double n = static_cast<double>(kOutput.size());
  double loss = 0;
  std::vector<double> grad(kOutput.size());
  for (size_t i = 0; i < kOutput.size(); ++i) {
    double value = 0, slope = 0;
    element(kOutput[i], kFloatTargets[i], &value, &slope);
    loss += value / n;
    grad[i] = slope / n;
  }
  LossAndGradient got = Compute(spec, FloatTargets());
  EXPECT_LT(RelativeError(got.loss, {loss}), kTolerance);
  EXPECT_LT(RelativeError(got.grad, grad), kTolerance);
}

double Sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(LossTest, MseMatchesFloat64Reference) {
  ExpectElementwiseLossMatches(SpecFor(LossKind::kMse),
                               [](double o, double t, double* v, double* d) {
                                 *v = (o - t) * (o - t);
                                 *d = 2 * (o - t);
                               });
}

TEST(LossTest, L1MatchesFloat64Reference) {
  ExpectElementwiseLossMatches(SpecFor(LossKind::kL1),
                               [](double o, double t, double* v, double* d) {
                                 *v = std::fabs(o - t);
                                 *d = Sign(o - t);
                               });
}

TEST(LossTest, HuberMatchesFloat64ReferenceOnBothSidesOfDelta) {
  JobSpec spec = SpecFor(LossKind::kHuber);
  spec.huber_delta = 0.8;
  const double delta = spec.huber_delta;
  ExpectElementwiseLossMatches(spec, [delta](double o, double t, double* v, double* d) {
    const double r = o - t;
    if (std::fabs(r) <= delta) {
      *v = 0.5 * r * r;
      *d = r;
    } else {
      *v = delta * (std::fabs(r) - 0.5 * delta);
      *d = delta * Sign(r);
    }
  });
}

TEST(LossTest, BceWithLogitsMatchesFloat64Reference) {
  ExpectElementwiseLossMatches(SpecFor(LossKind::kBceWithLogits),
                               [](double x, double t, double* v, double* d) {
                                 const double p = Sigmoid(x);
                                 *v = -(t * std::log(p) + (1 - t) * std::log(1 - p));
                                 *d = p - t;
                               });
}

// Softmax cross-entropy with label smoothing eps over C classes: the target distribution is
// q_c = (1 - eps) [c == y] + eps / C; loss = mean over rows of -sum_c q_c log softmax(x)_c and
// its gradient (softmax(x) - q) / rows.
void ExpectCrossEntropyMatches(double smoothing) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.label_smoothing = smoothing;
  const int classes = 3;
  double loss = 0;
  std::vector<double> grad(kOutput.size());
  for (int64_t r = 0; r < kRows; ++r) {
    const double* x = &kOutput[r * classes];
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(x[c]);
    for (int c = 0; c < classes; ++c) {
      const double q = (1 - smoothing) * (c == kClassTargets[r] ? 1 : 0) + smoothing / classes;
      const double log_p = x[c] - std::log(sum);
      loss -= q * log_p / kRows;
      grad[r * classes + c] = (std::exp(log_p) - q) / kRows;
    }
  }
  LossAndGradient got = Compute(spec, ClassTargets());
  EXPECT_LT(RelativeError(got.loss, {loss}), kTolerance);
  EXPECT_LT(RelativeError(got.grad, grad), kTolerance);
}

TEST(LossTest, CrossEntropyMatchesFloat64Reference) { ExpectCrossEntropyMatches(0.0); }

TEST(LossTest, CrossEntropyWithLabelSmoothingMatchesFloat64Reference) {
  ExpectCrossEntropyMatches(0.2);
}

TEST(LossTest, NllMatchesFloat64Reference) {
  // nll takes the outputs as log-probabilities: loss = -mean_r x[r, y_r].
  const int classes = 3;
  double loss = 0;
  std::vector<double> grad(kOutput.size(), 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    loss -= kOutput[r * classes + kClassTargets[r]] / kRows;
    grad[r * classes + kClassTargets[r]] = -1.0 / kRows;
  }
  LossAndGradient got = Compute(SpecFor(LossKind::kNll), ClassTargets());
  EXPECT_LT(RelativeError(got.loss, {loss}), kTolerance);
  EXPECT_LT(RelativeError(got.grad, grad), kTolerance);
}

// ---- CheckLoss ------------------------------------------------------------------------------

DatasetMeta FloatDataset(std::vector<int64_t> target_shape) {
  DatasetMeta meta;
  meta.name = "floats";
  meta.feature_shape = {4};
  meta.target_shape = std::move(target_shape);
  meta.target_dtype = TargetDType::kFloat32;
  meta.rows = 8;
  return meta;
}

DatasetMeta ClassDataset(int64_t min, int64_t max) {
  DatasetMeta meta;
  meta.name = "classes";
  meta.feature_shape = {4};
  meta.target_shape = {};
  meta.target_dtype = TargetDType::kInt64;
  meta.rows = 8;
  meta.target_min = min;
  meta.target_max = max;
  return meta;
}

JobSpec SpecWithModel(LossKind loss, const std::string& model) {
  JobSpec spec = SpecFor(loss);
  spec.model = model;
  return spec;
}

TEST(CheckLossTest, EveryLossAcceptsItsTargets) {
  for (LossKind loss :
       {LossKind::kMse, LossKind::kL1, LossKind::kHuber, LossKind::kBceWithLogits}) {
    EXPECT_TRUE(CheckLoss(SpecWithModel(loss, "linear:2"), {2}, FloatDataset({2})).ok())
        << LossKindName(loss);
  }
  for (LossKind loss : {LossKind::kCrossEntropy, LossKind::kNll}) {
    EXPECT_TRUE(CheckLoss(SpecWithModel(loss, "linear:3"), {3}, ClassDataset(0, 2)).ok())
        << LossKindName(loss);
  }
}

TEST(CheckLossTest, FloatLossesRejectClassTargets) {
  for (LossKind loss : {LossKind::kL1, LossKind::kHuber, LossKind::kBceWithLogits}) {
    absl::Status status = CheckLoss(SpecWithModel(loss, "linear:1"), {1}, ClassDataset(0, 2));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("loss ", LossKindName(loss), " needs float32 targets")));
  }
}

TEST(CheckLossTest, L1RejectsOutputShapedUnlikeTargets) {
  absl::Status status = CheckLoss(SpecWithModel(LossKind::kL1, "linear:3"), {3}, FloatDataset({2}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("loss l1 compares the model's output with the targets, "
                                          "but model 'linear:3' outputs 3 per row"));
}

TEST(CheckLossTest, NllRejectsFloatTargets) {
  absl::Status status =
      CheckLoss(SpecWithModel(LossKind::kNll, "linear:3"), {3}, FloatDataset({1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("loss nll needs int64 class targets"));
}

TEST(CheckLossTest, NllRejectsClassIndicesBeyondTheOutputs) {
  absl::Status status =
      CheckLoss(SpecWithModel(LossKind::kNll, "linear:3"), {3}, ClassDataset(0, 3));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("has class indices 0..3 but model 'linear:3' outputs 3"));
}

TEST(CheckLossTest, NonPositiveHuberDeltaIsRejected) {
  JobSpec spec = SpecWithModel(LossKind::kHuber, "linear:1");
  spec.huber_delta = 0;
  EXPECT_THAT(CheckLoss(spec, {1}, FloatDataset({1})).message(),
              HasSubstr("huber delta must be a positive number; got 0"));
}

TEST(CheckLossTest, HuberDeltaWithAnotherLossIsRejected) {
  JobSpec spec = SpecWithModel(LossKind::kMse, "linear:1");
  spec.huber_delta = 2;
  EXPECT_THAT(CheckLoss(spec, {1}, FloatDataset({1})).message(),
              HasSubstr("huber delta applies to loss huber only; loss mse does not take it"));
}

TEST(CheckLossTest, LabelSmoothingOfOneIsRejected) {
  JobSpec spec = SpecWithModel(LossKind::kCrossEntropy, "linear:3");
  spec.label_smoothing = 1;
  EXPECT_THAT(CheckLoss(spec, {3}, ClassDataset(0, 2)).message(),
              HasSubstr("label smoothing must be in [0, 1); got 1"));
}

TEST(CheckLossTest, LabelSmoothingWithNllIsRejected) {
  JobSpec spec = SpecWithModel(LossKind::kNll, "linear:3");
  spec.label_smoothing = 0.1;
  EXPECT_THAT(
      CheckLoss(spec, {3}, ClassDataset(0, 2)).message(),
      HasSubstr("label smoothing applies to loss cross_entropy only; loss nll does not take it"));
}

// --- class_weights, ignore_index, pos_weight: LibTorch's own functional losses in float64 are the
// reference (the same options, reduction 'mean'), value and gradient.

const std::vector<double> kClassWeights = {0.5, 2.0, 1.25};
// kClassTargets with rows 1 and 3 ignored (-100, PyTorch's usual marker).
const std::vector<int64_t> kIgnoringTargets = {2, -100, 1, -100};

torch::Tensor Classes(const std::vector<int64_t>& targets) {
  return torch::tensor(targets, torch::kInt64);
}

// The float64 reference of F::cross_entropy / F::nll_loss with the options, and its gradient.
LossAndGradient Reference(LossKind loss, const torch::Tensor& targets, double smoothing,
                          const std::vector<double>* weights, std::optional<int64_t> ignore) {
  namespace F = torch::nn::functional;
  torch::Tensor output =
      torch::tensor(kOutput, torch::kFloat64).view({kRows, 3}).set_requires_grad(true);
  torch::Tensor result;
  if (loss == LossKind::kCrossEntropy) {
    auto options = F::CrossEntropyFuncOptions().label_smoothing(smoothing);
    if (weights != nullptr) options.weight(torch::tensor(*weights, torch::kFloat64));
    if (ignore.has_value()) options.ignore_index(*ignore);
    result = F::cross_entropy(output, targets, options);
  } else {
    auto options = F::NLLLossFuncOptions();
    if (weights != nullptr) options.weight(torch::tensor(*weights, torch::kFloat64));
    if (ignore.has_value()) options.ignore_index(*ignore);
    result = F::nll_loss(output, targets, options);
  }
  result.backward();
  return {result, output.grad()};
}

std::vector<double> Values(const torch::Tensor& t) {
  torch::Tensor flat = t.detach().to(torch::kFloat64).contiguous().view({-1});
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

void ExpectMatchesReference(const JobSpec& spec, const std::vector<int64_t>& targets) {
  const LossAndGradient got = Compute(spec, Classes(targets));
  const LossAndGradient want =
      Reference(spec.loss, Classes(targets), spec.label_smoothing,
                spec.class_weights.empty() ? nullptr : &spec.class_weights, spec.ignore_index);
  EXPECT_LT(RelativeError(got.loss, Values(want.loss)), kTolerance)
      << got.loss.item<double>() << " vs " << want.loss.item<double>();
  EXPECT_LT(RelativeError(got.grad, Values(want.grad)), kTolerance);
}

TEST(LossOptionsTest, CrossEntropyWithClassWeightsMatchesLibTorch) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.class_weights = kClassWeights;
  ExpectMatchesReference(spec, kClassTargets);
  // The weighted mean differs from the plain one on these rows (the weights matter).
  const double plain =
      Compute(SpecFor(LossKind::kCrossEntropy), Classes(kClassTargets)).loss.item<double>();
  EXPECT_GT(std::fabs(Compute(spec, Classes(kClassTargets)).loss.item<double>() - plain), 1e-3);
}

TEST(LossOptionsTest, CrossEntropyWithClassWeightsAndLabelSmoothingMatchesLibTorch) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.class_weights = kClassWeights;
  spec.label_smoothing = 0.2;
  ExpectMatchesReference(spec, kClassTargets);
}

TEST(LossOptionsTest, CrossEntropyIgnoringRowsMatchesLibTorch) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.ignore_index = -100;
  ExpectMatchesReference(spec, kIgnoringTargets);
  // The mean is over the two rows kept: the same as those rows alone.
  const torch::Tensor kept_output = torch::tensor(kOutput, torch::kFloat64)
                                        .to(torch::kFloat32)
                                        .view({kRows, 3})
                                        .index_select(0, torch::tensor({0, 2}));
  const double alone =
      ComputeLoss(SpecFor(LossKind::kCrossEntropy), kept_output, Classes({2, 1})).item<double>();
  EXPECT_NEAR(Compute(spec, Classes(kIgnoringTargets)).loss.item<double>(), alone, 1e-6);
}

TEST(LossOptionsTest, CrossEntropyIgnoringRowsWithWeightsAndSmoothingMatchesLibTorch) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.class_weights = kClassWeights;
  spec.label_smoothing = 0.1;
  spec.ignore_index = -100;
  ExpectMatchesReference(spec, kIgnoringTargets);
}

TEST(LossOptionsTest, IgnoreIndexMayBeAClass) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.ignore_index = 2;  // rows 0 and 3 (class 2) are ignored
  spec.class_weights = kClassWeights;
  ExpectMatchesReference(spec, kClassTargets);
}

TEST(LossOptionsTest, NllWithClassWeightsAndIgnoreIndexMatchesLibTorch) {
  JobSpec spec = SpecFor(LossKind::kNll);
  spec.class_weights = kClassWeights;
  ExpectMatchesReference(spec, kClassTargets);
  spec.ignore_index = -100;
  ExpectMatchesReference(spec, kIgnoringTargets);
}

TEST(LossOptionsTest, BatchOfOnlyIgnoredRowsIsZeroWithZeroGradients) {
  const std::vector<int64_t> all_ignored = {-1, -1, -1, -1};
  for (LossKind loss : {LossKind::kCrossEntropy, LossKind::kNll}) {
    JobSpec spec = SpecFor(loss);
    spec.ignore_index = -1;
    if (loss == LossKind::kCrossEntropy) spec.label_smoothing = 0.1;
    for (bool weighted : {false, true}) {
      if (weighted) spec.class_weights = kClassWeights;
      const LossAndGradient got = Compute(spec, Classes(all_ignored));
      EXPECT_EQ(got.loss.item<double>(), 0.0) << LossKindName(loss) << " weighted " << weighted;
      EXPECT_EQ(got.grad.abs().max().item<double>(), 0.0);
      // PyTorch's mean over no rows is 0/0.
      const LossAndGradient torch_says =
          Reference(loss, Classes(all_ignored), spec.label_smoothing,
                    weighted ? &spec.class_weights : nullptr, spec.ignore_index);
      EXPECT_TRUE(std::isnan(torch_says.loss.item<double>()));
    }
  }
}

TEST(LossOptionsTest, BceWithLogitsPosWeightMatchesLibTorch) {
  namespace F = torch::nn::functional;
  JobSpec spec = SpecFor(LossKind::kBceWithLogits);
  spec.pos_weight = {3.0, 0.5, 1.5};
  const LossAndGradient got = Compute(spec, FloatTargets());
  torch::Tensor output =
      torch::tensor(kOutput, torch::kFloat64).view({kRows, 3}).set_requires_grad(true);
  torch::Tensor want = F::binary_cross_entropy_with_logits(
      output, torch::tensor(kFloatTargets, torch::kFloat64).view({kRows, 3}),
      F::BinaryCrossEntropyWithLogitsFuncOptions().pos_weight(
          torch::tensor(spec.pos_weight, torch::kFloat64)));
  want.backward();
  EXPECT_LT(RelativeError(got.loss, Values(want)), kTolerance);
  EXPECT_LT(RelativeError(got.grad, Values(output.grad())), kTolerance);
}

TEST(LossOptionsTest, PreparedTensorsGiveTheSameLoss) {
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.class_weights = kClassWeights;
  spec.ignore_index = -100;
  const LossTensors tensors = MakeLossTensors(spec, torch::kCPU);
  ASSERT_TRUE(tensors.class_weights.defined());
  EXPECT_FALSE(tensors.pos_weight.defined());
  const torch::Tensor output =
      torch::tensor(kOutput, torch::kFloat64).to(torch::kFloat32).view({kRows, 3});
  EXPECT_EQ(ComputeLoss(spec, output, Classes(kIgnoringTargets), tensors).item<float>(),
            ComputeLoss(spec, output, Classes(kIgnoringTargets)).item<float>());
}

// --- The validation loss is the plain loss.

torch::Tensor FloatOutput() {
  return torch::tensor(kOutput, torch::kFloat64).to(torch::kFloat32).view({kRows, 3});
}

TEST(ValidationLossTest, IsPlainCrossEntropyWithoutSmoothingOrWeights) {
  namespace F = torch::nn::functional;
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.label_smoothing = 0.2;
  spec.class_weights = kClassWeights;
  torch::Tensor sum = torch::zeros({}, torch::kFloat64);
  torch::Tensor correct = torch::zeros({}, torch::kInt64);
  AddValidationBatch(spec, FloatOutput(), Classes(kClassTargets), sum, &correct);
  const double plain = F::cross_entropy(torch::tensor(kOutput, torch::kFloat64).view({kRows, 3}),
                                        Classes(kClassTargets))
                           .item<double>();
  EXPECT_NEAR(sum.item<double>() / kRows, plain, 1e-6 * plain);
  // The training loss with those terms is another number.
  EXPECT_GT(
      std::fabs(ComputeLoss(spec, FloatOutput(), Classes(kClassTargets)).item<double>() - plain),
      1e-2);
  // Every row's largest output is its target's (2.0, 1.5, 3.0 and 1.0).
  EXPECT_EQ(correct.item<int64_t>(), 4);
}

TEST(ValidationLossTest, LeavesIgnoredRowsOutOfLossAndAccuracy) {
  namespace F = torch::nn::functional;
  JobSpec spec = SpecFor(LossKind::kCrossEntropy);
  spec.ignore_index = -100;
  spec.class_weights = kClassWeights;
  torch::Tensor sum = torch::zeros({}, torch::kFloat64);
  torch::Tensor correct = torch::zeros({}, torch::kInt64);
  AddValidationBatch(spec, FloatOutput(), Classes(kIgnoringTargets), sum, &correct);
  // The sum of the kept rows' plain losses (the loop divides by the kept rows' count).
  const double kept_sum =
      F::cross_entropy(torch::tensor(kOutput, torch::kFloat64).view({kRows, 3}),
                       Classes(kIgnoringTargets),
                       F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum))
          .item<double>();
  EXPECT_NEAR(sum.item<double>(), kept_sum, 1e-6 * kept_sum);
  EXPECT_EQ(correct.item<int64_t>(), 2);  // rows 0 and 2, both kept and right
  // Rows kept: 2; none is a negative target other than -100.
  const torch::Tensor counts = IgnoredTargetCounts(spec, Classes(kIgnoringTargets));
  EXPECT_EQ(counts[0].item<int64_t>(), 2);
  EXPECT_EQ(counts[1].item<int64_t>(), 0);
  EXPECT_EQ(IgnoredTargetCounts(spec, Classes({-100, -3, 0, -1}))[1].item<int64_t>(), 2);
}

TEST(ValidationLossTest, IsPlainBceWithoutPosWeight) {
  namespace F = torch::nn::functional;
  JobSpec spec = SpecFor(LossKind::kBceWithLogits);
  spec.pos_weight = {3.0, 0.5, 1.5};
  torch::Tensor sum = torch::zeros({}, torch::kFloat64);
  AddValidationBatch(spec, FloatOutput(), FloatTargets(), sum, nullptr);
  const double plain = F::binary_cross_entropy_with_logits(
                           torch::tensor(kOutput, torch::kFloat64).view({kRows, 3}),
                           torch::tensor(kFloatTargets, torch::kFloat64).view({kRows, 3}))
                           .item<double>();
  EXPECT_NEAR(sum.item<double>() / kRows, plain, 1e-6 * plain);
}

// --- Refusals.

TEST(CheckLossTest, ClassWeightsOfTheWrongCountAreRejected) {
  JobSpec spec = SpecWithModel(LossKind::kCrossEntropy, "linear:3");
  spec.class_weights = {1.0, 2.0};
  absl::Status status = CheckLoss(spec, {3}, ClassDataset(0, 2));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("class_weights needs one weight for each of the model's 3 classes; got 2 "
                        "values"));
  spec.class_weights.assign(1000000, 1.0);  // longer than the output: refused on its length
  EXPECT_THAT(CheckLoss(spec, {3}, ClassDataset(0, 2)).message(), HasSubstr("got 1000000 values"));
  spec.class_weights = kClassWeights;
  EXPECT_TRUE(CheckLoss(spec, {3}, ClassDataset(0, 2)).ok());
}

TEST(CheckLossTest, NonPositiveOrNonFiniteClassWeightsAreRejected) {
  JobSpec spec = SpecWithModel(LossKind::kNll, "linear:3");
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    spec.class_weights = {1.0, bad, 1.0};
    absl::Status status = CheckLoss(spec, {3}, ClassDataset(0, 2));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                HasSubstr("class_weights values must be positive finite numbers; value 1 is"));
  }
}

TEST(CheckLossTest, LossOptionsGivenToALossThatDoesNotTakeThemAreRejected) {
  JobSpec spec = SpecWithModel(LossKind::kMse, "linear:3");
  spec.class_weights = kClassWeights;
  EXPECT_THAT(CheckLoss(spec, {3}, FloatDataset({3})).message(),
              HasSubstr("class_weights apply to losses cross_entropy and nll only; loss mse does "
                        "not take them"));
  spec = SpecWithModel(LossKind::kBceWithLogits, "linear:3");
  spec.ignore_index = -100;
  EXPECT_THAT(CheckLoss(spec, {3}, FloatDataset({3})).message(),
              HasSubstr("ignore_index applies to losses cross_entropy and nll only; loss "
                        "bce_with_logits does not take it"));
  spec = SpecWithModel(LossKind::kCrossEntropy, "linear:3");
  spec.pos_weight = {1.0, 1.0, 1.0};
  EXPECT_THAT(CheckLoss(spec, {3}, ClassDataset(0, 2)).message(),
              HasSubstr("pos_weight applies to loss bce_with_logits only; loss cross_entropy "
                        "does not take it"));
}

TEST(CheckLossTest, PosWeightNeedsOnePositiveValuePerOutputColumn) {
  JobSpec spec = SpecWithModel(LossKind::kBceWithLogits, "linear:3");
  spec.pos_weight = {1.0, 2.0};
  EXPECT_THAT(CheckLoss(spec, {3}, FloatDataset({3})).message(),
              HasSubstr("pos_weight needs one weight for each of the model's 3 output columns; "
                        "got 2 values"));
  spec.pos_weight = {1.0, 2.0, -0.5};
  EXPECT_THAT(CheckLoss(spec, {3}, FloatDataset({3})).message(),
              HasSubstr("pos_weight values must be positive finite numbers; value 2 is -0.5"));
  spec.pos_weight = {1.0, 2.0, 0.5};
  EXPECT_TRUE(CheckLoss(spec, {3}, FloatDataset({3})).ok());
  spec = SpecWithModel(LossKind::kBceWithLogits, "linear:1");
  spec.pos_weight = {4.0};
  EXPECT_TRUE(CheckLoss(spec, {1}, FloatDataset({1})).ok());
}

TEST(CheckLossTest, IgnoreIndexLetsTheDatasetHoldThatTarget) {
  JobSpec spec = SpecWithModel(LossKind::kCrossEntropy, "linear:3");
  // Without it, -100 is outside the classes.
  EXPECT_THAT(CheckLoss(spec, {3}, ClassDataset(-100, 2)).message(),
              HasSubstr("has class indices -100..2 but model 'linear:3' outputs 3 classes"));
  spec.ignore_index = -100;
  EXPECT_TRUE(CheckLoss(spec, {3}, ClassDataset(-100, 2)).ok());
  EXPECT_TRUE(CheckLoss(spec, {3}, ClassDataset(0, 2)).ok());
  // A smallest target that is not the ignore_index.
  absl::Status status = CheckLoss(spec, {3}, ClassDataset(-5, 2));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("with ignore_index -100 the targets outside the "
                                          "classes must all be that value"));
  // Above the classes: the ignore_index must be the class count itself.
  spec.ignore_index = 3;
  EXPECT_TRUE(CheckLoss(spec, {3}, ClassDataset(0, 3)).ok());
  spec.ignore_index = 7;
  EXPECT_FALSE(CheckLoss(spec, {3}, ClassDataset(0, 7)).ok());
}

}  // namespace
}  // namespace trainerd::engine
