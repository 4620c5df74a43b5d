// Tests for server/engine/loss.h: every loss's value and gradient on a tiny batch against a
// reference written out by hand in double precision, and CheckLoss's rejections.
#include "server/engine/training/loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

}  // namespace
}  // namespace trainerd::engine
