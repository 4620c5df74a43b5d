// Tests for server/engine/precision.h (autocast scopes and fp16 loss scaling whose skipped steps
// are undone on the device) and for jobs that train in bf16 and fp16 on the CPU.
#include "server/engine/training/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/device_step_optimizer.h"
#include "server/engine/training/optimizer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;

const torch::Device kCpu(torch::kCPU);

bool Identical(const torch::Tensor& a, const torch::Tensor& b) { return torch::equal(a, b); }

TEST(AutocastGuardTest, Bf16RunsMatmulsInBf16ForTheScopeOnly) {
  const torch::Tensor a = torch::randn({4, 4});
  {
    AutocastGuard guard(kCpu, Precision::kBf16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
}

TEST(AutocastGuardTest, Fp16UsesHalfAndFp32LeavesAutocastOff) {
  const torch::Tensor a = torch::randn({4, 4});
  {
    AutocastGuard guard(kCpu, Precision::kFp16);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kHalf);
  }
  {
    AutocastGuard guard(kCpu, Precision::kFp32);
    EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
  }
}

// Without the cache being cleared on leaving the scope, the second forward would reuse the
// bf16 copy of the weight made before the in-place update.
TEST(AutocastGuardTest, LeavingTheScopeDropsCachedCastsOfUpdatedWeights) {
  torch::Tensor w = torch::ones({2, 2}).set_requires_grad(true);
  const torch::Tensor x = torch::ones({1, 2});
  torch::Tensor first;
  {
    AutocastGuard guard(kCpu, Precision::kBf16);
    first = torch::mm(x, w);
  }
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);
  }
  torch::Tensor second;
  {
    AutocastGuard guard(kCpu, Precision::kBf16);
    second = torch::mm(x, w);
  }
  EXPECT_FLOAT_EQ(first[0][0].item<float>(), 2.0f);
  EXPECT_FLOAT_EQ(second[0][0].item<float>(), 4.0f);
}

// p . x as the loss: its gradient is x, known exactly.
torch::Tensor DotLoss(const torch::Tensor& p, const torch::Tensor& x) { return (p * x).sum(); }

// The optimizer an fp16 job of `kind` gets (MakeOptimizer: a DeviceStepOptimizer for the
// optimizers whose update depends on the step count).
JobSpec Fp16Spec(OptimizerKind kind) {
  JobSpec spec;
  spec.optimizer = kind;
  spec.learning_rate = 0.1;
  spec.precision = Precision::kFp16;
  if (kind == OptimizerKind::kSgd || kind == OptimizerKind::kRmsprop) spec.momentum = 0.9;
  if (kind == OptimizerKind::kAdagrad) spec.lr_decay = 0.5;
  return spec;
}

std::unique_ptr<torch::optim::Optimizer> Optimizer(OptimizerKind kind, torch::Tensor p) {
  return MakeOptimizer(Fp16Spec(kind), {p});
}

TEST(LossScalerTest, CleanStepUnscalesExactlyAndStepsLikeFp32) {
  torch::Tensor p = torch::tensor({1.0f, -2.0f, 3.0f}).set_requires_grad(true);
  const torch::Tensor x = torch::tensor({0.5f, 0.25f, -1.0f});
  auto optimizer = Optimizer(OptimizerKind::kSgd, p);
  LossScaler scaler(kCpu, LossScaler::Options{});

  scaler.Scale(DotLoss(p, x)).backward();
  EXPECT_TRUE(Identical(p.grad(), x * 65536));
  scaler.Unscale({p});
  EXPECT_TRUE(Identical(p.grad(), x));  // a power of two divides exactly
  scaler.Step(*optimizer, {p});

  EXPECT_TRUE(Identical(p.detach(), torch::tensor({1.0f, -2.0f, 3.0f}) - 0.1f * x));
  EXPECT_EQ(scaler.scale().item<float>(), 65536.0f);
  EXPECT_EQ(scaler.skipped_steps().item<double>(), 0.0);
}

// Clones of every state tensor the optimizer keeps for `p` (momentum buffers, moments, averages).
std::vector<torch::Tensor> StateOf(torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  std::vector<torch::Tensor> out;
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return out;
  auto add = [&out](const torch::Tensor& t) {
    if (t.defined()) out.push_back(t.clone());
  };
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    add(s->momentum_buffer());
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    add(s->exp_avg());
    add(s->exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    add(s->exp_avg());
    add(s->exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(it->second.get())) {
    add(s->square_avg());
    add(s->momentum_buffer());
  } else if (auto* s = dynamic_cast<DeviceStepParamState*>(it->second.get())) {
    for (const torch::Tensor& t : s->tensors()) add(t);  // the step count first
  }
  return out;
}

// One fp16-style step of DotLoss(p, x) through the scaler; `poison` puts inf and NaN into the
// gradient after backward, as an overflowing fp16 backward would.
void ScaledStep(LossScaler& scaler, torch::optim::Optimizer& optimizer, torch::Tensor& p,
                const torch::Tensor& x, bool poison) {
  optimizer.zero_grad();
  scaler.Scale(DotLoss(p, x)).backward();
  if (poison) {
    p.mutable_grad()[1] = std::numeric_limits<float>::infinity();
    p.mutable_grad()[2] = std::numeric_limits<float>::quiet_NaN();
  }
  scaler.Unscale({p});
  scaler.Step(optimizer, {p});
}

const torch::Tensor kStart = torch::tensor({1.0f, -2.0f, 3.0f});
const torch::Tensor kX = torch::tensor({0.5f, 0.25f, -1.0f});

// A step whose gradients hold inf or NaN leaves the parameters and every state tensor exactly as
// they were, halves the scale and counts the skip; the next clean step proceeds from there.
class LossScalerOverflowTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(LossScalerOverflowTest, OverflowedStepIsUndoneOnTheDevice) {
  torch::Tensor p = kStart.clone().set_requires_grad(true);
  auto optimizer = Optimizer(GetParam(), p);
  LossScaler scaler(kCpu, LossScaler::Options{});
  ScaledStep(scaler, *optimizer, p, kX, /*poison=*/false);  // so that there is state to protect
  const torch::Tensor p_before = p.detach().clone();
  const std::vector<torch::Tensor> state_before = StateOf(*optimizer, p);
  ASSERT_FALSE(state_before.empty());

  ScaledStep(scaler, *optimizer, p, kX, /*poison=*/true);

  EXPECT_TRUE(Identical(p.detach(), p_before)) << p;
  const std::vector<torch::Tensor> state_after = StateOf(*optimizer, p);
  ASSERT_EQ(state_after.size(), state_before.size());
  for (size_t i = 0; i < state_after.size(); ++i) {
    EXPECT_TRUE(Identical(state_after[i], state_before[i])) << "state tensor " << i;
  }
  EXPECT_EQ(scaler.scale().item<float>(), 32768.0f);
  EXPECT_EQ(scaler.skipped_steps().item<double>(), 1.0);
}

// A first step that overflows leaves no trace: the state it created is reset, so the following
// clean step gives what a first clean step gives, bit for bit.
TEST(LossScalerTest, SkippedFirstStepThenCleanStepEqualsOneCleanStep) {
  torch::Tensor skipped_first = kStart.clone().set_requires_grad(true);
  auto optimizer_a = Optimizer(OptimizerKind::kSgd, skipped_first);
  LossScaler scaler_a(kCpu, LossScaler::Options{});
  ScaledStep(scaler_a, *optimizer_a, skipped_first, kX, /*poison=*/true);
  EXPECT_TRUE(Identical(skipped_first.detach(), kStart));
  ScaledStep(scaler_a, *optimizer_a, skipped_first, kX, /*poison=*/false);

  torch::Tensor clean = kStart.clone().set_requires_grad(true);
  auto optimizer_b = Optimizer(OptimizerKind::kSgd, clean);
  LossScaler scaler_b(kCpu, LossScaler::Options{});
  ScaledStep(scaler_b, *optimizer_b, clean, kX, /*poison=*/false);

  EXPECT_TRUE(Identical(skipped_first.detach(), clean.detach()));
  const std::vector<torch::Tensor> a = StateOf(*optimizer_a, skipped_first);
  const std::vector<torch::Tensor> b = StateOf(*optimizer_b, clean);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(Identical(a[0], b[0]));
}

// RMSprop counts steps on the host (without using the count), so a skipped step advances its
// counter; once the skips are known (the epoch's transfer), CorrectStepCounters winds it back,
// and the state equals that of a run that never had the skipped step.
TEST(LossScalerTest, CorrectStepCountersUndoesSkippedStepsInRmspropsHostCounter) {
  torch::Tensor skipped_first = kStart.clone().set_requires_grad(true);
  auto optimizer_a = Optimizer(OptimizerKind::kRmsprop, skipped_first);
  LossScaler scaler_a(kCpu, LossScaler::Options{});
  ScaledStep(scaler_a, *optimizer_a, skipped_first, kX, /*poison=*/true);
  ScaledStep(scaler_a, *optimizer_a, skipped_first, kX, /*poison=*/false);
  auto step_of = [](torch::optim::Optimizer& o, const torch::Tensor& p) {
    return static_cast<torch::optim::RMSpropParamState&>(*o.state().at(p.unsafeGetTensorImpl()))
        .step();
  };
  EXPECT_EQ(step_of(*optimizer_a, skipped_first), 2);
  LossScaler::CorrectStepCounters(*optimizer_a, /*skipped=*/1);
  EXPECT_EQ(step_of(*optimizer_a, skipped_first), 1);

  torch::Tensor clean = kStart.clone().set_requires_grad(true);
  auto optimizer_b = Optimizer(OptimizerKind::kRmsprop, clean);
  LossScaler scaler_b(kCpu, LossScaler::Options{});
  ScaledStep(scaler_b, *optimizer_b, clean, kX, /*poison=*/false);
  EXPECT_TRUE(Identical(skipped_first.detach(), clean.detach()));
  const std::vector<torch::Tensor> a = StateOf(*optimizer_a, skipped_first);
  const std::vector<torch::Tensor> b = StateOf(*optimizer_b, clean);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(Identical(a[i], b[i])) << "state " << i;
  LossScaler::CorrectStepCounters(*optimizer_b, /*skipped=*/5);  // never below zero
  EXPECT_EQ(step_of(*optimizer_b, clean), 0);
}

// torch.amp.GradScaler skips optimizer.step() when the gradients overflowed: the optimizer's step
// count does not move, so the first real update after N skipped steps is the first step's. Here
// a clean step, six overflowed ones (the scale halves each time, 2^16 to 2^10) and three clean
// ones equal four clean steps bit for bit, state and step count included, and equal LibTorch's
// own optimizer (the GradScaler-with-torch.optim reference: only the clean steps reach it) to
// float32 rounding.
class GradScalerSkipTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(GradScalerSkipTest, OverflowedStepsLeaveTheStepCountAsIfSkipped) {
  const OptimizerKind kind = GetParam();
  torch::Tensor skipping = kStart.clone().set_requires_grad(true);
  auto optimizer_a = Optimizer(kind, skipping);
  ASSERT_NE(dynamic_cast<DeviceStepOptimizer*>(optimizer_a.get()), nullptr);
  LossScaler scaler_a(kCpu, LossScaler::Options{});
  ScaledStep(scaler_a, *optimizer_a, skipping, kX, /*poison=*/false);
  for (int i = 0; i < 6; ++i) ScaledStep(scaler_a, *optimizer_a, skipping, kX, /*poison=*/true);
  for (int i = 0; i < 3; ++i) ScaledStep(scaler_a, *optimizer_a, skipping, kX, /*poison=*/false);
  EXPECT_EQ(scaler_a.skipped_steps().item<double>(), 6.0);
  EXPECT_EQ(scaler_a.scale().item<float>(), 1024.0f);

  torch::Tensor clean = kStart.clone().set_requires_grad(true);
  auto optimizer_b = Optimizer(kind, clean);
  LossScaler scaler_b(kCpu, LossScaler::Options{});
  for (int i = 0; i < 4; ++i) ScaledStep(scaler_b, *optimizer_b, clean, kX, /*poison=*/false);

  EXPECT_TRUE(Identical(skipping.detach(), clean.detach())) << skipping << clean;
  const std::vector<torch::Tensor> a = StateOf(*optimizer_a, skipping);
  const std::vector<torch::Tensor> b = StateOf(*optimizer_b, clean);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(Identical(a[i], b[i])) << "state " << i;
  EXPECT_EQ(a.front().item<float>(), 4.0f);  // the step count: the clean steps only

  // LibTorch's twin (Adam, AdamW, Adagrad), stepped only on the clean steps' gradients.
  std::unique_ptr<torch::optim::Optimizer> twin;
  torch::Tensor reference = kStart.clone().set_requires_grad(true);
  if (kind == OptimizerKind::kAdam) {
    twin = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{reference},
                                                torch::optim::AdamOptions(0.1));
  } else if (kind == OptimizerKind::kAdamW) {
    twin = std::make_unique<torch::optim::AdamW>(std::vector<torch::Tensor>{reference},
                                                 torch::optim::AdamWOptions(0.1));
  } else if (kind == OptimizerKind::kAdagrad) {
    twin = std::make_unique<torch::optim::Adagrad>(std::vector<torch::Tensor>{reference},
                                                   torch::optim::AdagradOptions(0.1).lr_decay(0.5));
  }
  if (twin == nullptr) return;
  for (int i = 0; i < 4; ++i) {
    twin->zero_grad();
    DotLoss(reference, kX).backward();
    twin->step();
  }
  EXPECT_TRUE(torch::allclose(skipping.detach(), reference.detach(), /*rtol=*/1e-6, /*atol=*/0))
      << skipping << reference;
}

INSTANTIATE_TEST_SUITE_P(StepCountingOptimizers, GradScalerSkipTest,
                         ::testing::Values(OptimizerKind::kAdam, OptimizerKind::kAdamW,
                                           OptimizerKind::kNAdam, OptimizerKind::kRAdam,
                                           OptimizerKind::kAdagrad),
                         [](const auto& info) { return OptimizerKindName(info.param); });

TEST(LossScalerTest, ScaleGrowsAfterGrowthIntervalCleanStepsAndBacksOffOnOverflow) {
  torch::Tensor p = kStart.clone().set_requires_grad(true);
  auto optimizer = Optimizer(OptimizerKind::kSgd, p);
  LossScaler::Options options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  LossScaler scaler(kCpu, options);
  std::vector<float> scales;
  for (bool poison : {false, false, false, false, true, false}) {
    ScaledStep(scaler, *optimizer, p, kX, poison);
    scales.push_back(scaler.scale().item<float>());
  }
  EXPECT_THAT(scales, ::testing::ElementsAre(1024, 1024, 2048, 2048, 1024, 1024));
  EXPECT_EQ(scaler.skipped_steps().item<double>(), 1.0);
  scaler.ResetSkippedSteps();
  EXPECT_EQ(scaler.skipped_steps().item<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, LossScalerOverflowTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdam,
                                           OptimizerKind::kAdamW, OptimizerKind::kRmsprop,
                                           OptimizerKind::kNAdam, OptimizerKind::kRAdam,
                                           OptimizerKind::kAdagrad),
                         [](const auto& info) { return OptimizerKindName(info.param); });

// Jobs through the Engine on the CPU.
using PrecisionJobTest = EngineFixture;

TEST_F(PrecisionJobTest, Bf16SeedJobConvergesLikeFp32WithTheSameHostSyncs) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec fp32 = SeedSpec("seed");
  JobSpec bf16 = fp32;
  bf16.precision = Precision::kBf16;

  absl::StatusOr<JobSnapshot> a = RunJob(*engine_, fp32);
  absl::StatusOr<JobSnapshot> b = RunJob(*engine_, bf16);

  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(b->state, JobState::kSucceeded) << b->error;
  EXPECT_EQ(b->spec.precision, Precision::kBf16);
  // The forward really ran in bf16 (8 bits of mantissa): the losses differ from fp32's ...
  EXPECT_NE(Losses(*a), Losses(*b));
  // ... yet the model learns the same line (noise floor 0.01; bf16 rounds x and w to ~3 digits).
  EXPECT_LT(b->final_loss, 0.0125);
  EXPECT_NEAR(b->final_loss, a->final_loss, 0.0025);
  EXPECT_EQ(b->host_syncs, a->host_syncs);  // 100 epochs + 1 read-back: no per-step sync
  for (const EpochResult& epoch : b->epochs) EXPECT_FALSE(epoch.loss_scale.has_value());
}

// The seed job's scaled gradients overflow fp16 at the initial scale of 2^16 (a batch of 16 sums
// 16 gradients of ~0.5 * 2^16 each); the scaler backs off within the first epoch, skipping those
// steps, and the job converges. Scale and skips arrive with the epoch's single transfer.
TEST_F(PrecisionJobTest, Fp16SeedJobBacksOffItsLossScaleAndConverges) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec fp32 = SeedSpec("seed");
  JobSpec fp16 = fp32;
  fp16.precision = Precision::kFp16;

  absl::StatusOr<JobSnapshot> a = RunJob(*engine_, fp32);
  absl::StatusOr<JobSnapshot> b = RunJob(*engine_, fp16);

  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(b->state, JobState::kSucceeded) << b->error;
  ASSERT_EQ(b->epochs.size(), 100u);
  const EpochResult& first = b->epochs.front();
  ASSERT_TRUE(first.loss_scale.has_value());
  EXPECT_GE(first.skipped_steps, 1);
  EXPECT_LT(*first.loss_scale, 65536.0);
  // Each skip halves the scale once; growth needs 2,000 clean steps (this job has 5,000).
  int64_t skipped = 0;
  for (const EpochResult& epoch : b->epochs) skipped += epoch.skipped_steps;
  EXPECT_EQ(b->steps, 100 * 50);
  EXPECT_LT(skipped, 20);
  EXPECT_LT(b->final_loss, 0.0125);
  EXPECT_NEAR(b->final_loss, a->final_loss, 0.0025);
  EXPECT_EQ(b->host_syncs, a->host_syncs);
}

}  // namespace
}  // namespace trainerd::engine
