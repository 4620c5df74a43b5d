// Tests for server/engine/optimizer.h: two steps of every optimizer on a tiny linear problem
// against a float64 reference written out by hand, the learning-rate schedules epoch by epoch,
// clipping by global norm, and CheckOptimizer's rejections.
#include "server/engine/training/optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/device_step_optimizer.h"

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

// Runs `steps` steps of the optimizer `make` builds over (W, b) in fp32 and returns the
// parameters' change.
using MakeFn = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;
std::vector<double> RunChange(const MakeFn& make, int steps) {
  auto f32 = [](const std::vector<double>& v) {
    return torch::tensor(v, torch::kFloat64).to(torch::kFloat32);
  };
  torch::Tensor w = f32({kInitial.begin(), kInitial.begin() + 4}).view({kOut, kIn});
  torch::Tensor b = f32({kInitial.begin() + 4, kInitial.end()});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  torch::Tensor x = f32(kX).view({kRows, kIn});
  torch::Tensor t = f32(kT).view({kRows, kOut});
  auto optimizer = make({w, b});
  for (int step = 0; step < steps; ++step) {
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

// Runs `steps` steps of MakeOptimizer(spec) in fp32 and returns the parameters' change.
std::vector<double> TorchChange(const JobSpec& spec, int steps = kSteps) {
  return RunChange([&spec](std::vector<torch::Tensor> p) { return MakeOptimizer(spec, p); }, steps);
}

// The reference: `update` performs one step on params p with gradient g (1-based step t).
template <typename Update>
std::vector<double> ReferenceChange(Update update, int steps = kSteps) {
  std::vector<double> p = kInitial;
  for (int t = 1; t <= steps; ++t) update(p, Gradient(p), t);
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

// ---- Optimizers with a LibTorch twin: torch::optim as the reference -------------------------

// The twin's change against ours over `steps` steps, to float32 rounding.
void ExpectMatchesTwin(const JobSpec& spec, const MakeFn& twin, int steps) {
  const std::vector<double> ours = TorchChange(spec, steps);
  const std::vector<double> reference = RunChange(twin, steps);
  EXPECT_LT(RelativeError(ours, reference), kTolerance)
      << OptimizerKindName(spec.optimizer) << " " << PrecisionName(spec.precision);
}

// Both precisions: fp32 builds LibTorch's own optimizer, fp16 the DeviceStepOptimizer.
TEST(OptimizerTest, AmsgradAdamAndAdamWMatchLibTorchInBothImplementations) {
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    JobSpec adam = Spec(OptimizerKind::kAdam, 0.05);
    adam.amsgrad = true;
    adam.weight_decay = 0.1;
    adam.beta2 = 0.9;
    adam.precision = precision;
    EXPECT_EQ(UsesDeviceStepOptimizer(adam), precision == Precision::kFp16);
    ExpectMatchesTwin(
        adam,
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::Adam>(
              p, torch::optim::AdamOptions(0.05).amsgrad(true).weight_decay(0.1).betas(
                     std::make_tuple(0.9, 0.9)));
        },
        12);
    JobSpec adamw = adam;
    adamw.optimizer = OptimizerKind::kAdamW;
    adamw.weight_decay.reset();  // 0.01
    ExpectMatchesTwin(
        adamw,
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::AdamW>(
              p, torch::optim::AdamWOptions(0.05).amsgrad(true).weight_decay(0.01).betas(
                     std::make_tuple(0.9, 0.9)));
        },
        12);
  }
  // AMSGrad is in effect: the same run without it ends elsewhere.
  JobSpec plain = Spec(OptimizerKind::kAdam, 0.05);
  plain.beta2 = 0.9;
  JobSpec ams = plain;
  ams.amsgrad = true;
  EXPECT_GT(RelativeError(TorchChange(plain, 12), TorchChange(ams, 12)), 1e-4);
}

TEST(OptimizerTest, CenteredRmspropMatchesLibTorch) {
  JobSpec spec = Spec(OptimizerKind::kRmsprop, 0.01);
  spec.centered = true;
  spec.momentum = 0.5;
  spec.weight_decay = 0.01;
  ExpectMatchesTwin(
      spec,
      [](std::vector<torch::Tensor> p) {
        return std::make_unique<torch::optim::RMSprop>(
            p, torch::optim::RMSpropOptions(0.01).centered(true).momentum(0.5).weight_decay(0.01));
      },
      6);
  JobSpec plain = spec;
  plain.centered = false;
  EXPECT_GT(RelativeError(TorchChange(plain, 6), TorchChange(spec, 6)), 1e-4);
}

TEST(OptimizerTest, AdagradMatchesLibTorchInBothImplementations) {
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    JobSpec spec = Spec(OptimizerKind::kAdagrad, 0.1);
    spec.lr_decay = 0.05;
    spec.initial_accumulator_value = 0.2;
    spec.weight_decay = 0.01;
    spec.precision = precision;
    ExpectMatchesTwin(
        spec,
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1)
                                                                .lr_decay(0.05)
                                                                .initial_accumulator_value(0.2)
                                                                .weight_decay(0.01));
        },
        8);
    JobSpec defaults = Spec(OptimizerKind::kAdagrad, 0.1);  // eps 1e-10, no decay
    defaults.precision = precision;
    ExpectMatchesTwin(
        defaults,
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1));
        },
        8);
  }
}

// ---- NAdam and RAdam: float64 references written from PyTorch's documentation ----------------

// torch.optim.NAdam's algorithm: mu_t = b1 (1 - 0.5 * 0.96^(t psi)), mu_{t+1} likewise;
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; v_hat = v / (1 - b2^t);
// p -= lr (1 - mu_t) / (1 - prod_{i<=t} mu_i) g / (sqrt(v_hat) + eps)
//    + lr mu_{t+1} / (1 - prod_{i<=t+1} mu_i) m / (sqrt(v_hat) + eps),
// with weight decay as L2 (g += wd p) or decoupled (p *= 1 - lr wd).
std::vector<double> NAdamReference(const JobSpec& spec, int steps) {
  const double b1 = spec.beta1.value_or(0.9), b2 = spec.beta2.value_or(0.999);
  const double eps = spec.eps.value_or(1e-8), lr = spec.learning_rate;
  const double psi = spec.momentum_decay.value_or(4e-3), wd = spec.weight_decay.value_or(0);
  std::vector<double> m(kInitial.size(), 0.0), v(kInitial.size(), 0.0);
  double mu_product = 1;
  return ReferenceChange(
      [&](std::vector<double>& p, const std::vector<double>& g, int t) {
        const double mu = b1 * (1 - 0.5 * std::pow(0.96, t * psi));
        const double mu_next = b1 * (1 - 0.5 * std::pow(0.96, (t + 1) * psi));
        mu_product *= mu;
        const double mu_product_next = mu_product * mu_next;
        for (size_t i = 0; i < p.size(); ++i) {
          double d = g[i];
          if (spec.decoupled_weight_decay) {
            p[i] *= 1 - lr * wd;
          } else {
            d += wd * p[i];
          }
          m[i] = b1 * m[i] + (1 - b1) * d;
          v[i] = b2 * v[i] + (1 - b2) * d * d;
          const double denom = std::sqrt(v[i] / (1 - std::pow(b2, t))) + eps;
          p[i] -= lr * (1 - mu) / (1 - mu_product) * d / denom +
                  lr * mu_next / (1 - mu_product_next) * m[i] / denom;
        }
      },
      steps);
}

TEST(OptimizerTest, NAdamMatchesFloat64Reference) {
  JobSpec spec = Spec(OptimizerKind::kNAdam, 0.02);
  EXPECT_LT(RelativeError(TorchChange(spec, 6), NAdamReference(spec, 6)), kTolerance);
  spec.beta1 = 0.8;
  spec.beta2 = 0.95;
  spec.momentum_decay = 0.1;
  spec.weight_decay = 0.05;
  EXPECT_LT(RelativeError(TorchChange(spec, 6), NAdamReference(spec, 6)), kTolerance);
  spec.decoupled_weight_decay = true;
  EXPECT_LT(RelativeError(TorchChange(spec, 6), NAdamReference(spec, 6)), kTolerance);
}

// torch.optim.RAdam's algorithm: m, v as Adam; m_hat = m / (1 - b1^t);
// rho_inf = 2 / (1 - b2) - 1; rho_t = rho_inf - 2 t b2^t / (1 - b2^t); when rho_t > 5:
// l = sqrt(1 - b2^t) / (sqrt(v) + eps), r = sqrt((rho_t - 4)(rho_t - 2) rho_inf /
// ((rho_inf - 4)(rho_inf - 2) rho_t)), p -= lr m_hat l r; else p -= lr m_hat.
std::vector<double> RAdamReference(const JobSpec& spec, int steps) {
  const double b1 = spec.beta1.value_or(0.9), b2 = spec.beta2.value_or(0.999);
  const double eps = spec.eps.value_or(1e-8), lr = spec.learning_rate;
  const double wd = spec.weight_decay.value_or(0);
  std::vector<double> m(kInitial.size(), 0.0), v(kInitial.size(), 0.0);
  return ReferenceChange(
      [&](std::vector<double>& p, const std::vector<double>& g, int t) {
        const double rho_inf = 2 / (1 - b2) - 1;
        const double rho_t = rho_inf - 2 * t * std::pow(b2, t) / (1 - std::pow(b2, t));
        for (size_t i = 0; i < p.size(); ++i) {
          double d = g[i];
          if (spec.decoupled_weight_decay) {
            p[i] *= 1 - lr * wd;
          } else {
            d += wd * p[i];
          }
          m[i] = b1 * m[i] + (1 - b1) * d;
          v[i] = b2 * v[i] + (1 - b2) * d * d;
          const double m_hat = m[i] / (1 - std::pow(b1, t));
          if (rho_t > 5) {
            const double l = std::sqrt(1 - std::pow(b2, t)) / (std::sqrt(v[i]) + eps);
            const double r = std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf /
                                       ((rho_inf - 4) * (rho_inf - 2) * rho_t));
            p[i] -= lr * m_hat * l * r;
          } else {
            p[i] -= lr * m_hat;
          }
        }
      },
      steps);
}

// beta2 0.9 puts the switch to the rectified update at step 6, inside the 10 steps.
TEST(OptimizerTest, RAdamMatchesFloat64ReferenceOnBothSidesOfTheRectification) {
  JobSpec spec = Spec(OptimizerKind::kRAdam, 0.02);
  spec.beta2 = 0.9;
  EXPECT_LT(RelativeError(TorchChange(spec, 10), RAdamReference(spec, 10)), kTolerance);
  spec.weight_decay = 0.05;
  EXPECT_LT(RelativeError(TorchChange(spec, 10), RAdamReference(spec, 10)), kTolerance);
  spec.decoupled_weight_decay = true;
  EXPECT_LT(RelativeError(TorchChange(spec, 10), RAdamReference(spec, 10)), kTolerance);
  JobSpec defaults = Spec(OptimizerKind::kRAdam, 0.02);  // beta2 0.999: unrectified throughout
  EXPECT_LT(RelativeError(TorchChange(defaults, 4), RAdamReference(defaults, 4)), kTolerance);
}

// ---- Weight-decay exemption ------------------------------------------------------------------

// One step with weight decay: W (2-D) decays, b (1-D) does not, so W moves as in a run with the
// decay and b as in a run without it. (A first Adam step is +-lr whatever an L2 penalty adds, so
// the Adam family is checked with decoupled decay, and Adagrad from a nonzero accumulator, where
// the decay shows in one step.)
TEST(OptimizerTest, WeightDecayExemptionLeavesOneDimensionalParametersUndecayed) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW, OptimizerKind::kNAdam,
                             OptimizerKind::kAdagrad}) {
    JobSpec decayed = Spec(kind, 0.1);
    decayed.weight_decay = 0.5;
    if (kind == OptimizerKind::kNAdam) decayed.decoupled_weight_decay = true;
    if (kind == OptimizerKind::kAdagrad) decayed.initial_accumulator_value = 0.1;
    JobSpec exempt = decayed;
    exempt.weight_decay_exclude_bias_and_norm = true;
    JobSpec undecayed = decayed;
    undecayed.weight_decay = 0;
    const std::vector<double> with = TorchChange(decayed, 1);
    const std::vector<double> without = TorchChange(undecayed, 1);
    const std::vector<double> mixed = TorchChange(exempt, 1);
    for (size_t i = 0; i < mixed.size(); ++i) {
      const double expected = i < 4 ? with[i] : without[i];  // W's four, then b's two
      EXPECT_DOUBLE_EQ(mixed[i], expected) << OptimizerKindName(kind) << " parameter " << i;
    }
    EXPECT_NE(with[0], without[0]);
    torch::Tensor w = torch::zeros({2, 2}, torch::requires_grad());
    torch::Tensor b = torch::zeros({2}, torch::requires_grad());
    auto optimizer = MakeOptimizer(exempt, {w, b});
    ASSERT_EQ(optimizer->param_groups().size(), 2u);
    EXPECT_TRUE(optimizer->param_groups()[0].params()[0].is_same(w));
    EXPECT_TRUE(optimizer->param_groups()[1].params()[0].is_same(b));
  }
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
  EXPECT_EQ(Rejection(spec),
            "beta1 applies to adam, adamw, nadam and radam; optimizer sgd does not take it");
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
            "eps applies to every optimizer but sgd; optimizer sgd does not take it");
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

TEST(CheckOptimizerTest, NewOptimizersWithTheirOwnOptionsAreAccepted) {
  JobSpec nadam = Spec(OptimizerKind::kNAdam, 0.002);
  nadam.beta1 = 0.8;
  nadam.momentum_decay = 0;
  nadam.decoupled_weight_decay = true;
  nadam.weight_decay = 0.01;
  nadam.eps = 1e-6;
  EXPECT_TRUE(CheckOptimizer(nadam).ok());
  JobSpec radam = Spec(OptimizerKind::kRAdam, 0.001);
  radam.decoupled_weight_decay = true;
  radam.beta2 = 0.99;
  EXPECT_TRUE(CheckOptimizer(radam).ok());
  JobSpec adagrad = Spec(OptimizerKind::kAdagrad, 0.01);
  adagrad.lr_decay = 0.1;
  adagrad.initial_accumulator_value = 0.1;
  adagrad.eps = 1e-10;
  EXPECT_TRUE(CheckOptimizer(adagrad).ok());
  JobSpec adamw = Spec(OptimizerKind::kAdamW, 0.001);
  adamw.amsgrad = true;
  adamw.weight_decay_exclude_bias_and_norm = true;  // adamw's default decay is 0.01
  EXPECT_TRUE(CheckOptimizer(adamw).ok());
  JobSpec rmsprop = Spec(OptimizerKind::kRmsprop, 0.01);
  rmsprop.centered = true;
  EXPECT_TRUE(CheckOptimizer(rmsprop).ok());
}

TEST(CheckOptimizerTest, OptionsGivenToAnOptimizerThatDoesNotTakeThemAreRejected) {
  JobSpec spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.amsgrad = true;
  EXPECT_EQ(Rejection(spec), "amsgrad applies to adam and adamw; optimizer sgd does not take it");
  spec = Spec(OptimizerKind::kAdam, 0.1);
  spec.centered = true;
  EXPECT_EQ(Rejection(spec), "centered applies to rmsprop only; optimizer adam does not take it");
  spec = Spec(OptimizerKind::kRAdam, 0.1);
  spec.momentum_decay = 0.004;
  EXPECT_EQ(Rejection(spec),
            "momentum decay applies to nadam only; optimizer radam does not take it");
  spec = Spec(OptimizerKind::kAdamW, 0.1);
  spec.decoupled_weight_decay = true;
  EXPECT_EQ(Rejection(spec),
            "decoupled weight decay applies to nadam and radam; optimizer adamw "
            "does not take it");
  spec = Spec(OptimizerKind::kAdam, 0.1);
  spec.lr_decay = 0.1;
  EXPECT_EQ(Rejection(spec), "lr decay applies to adagrad only; optimizer adam does not take it");
  spec = Spec(OptimizerKind::kNAdam, 0.1);
  spec.initial_accumulator_value = 0.1;
  EXPECT_EQ(Rejection(spec),
            "initial accumulator value applies to adagrad only; optimizer nadam "
            "does not take it");
  spec = Spec(OptimizerKind::kAdagrad, 0.1);
  spec.beta1 = 0.9;
  EXPECT_EQ(Rejection(spec),
            "beta1 applies to adam, adamw, nadam and radam; optimizer adagrad does not take it");
  spec = Spec(OptimizerKind::kAdagrad, 0.1);
  spec.momentum = 0.9;
  EXPECT_EQ(Rejection(spec),
            "momentum applies to sgd and rmsprop; optimizer adagrad does not take it");
}

TEST(CheckOptimizerTest, NewOptionsOutOfRangeAreRejected) {
  JobSpec spec = Spec(OptimizerKind::kNAdam, 0.1);
  spec.momentum_decay = -1;
  EXPECT_EQ(Rejection(spec), "momentum decay must be 0 or more; got -1");
  spec = Spec(OptimizerKind::kAdagrad, 0.1);
  spec.lr_decay = -0.5;
  EXPECT_EQ(Rejection(spec), "lr decay must be 0 or more; got -0.5");
  spec = Spec(OptimizerKind::kAdagrad, 0.1);
  spec.initial_accumulator_value = std::nan("");
  EXPECT_EQ(Rejection(spec), "initial accumulator value must be 0 or more; got nan");
  spec = Spec(OptimizerKind::kSgd, 0.1);
  spec.weight_decay_exclude_bias_and_norm = true;
  EXPECT_EQ(Rejection(spec),
            "weight decay exclude bias and norm needs a weight decay above 0; optimizer sgd's "
            "is 0");
  spec = Spec(OptimizerKind::kAdamW, 0.1);
  spec.weight_decay = 0;
  spec.weight_decay_exclude_bias_and_norm = true;
  EXPECT_EQ(Rejection(spec),
            "weight decay exclude bias and norm needs a weight decay above 0; optimizer adamw's "
            "is 0");
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
