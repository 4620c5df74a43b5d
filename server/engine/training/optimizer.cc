#include "server/engine/training/optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/engine/training/device_step_optimizer.h"

namespace trainerd::engine {
namespace {

// Added to the global norm before dividing, as PyTorch's clip_grad_norm_ does.
constexpr double kClipEpsilon = 1e-6;
constexpr double kAdamWDefaultWeightDecay = 0.01;
constexpr double kDefaultBeta1 = 0.9;
constexpr double kDefaultBeta2 = 0.999;
constexpr double kDefaultEps = 1e-8;
constexpr double kDefaultAlpha = 0.99;
constexpr double kAdagradDefaultEps = 1e-10;
constexpr double kDefaultMomentumDecay = 4e-3;
constexpr double kPi = 3.14159265358979323846;

bool IsAdamLike(OptimizerKind kind) {
  return kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW;
}

// "<option> applies to <who>; optimizer <kind> does not take it" when `given` and not `applies`.
absl::Status CheckApplies(bool given, bool applies, const char* option, const char* who,
                          OptimizerKind kind) {
  if (!given || applies) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(option, " applies to ", who, "; optimizer ",
                                                 OptimizerKindName(kind), " does not take it"));
}

// lo <= value < hi (or lo < value when `open_low`), finite.
absl::Status CheckRange(const char* option, double value, double lo, double hi, bool open_low) {
  const bool ok = std::isfinite(value) && (open_low ? value > lo : value >= lo) && value < hi;
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(option, " must be in ", open_low ? "(" : "[", lo, ", ", hi, "); got ", value));
}

absl::Status CheckSchedule(const JobSpec& spec) {
  const ScheduleSpec& s = spec.schedule;
  const char* kind = ScheduleKindName(s.kind);
  if (s.kind == ScheduleKind::kStep) {
    if (s.step_epochs < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule step needs step epochs of at least 1; got ", s.step_epochs));
    }
    if (!(s.gamma > 0 && s.gamma <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule step needs gamma in (0, 1]; got ", s.gamma));
    }
  } else if (s.step_epochs != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step epochs applies to schedule step only; schedule ", kind, " does not take it"));
  } else if (s.gamma != ScheduleSpec().gamma) {
    return absl::InvalidArgumentError(
        absl::StrCat("gamma applies to schedule step only; schedule ", kind, " does not take it"));
  }
  if (s.kind == ScheduleKind::kCosine) {
    if (!(s.min_learning_rate >= 0 && s.min_learning_rate < spec.learning_rate)) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule cosine needs a minimum learning rate in [0, learning rate ",
                       spec.learning_rate, "); got ", s.min_learning_rate));
    }
  } else if (s.min_learning_rate != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("minimum learning rate applies to schedule cosine only; schedule ", kind,
                     " does not take it"));
  }
  if (s.warmup_epochs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warm-up epochs must be at least 0; got ", s.warmup_epochs));
  }
  if (s.warmup_epochs > 0 && s.warmup_epochs >= spec.epochs) {
    return absl::InvalidArgumentError(absl::StrCat("warm-up epochs (", s.warmup_epochs,
                                                   ") must be fewer than the epochs (", spec.epochs,
                                                   ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOptimizer(const JobSpec& spec) {
  const OptimizerKind kind = spec.optimizer;
  if (!(spec.learning_rate > 0) || !std::isfinite(spec.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be a positive number; got ", spec.learning_rate));
  }
  if (!(spec.momentum >= 0 && spec.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum must be in [0, 1); got ", spec.momentum));
  }
  const bool takes_momentum = kind == OptimizerKind::kSgd || kind == OptimizerKind::kRmsprop;
  absl::Status status =
      CheckApplies(spec.momentum != 0, takes_momentum, "momentum", "sgd and rmsprop", kind);
  if (!status.ok()) return status;
  status = CheckApplies(spec.nesterov, kind == OptimizerKind::kSgd, "nesterov", "sgd only", kind);
  if (!status.ok()) return status;
  if (spec.nesterov && !(spec.momentum > 0)) {
    return absl::InvalidArgumentError("nesterov needs a momentum above 0");
  }
  if (spec.weight_decay.has_value() &&
      !(*spec.weight_decay >= 0 && std::isfinite(*spec.weight_decay))) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight decay must be 0 or more; got ", *spec.weight_decay));
  }
  const bool adam_like = IsAdamLike(kind);
  const bool adam_family =
      adam_like || kind == OptimizerKind::kNAdam || kind == OptimizerKind::kRAdam;
  for (const auto& [option, value] :
       {std::pair<const char*, const std::optional<double>&>{"beta1", spec.beta1},
        std::pair<const char*, const std::optional<double>&>{"beta2", spec.beta2}}) {
    status =
        CheckApplies(value.has_value(), adam_family, option, "adam, adamw, nadam and radam", kind);
    if (!status.ok()) return status;
    if (value.has_value()) {
      status = CheckRange(option, *value, 0, 1, /*open_low=*/false);
      if (!status.ok()) return status;
    }
  }
  status = CheckApplies(spec.eps.has_value(), kind != OptimizerKind::kSgd, "eps",
                        "every optimizer but sgd", kind);
  if (!status.ok()) return status;
  if (spec.eps.has_value() && !(*spec.eps > 0 && std::isfinite(*spec.eps))) {
    return absl::InvalidArgumentError(
        absl::StrCat("eps must be a positive number; got ", *spec.eps));
  }
  status = CheckApplies(spec.alpha.has_value(), kind == OptimizerKind::kRmsprop, "alpha",
                        "rmsprop only", kind);
  if (!status.ok()) return status;
  if (spec.alpha.has_value()) {
    status = CheckRange("alpha", *spec.alpha, 0, 1, /*open_low=*/true);
    if (!status.ok()) return status;
  }
  status = CheckApplies(spec.amsgrad, adam_like, "amsgrad", "adam and adamw", kind);
  if (!status.ok()) return status;
  status = CheckApplies(spec.centered, kind == OptimizerKind::kRmsprop, "centered", "rmsprop only",
                        kind);
  if (!status.ok()) return status;
  status = CheckApplies(spec.momentum_decay.has_value(), kind == OptimizerKind::kNAdam,
                        "momentum decay", "nadam only", kind);
  if (!status.ok()) return status;
  status = CheckApplies(spec.decoupled_weight_decay,
                        kind == OptimizerKind::kNAdam || kind == OptimizerKind::kRAdam,
                        "decoupled weight decay", "nadam and radam", kind);
  if (!status.ok()) return status;
  status = CheckApplies(spec.lr_decay.has_value(), kind == OptimizerKind::kAdagrad, "lr decay",
                        "adagrad only", kind);
  if (!status.ok()) return status;
  status = CheckApplies(spec.initial_accumulator_value.has_value(), kind == OptimizerKind::kAdagrad,
                        "initial accumulator value", "adagrad only", kind);
  if (!status.ok()) return status;
  for (const auto& [option, value] :
       {std::pair<const char*, const std::optional<double>&>{"momentum decay", spec.momentum_decay},
        std::pair<const char*, const std::optional<double>&>{"lr decay", spec.lr_decay},
        std::pair<const char*, const std::optional<double>&>{"initial accumulator value",
                                                             spec.initial_accumulator_value}}) {
    if (value.has_value() && !(*value >= 0 && std::isfinite(*value))) {
      return absl::InvalidArgumentError(absl::StrCat(option, " must be 0 or more; got ", *value));
    }
  }
  if (spec.weight_decay_exclude_bias_and_norm && !(EffectiveWeightDecay(spec) > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight decay exclude bias and norm needs a weight decay above 0; optimizer ",
                     OptimizerKindName(kind), "'s is ", EffectiveWeightDecay(spec)));
  }
  if (!(spec.clip_grad_norm >= 0 && std::isfinite(spec.clip_grad_norm))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient clipping norm must be 0 (off) or a positive number; got ", spec.clip_grad_norm));
  }
  return CheckSchedule(spec);
}

double EffectiveWeightDecay(const JobSpec& spec) {
  return spec.weight_decay.value_or(
      spec.optimizer == OptimizerKind::kAdamW ? kAdamWDefaultWeightDecay : 0.0);
}

std::string HandWrittenOptimizerUnsupported(const JobSpec& spec) {
  switch (spec.optimizer) {
    case OptimizerKind::kNAdam:
    case OptimizerKind::kRAdam:
    case OptimizerKind::kAdagrad:
      return absl::StrCat("optimizer ", OptimizerKindName(spec.optimizer),
                          " runs on LibTorch's optimizers");
    default:
      break;
  }
  const char* option = spec.amsgrad    ? "amsgrad"
                       : spec.centered ? "centered rmsprop"
                       : spec.weight_decay_exclude_bias_and_norm
                           ? "weight decay exclude bias and norm"
                           : nullptr;
  if (option == nullptr) return "";
  return absl::StrCat(option, " runs on LibTorch's optimizers");
}

bool UsesDeviceStepOptimizer(const JobSpec& spec) {
  switch (spec.optimizer) {
    case OptimizerKind::kNAdam:
    case OptimizerKind::kRAdam:
      return true;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdagrad:
      return spec.precision == Precision::kFp16;
    case OptimizerKind::kSgd:
    case OptimizerKind::kRmsprop:
      return false;
  }
  return false;
}

namespace {

// The parameter groups of `options`: one group of every parameter, or under
// weight_decay_exclude_bias_and_norm those of more than one dimension with `options` and those of
// one or fewer with `options` at weight decay 0 (an empty group is left out).
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> ParamGroups(const JobSpec& spec,
                                                           std::vector<torch::Tensor> parameters,
                                                           const Options& options) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!spec.weight_decay_exclude_bias_and_norm) {
    groups.emplace_back(std::move(parameters));
    return groups;
  }
  std::vector<torch::Tensor> decayed;
  std::vector<torch::Tensor> exempt;
  for (torch::Tensor& p : parameters) (p.dim() > 1 ? decayed : exempt).push_back(std::move(p));
  if (!decayed.empty()) groups.emplace_back(std::move(decayed));
  if (!exempt.empty()) {
    auto no_decay = std::make_unique<Options>(options);
    no_decay->weight_decay(0);
    groups.emplace_back(std::move(exempt), std::move(no_decay));
  }
  return groups;
}

template <typename Optim, typename Options>
std::unique_ptr<torch::optim::Optimizer> Make(const JobSpec& spec,
                                              std::vector<torch::Tensor> parameters,
                                              const Options& options) {
  return std::make_unique<Optim>(ParamGroups(spec, std::move(parameters), options), options);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const JobSpec& spec,
                                                       std::vector<torch::Tensor> parameters) {
  const double weight_decay = EffectiveWeightDecay(spec);
  if (UsesDeviceStepOptimizer(spec)) {
    DeviceStepKind kind = DeviceStepKind::kAdam;
    switch (spec.optimizer) {
      case OptimizerKind::kAdamW:
        kind = DeviceStepKind::kAdamW;
        break;
      case OptimizerKind::kNAdam:
        kind = DeviceStepKind::kNAdam;
        break;
      case OptimizerKind::kRAdam:
        kind = DeviceStepKind::kRAdam;
        break;
      case OptimizerKind::kAdagrad:
        kind = DeviceStepKind::kAdagrad;
        break;
      default:
        break;
    }
    DeviceStepOptions options;
    options.lr(spec.learning_rate)
        .beta1(spec.beta1.value_or(kDefaultBeta1))
        .beta2(spec.beta2.value_or(kDefaultBeta2))
        .eps(spec.eps.value_or(spec.optimizer == OptimizerKind::kAdagrad ? kAdagradDefaultEps
                                                                         : kDefaultEps))
        .weight_decay(weight_decay)
        .amsgrad(spec.amsgrad)
        .momentum_decay(spec.momentum_decay.value_or(kDefaultMomentumDecay))
        .decoupled_weight_decay(spec.decoupled_weight_decay)
        .lr_decay(spec.lr_decay.value_or(0.0))
        .initial_accumulator_value(spec.initial_accumulator_value.value_or(0.0));
    return std::make_unique<DeviceStepOptimizer>(
        kind, ParamGroups(spec, std::move(parameters), options), options);
  }
  const double eps = spec.eps.value_or(kDefaultEps);
  const auto betas =
      std::make_tuple(spec.beta1.value_or(kDefaultBeta1), spec.beta2.value_or(kDefaultBeta2));
  switch (spec.optimizer) {
    case OptimizerKind::kSgd:
      return Make<torch::optim::SGD>(spec, std::move(parameters),
                                     torch::optim::SGDOptions(spec.learning_rate)
                                         .momentum(spec.momentum)
                                         .nesterov(spec.nesterov)
                                         .weight_decay(weight_decay));
    case OptimizerKind::kAdam:
      return Make<torch::optim::Adam>(spec, std::move(parameters),
                                      torch::optim::AdamOptions(spec.learning_rate)
                                          .betas(betas)
                                          .eps(eps)
                                          .weight_decay(weight_decay)
                                          .amsgrad(spec.amsgrad));
    case OptimizerKind::kAdamW:
      return Make<torch::optim::AdamW>(spec, std::move(parameters),
                                       torch::optim::AdamWOptions(spec.learning_rate)
                                           .betas(betas)
                                           .eps(eps)
                                           .weight_decay(weight_decay)
                                           .amsgrad(spec.amsgrad));
    case OptimizerKind::kRmsprop:
      return Make<torch::optim::RMSprop>(spec, std::move(parameters),
                                         torch::optim::RMSpropOptions(spec.learning_rate)
                                             .alpha(spec.alpha.value_or(kDefaultAlpha))
                                             .eps(eps)
                                             .weight_decay(weight_decay)
                                             .momentum(spec.momentum)
                                             .centered(spec.centered));
    case OptimizerKind::kAdagrad:
      return Make<torch::optim::Adagrad>(
          spec, std::move(parameters),
          torch::optim::AdagradOptions(spec.learning_rate)
              .lr_decay(spec.lr_decay.value_or(0.0))
              .weight_decay(weight_decay)
              .initial_accumulator_value(spec.initial_accumulator_value.value_or(0.0))
              .eps(spec.eps.value_or(kAdagradDefaultEps)));
    case OptimizerKind::kNAdam:
    case OptimizerKind::kRAdam:
      break;  // DeviceStepOptimizer above
  }
  return nullptr;
}

double LearningRateForEpoch(const JobSpec& spec, int32_t epoch) {
  const ScheduleSpec& s = spec.schedule;
  const double lr = spec.learning_rate;
  const int32_t warmup = std::max<int32_t>(s.warmup_epochs, 0);
  if (epoch <= warmup) return lr * epoch / (warmup + 1);
  const int32_t e = epoch - warmup;  // 1-based within the schedule
  const int32_t n = std::max<int32_t>(spec.epochs - warmup, 1);
  switch (s.kind) {
    case ScheduleKind::kConstant:
      return lr;
    case ScheduleKind::kStep:
      return lr * std::pow(s.gamma, (e - 1) / std::max<int32_t>(s.step_epochs, 1));
    case ScheduleKind::kCosine:
      return s.min_learning_rate +
             (lr - s.min_learning_rate) * (1 + std::cos(kPi * (e - 1) / n)) / 2;
  }
  return lr;
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double learning_rate) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(learning_rate);
}

torch::Tensor ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  // Per-tensor L2 norms, then the norm of those: sqrt(sum_i ||g_i||^2), a device scalar.
  torch::Tensor total = at::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2);
  torch::Tensor coef = (max_norm / (total + kClipEpsilon)).clamp_max(1.0);
  for (torch::Tensor& g : grads) g.mul_(coef.to(g.scalar_type()));
  return total;
}

}  // namespace trainerd::engine
