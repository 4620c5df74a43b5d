// Tests for server/engine/optimizer.h: two steps of every optimizer on a tiny linear problem
// against a float64 reference written out by hand, the learning-rate schedules epoch by epoch,
// clipping by global norm, and CheckOptimizer's rejections.
#include "server/engine/training/optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

// fp32 against a float64 reference: relative error in the L2 norm below this.
constexpr double kTolerance = 1e-5;
constexpr int kSteps = 2;

// The problem: y = x W^T + b with W 2x2 and b 2, loss mse over a batch of 4 rows and 2 outputs.
constexpr int kRows = 4;
constexpr int kIn = 2;
constexpr int kOut = 2;
const std::vector<double> kX = {1.0, 2.0, -1.0, 0.5, 0.25, -2.0, 3.0, 1.0};
const std::vector<double> kT = {1.0, -1.0, 0.5, 2.0, -0.5, 0.0, 2.5, 1.5};
// W (row-major, 2x2) then b.
const std::vector<double> kInitial = {0.5, -0.25, 0.75, 1.0, 0.1, -0.2};

// d(mse)/d(params) at `p` (W then b), in double.
std::vector<double> Gradient(const std::vector<double>& p) {
  std::vector<double> g(p.size(), 0.0);
  const double n = kRows * kOut;
  for (int r = 0; r < kRows; ++r) {
    for (int o = 0; o < kOut; ++o) {
      double y = p[kOut * kIn + o];
      for (int i = 0; i < kIn; ++i) y += kX[r * kIn + i] * p[o * kIn + i];
      const double dy = 2 * (y - kT[r * kOut + o]) / n;
      for (int i = 0; i < kIn; ++i) g[o * kIn + i] += dy * kX[r * kIn + i];
      g[kOut * kIn + o] += dy;
    }
  }
  return g;
}

// Runs kSteps steps of MakeOptimizer(spec) in fp32 and returns the parameters' change.
std::vector<double> TorchChange(const JobSpec& spec) {
  auto f32 = [](const std::vector<double>& v) {
    return torch::tensor(v, torch::kFloat64).to(torch::kFloat32);
  };
  torch::Tensor w = f32({kInitial.begin(), kInitial.begin() + 4}).view({kOut, kIn});
  torch::Tensor b = f32({kInitial.begin() + 4, kInitial.end()});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  torch::Tensor x = f32(kX).view({kRows, kIn});
  torch::Tensor t = f32(kT).view({kRows, kOut});
  auto optimizer = MakeOptimizer(spec, {w, b});
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    torch::mse_loss(torch::addmm(b, x, w.t()), t).backward();
    optimizer->step();
  }
  torch::Tensor after = torch::cat({w.detach().view({-1}), b.detach()}).to(torch::kFloat64);
  std::vector<double> change(kInitial.size());
  for (size_t i = 0; i < change.size(); ++i) {
    change[i] = after[static_cast<int64_t>(i)].item<double>() - kInitial[i];
  }
  return change;
}

// The reference: `update` performs one step on params p with gradient g (1-based step t).
template <typename Update>
std::vector<double> ReferenceChange(Update update) {
  std::vector<double> p = kInitial;
  for (int t = 1; t <= kSteps; ++t) update(p, Gradient(p), t);
  for (size_t i = 0; i < p.size(); ++i) p[i] -= kInitial[i];
  return p;
}

double RelativeError(const std::vector<double>& actual, const std::vector<double>& expected) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

JobSpec Spec(OptimizerKind kind, double lr) {
  JobSpec spec;
  spec.optimizer = kind;
  spec.learning_rate = lr;
  spec.epochs = 10;
  return spec;
}

TEST(OptimizerTest, SgdMatchesFloat64Reference) {
  const JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  std::vector<double> expected =
      ReferenceChange([&](std::vector<double>& p, const std::vector<double>& g, int) {
        for (size_t i = 0; i < p.size(); ++i) p[i] -= spec.learning_rate * g[i];
      });
  EXPECT_LT(RelativeError(TorchChange(spec), expected), kTolerance);
}

// Momentum, Nesterov and L2 weight decay: d = g + wd p; buf = d (first step) or mu buf + d;
// p -= lr (d + mu buf).
TEST(OptimizerTest, SgdWithNesterovMomentumAndWeightDecayMatchesFloat64Reference) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.momentum = 0.9;
  spec.nesterov = true;
  spec.weight_decay = 0.05;
  std::vector<double> buf(kInitial.size(), 0.0);
  std::vector<double> expected =
      ReferenceChange([&](std::vector<double>& p, const std::vector<double>& g, int t) {
        for (size_t i = 0; i < p.size(); ++i) {
          const double d = g[i] + *spec.weight_decay * p[i];
          buf[i] = t == 1 ? d : spec.momentum * buf[i] + d;
          p[i] -= spec.learning_rate * (d + spec.momentum * buf[i]);
        }
      });
  EXPECT_LT(RelativeError(TorchChange(spec), expected), kTolerance);
}

// Adam with bias correction (and L2 weight decay added to the gradient when `decoupled` is
// false); AdamW decays the parameters themselves first: p *= 1 - lr wd.
std::vector<double> AdamReference(const JobSpec& spec, double weight_decay, bool decoupled) {
  const double b1 = spec.beta1.value_or(0.9), b2 = spec.beta2.value_or(0.999);
  const double eps = spec.eps.value_or(1e-8), lr = spec.learning_rate;
  std::vector<double> m(kInitial.size(), 0.0), v(kInitial.size(), 0.0);
  return ReferenceChange([&](std::vector<double>& p, const std::vector<double>& g, int t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i];
      if (decoupled) {
        p[i] *= 1 - lr * weight_decay;
      } else {
        d += weight_decay * p[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * d;
      v[i] = b2 * v[i] + (1 - b2) * d * d;
      const double m_hat = m[i] / (1 - std::pow(b1, t));
      const double v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  });
}

TEST(OptimizerTest, AdamMatchesFloat64Reference) {
  JobSpec spec = Spec(OptimizerKind::kAdam, 0.1);
  spec.beta1 = 0.8;
  spec.beta2 = 0.99;
  spec.eps = 1e-6;
  spec.weight_decay = 0.1;
  EXPECT_LT(RelativeError(TorchChange(spec), AdamReference(spec, 0.1, /*decoupled=*/false)),
            kTolerance);
}

TEST(OptimizerTest, AdamWWithDefaultWeightDecayMatchesFloat64Reference) {
  const JobSpec spec = Spec(OptimizerKind::kAdamW, 0.1);  // weight decay unset: 0.01
  EXPECT_LT(RelativeError(TorchChange(spec), AdamReference(spec, 0.01, /*decoupled=*/true)),
            kTolerance);
}

// RMSprop: d = g + wd p; s = alpha s + (1 - alpha) d^2; buf = mu buf + d / (sqrt(s) + eps);
// p -= lr buf.
TEST(OptimizerTest, RmspropWithMomentumMatchesFloat64Reference) {
  JobSpec spec = Spec(OptimizerKind::kRmsprop, 0.05);
  spec.alpha = 0.9;
  spec.momentum = 0.5;
  spec.weight_decay = 0.02;
  spec.eps = 1e-7;
  std::vector<double> s(kInitial.size(), 0.0), buf(kInitial.size(), 0.0);
  std::vector<double> expected =
      ReferenceChange([&](std::vector<double>& p, const std::vector<double>& g, int) {
        for (size_t i = 0; i < p.size(); ++i) {
          const double d = g[i] + *spec.weight_decay * p[i];
          s[i] = *spec.alpha * s[i] + (1 - *spec.alpha) * d * d;
          buf[i] = spec.momentum * buf[i] + d / (std::sqrt(s[i]) + *spec.eps);
          p[i] -= spec.learning_rate * buf[i];
        }
      });
  EXPECT_LT(RelativeError(TorchChange(spec), expected), kTolerance);
}

TEST(OptimizerTest, SetLearningRateChangesEveryGroup) {
  torch::Tensor w = torch::zeros({2}, torch::requires_grad());
  auto optimizer = MakeOptimizer(Spec(OptimizerKind::kAdamW, 0.1), {w});
  SetLearningRate(*optimizer, 0.025);
  for (const auto& group : optimizer->param_groups()) {
    EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.025);
  }
}

// ---- schedules ------------------------------------------------------------------------------

std::vector<double> Rates(const JobSpec& spec) {
  std::vector<double> rates;
  for (int32_t epoch = 1; epoch <= spec.epochs; ++epoch) {
    rates.push_back(LearningRateForEpoch(spec, epoch));
  }
  return rates;
}

void ExpectRates(const JobSpec& spec, const std::vector<double>& expected) {
  const std::vector<double> rates = Rates(spec);
  ASSERT_EQ(rates.size(), expected.size());
  for (size_t i = 0; i < rates.size(); ++i) {
    EXPECT_NEAR(rates[i], expected[i], 1e-12) << "epoch " << i + 1;
  }
}

TEST(ScheduleTest, ConstantKeepsTheRate) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.5);
  spec.epochs = 3;
  ExpectRates(spec, {0.5, 0.5, 0.5});
}

TEST(ScheduleTest, StepMultipliesByGammaEveryStepEpochs) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 1.0);
  spec.epochs = 7;
  spec.schedule.kind = ScheduleKind::kStep;
  spec.schedule.step_epochs = 2;
  spec.schedule.gamma = 0.5;
  ExpectRates(spec, {1, 1, 0.5, 0.5, 0.25, 0.25, 0.125});
}

TEST(ScheduleTest, CosineAnnealsFromTheRateTowardsTheMinimum) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 1.0);
  spec.epochs = 4;
  spec.schedule.kind = ScheduleKind::kCosine;
  spec.schedule.min_learning_rate = 0.2;
  // min + (lr - min) (1 + cos(pi e / 4)) / 2 for e = 0..3.
  const double pi = std::acos(-1.0);
  std::vector<double> expected;
  for (int e = 0; e < 4; ++e) expected.push_back(0.2 + 0.8 * (1 + std::cos(pi * e / 4)) / 2);
  ExpectRates(spec, expected);
  EXPECT_NEAR(Rates(spec)[2], 0.6, 1e-12);  // half-way: the mean of 1 and 0.2
}

TEST(ScheduleTest, WarmupRampsLinearlyThenHandsOverToTheSchedule) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.3);
  spec.epochs = 6;
  spec.schedule.kind = ScheduleKind::kStep;
  spec.schedule.warmup_epochs = 2;
  spec.schedule.step_epochs = 2;
  spec.schedule.gamma = 0.1;
  // 0.3 * 1/3, 0.3 * 2/3, then step over the remaining 4 epochs.
  ExpectRates(spec, {0.1, 0.2, 0.3, 0.3, 0.03, 0.03});
}

TEST(ScheduleTest, WarmupThenCosineStartsAtTheFullRate) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 1.0);
  spec.epochs = 5;
  spec.schedule.kind = ScheduleKind::kCosine;
  spec.schedule.warmup_epochs = 1;
  // Cosine over 4 epochs after one warm-up epoch at 1/2.
  const double pi = std::acos(-1.0);
  std::vector<double> expected = {0.5};
  for (int e = 0; e < 4; ++e) expected.push_back((1 + std::cos(pi * e / 4)) / 2);
  ExpectRates(spec, expected);
}

// ---- clipping -------------------------------------------------------------------------------

// Two parameters with gradients (3, 4) and (12): global norm 13.
std::vector<torch::Tensor> ParametersWithGradients() {
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  b.mutable_grad() = torch::tensor({12.0f});
  return {a, b};
}

double GlobalNorm(const std::vector<torch::Tensor>& parameters) {
  double sum = 0;
  for (const auto& p : parameters) sum += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

TEST(ClipGradNormTest, LargeGradientIsScaledToMaxNorm) {
  std::vector<torch::Tensor> parameters = ParametersWithGradients();
  torch::Tensor total = ClipGradNorm(parameters, /*max_norm=*/1.3);
  EXPECT_NEAR(total.item<double>(), 13.0, 1e-5);
  EXPECT_NEAR(GlobalNorm(parameters), 1.3, 1.3 * kTolerance);
  // The direction is kept: every gradient is scaled by the same 1.3 / 13.
  EXPECT_NEAR(parameters[0].grad()[1].item<double>(), 0.4, 0.4 * kTolerance);
  EXPECT_NEAR(parameters[1].grad()[0].item<double>(), 1.2, 1.2 * kTolerance);
}

TEST(ClipGradNormTest, SmallGradientIsUnchanged) {
  std::vector<torch::Tensor> parameters = ParametersWithGradients();
  ClipGradNorm(parameters, /*max_norm=*/100);
  EXPECT_EQ(parameters[0].grad()[0].item<float>(), 3.0f);
  EXPECT_EQ(parameters[0].grad()[1].item<float>(), 4.0f);
  EXPECT_EQ(parameters[1].grad()[0].item<float>(), 12.0f);
}

TEST(ClipGradNormTest, ParametersWithoutGradientsAreSkipped) {
  std::vector<torch::Tensor> parameters = ParametersWithGradients();
  parameters.push_back(torch::ones({3}, torch::requires_grad()));  // no grad yet
  torch::Tensor total = ClipGradNorm(parameters, /*max_norm=*/1.3);
  EXPECT_NEAR(total.item<double>(), 13.0, 1e-5);
  EXPECT_FALSE(parameters[2].grad().defined());
}

// ---- CheckOptimizer -------------------------------------------------------------------------

std::string Rejection(const JobSpec& spec) {
  absl::Status status = CheckOptimizer(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(CheckOptimizerTest, EveryOptimizerWithItsOwnOptionsIsAccepted) {
  JobSpec sgd = Spec(OptimizerKind::kSgd, 0.1);
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 1e-4;
  EXPECT_TRUE(CheckOptimizer(sgd).ok());
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    JobSpec adam = Spec(kind, 0.001);
    adam.beta1 = 0;
    adam.beta2 = 0.95;
    adam.eps = 1e-6;
    EXPECT_TRUE(CheckOptimizer(adam).ok()) << OptimizerKindName(kind);
  }
  JobSpec rmsprop = Spec(OptimizerKind::kRmsprop, 0.01);
  rmsprop.alpha = 0.9;
  rmsprop.momentum = 0.5;
  rmsprop.eps = 1e-6;
  EXPECT_TRUE(CheckOptimizer(rmsprop).ok());
}

TEST(CheckOptimizerTest, Beta1WithSgdIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.beta1 = 0.9;
  EXPECT_EQ(Rejection(spec), "beta1 applies to adam and adamw; optimizer sgd does not take it");
}

TEST(CheckOptimizerTest, MomentumWithAdamWIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kAdamW, 0.1);
  spec.momentum = 0.9;
  EXPECT_EQ(Rejection(spec),
            "momentum applies to sgd and rmsprop; optimizer adamw does not take it");
}

TEST(CheckOptimizerTest, NesterovWithRmspropIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kRmsprop, 0.1);
  spec.momentum = 0.9;
  spec.nesterov = true;
  EXPECT_EQ(Rejection(spec), "nesterov applies to sgd only; optimizer rmsprop does not take it");
}

TEST(CheckOptimizerTest, NesterovWithoutMomentumIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.nesterov = true;
  EXPECT_EQ(Rejection(spec), "nesterov needs a momentum above 0");
}

TEST(CheckOptimizerTest, AlphaWithAdamIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kAdam, 0.1);
  spec.alpha = 0.9;
  EXPECT_EQ(Rejection(spec), "alpha applies to rmsprop only; optimizer adam does not take it");
}

TEST(CheckOptimizerTest, EpsWithSgdIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.eps = 1e-8;
  EXPECT_EQ(Rejection(spec),
            "eps applies to adam, adamw and rmsprop; optimizer sgd does not take it");
}

TEST(CheckOptimizerTest, OutOfRangeOptionsAreRejected) {
  JobSpec spec = Spec(OptimizerKind::kAdam, 0.1);
  spec.beta2 = 1;
  EXPECT_EQ(Rejection(spec), "beta2 must be in [0, 1); got 1");
  spec = Spec(OptimizerKind::kAdam, 0.1);
  spec.eps = 0;
  EXPECT_EQ(Rejection(spec), "eps must be a positive number; got 0");
  spec = Spec(OptimizerKind::kRmsprop, 0.1);
  spec.alpha = 0;
  EXPECT_EQ(Rejection(spec), "alpha must be in (0, 1); got 0");
  spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.weight_decay = -0.1;
  EXPECT_EQ(Rejection(spec), "weight decay must be 0 or more; got -0.1");
  spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.clip_grad_norm = -1;
  EXPECT_THAT(Rejection(spec), HasSubstr("gradient clipping norm must be 0 (off) or a positive"));
}

TEST(CheckOptimizerTest, StepScheduleNeedsStepEpochsAndGamma) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.schedule.kind = ScheduleKind::kStep;
  EXPECT_EQ(Rejection(spec), "schedule step needs step epochs of at least 1; got 0");
  spec.schedule.step_epochs = 3;
  spec.schedule.gamma = 1.5;
  EXPECT_EQ(Rejection(spec), "schedule step needs gamma in (0, 1]; got 1.5");
}

TEST(CheckOptimizerTest, CosineMinimumAtOrAboveTheRateIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.schedule.kind = ScheduleKind::kCosine;
  spec.schedule.min_learning_rate = 0.1;
  EXPECT_EQ(Rejection(spec),
            "schedule cosine needs a minimum learning rate in [0, learning rate 0.1); got 0.1");
}

TEST(CheckOptimizerTest, ScheduleOptionsOfAnotherKindAreRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.schedule.kind = ScheduleKind::kCosine;
  spec.schedule.step_epochs = 2;
  EXPECT_EQ(Rejection(spec),
            "step epochs applies to schedule step only; schedule cosine does not take it");
  spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.schedule.min_learning_rate = 0.01;
  EXPECT_EQ(Rejection(spec),
            "minimum learning rate applies to schedules cosine, cosine_restarts and plateau; "
            "schedule constant does not take it");
}

TEST(CheckOptimizerTest, WarmupAsLongAsTheJobIsRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.epochs = 5;
  spec.schedule.warmup_epochs = 5;
  EXPECT_EQ(Rejection(spec), "warm-up epochs (5) must be fewer than the epochs (5)");
}

}  // namespace
}  // namespace trainerd::engine
