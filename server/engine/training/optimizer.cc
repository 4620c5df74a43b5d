#include "server/engine/training/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// "<option> applies to <who>; schedule <kind> does not take it" when `given` and not `applies`.
absl::Status ScheduleApplies(bool given, bool applies, const char* option, const char* who,
                             ScheduleKind kind) {
  if (!given || applies) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(option, " applies to ", who, "; schedule ",
                                                 ScheduleKindName(kind), " does not take it"));
}

absl::Status CheckSchedule(const JobSpec& spec) {
  const ScheduleSpec& s = spec.schedule;
  const ScheduleKind k = s.kind;
  const char* kind = ScheduleKindName(k);
  const bool step = k == ScheduleKind::kStep;
  const bool multistep = k == ScheduleKind::kMultiStep;
  const bool exponential = k == ScheduleKind::kExponential;
  const bool cosine = k == ScheduleKind::kCosine;
  const bool restarts = k == ScheduleKind::kCosineWarmRestarts;
  const bool onecycle = k == ScheduleKind::kOneCycle;
  const bool plateau = k == ScheduleKind::kPlateau;
  const absl::Status applies[] = {
      ScheduleApplies(s.step_epochs != 0, step, "step epochs", "schedule step only", k),
      ScheduleApplies(s.gamma != ScheduleSpec().gamma, step || multistep || exponential,
                             "gamma", "schedules step, multistep and exponential", k),
      ScheduleApplies(s.min_learning_rate != 0, cosine || restarts || plateau,
                             "minimum learning rate",
                             "schedules cosine, cosine_restarts and plateau", k),
      ScheduleApplies(!s.milestones.empty(), multistep, "milestones",
                             "schedule multistep only", k),
      ScheduleApplies(s.t_0 != 0, restarts, "t_0", "schedule cosine_restarts only", k),
      ScheduleApplies(s.t_mult.has_value(), restarts, "t_mult",
                             "schedule cosine_restarts only", k),
      ScheduleApplies(s.pct_start.has_value(), onecycle, "pct_start",
                             "schedule onecycle only", k),
      ScheduleApplies(!s.anneal_strategy.empty(), onecycle, "anneal_strategy",
                             "schedule onecycle only", k),
      ScheduleApplies(s.div_factor.has_value(), onecycle, "div_factor",
                             "schedule onecycle only", k),
      ScheduleApplies(s.final_div_factor.has_value(), onecycle, "final_div_factor",
                             "schedule onecycle only", k),
      ScheduleApplies(s.three_phase, onecycle, "three_phase", "schedule onecycle only", k),
      ScheduleApplies(s.factor.has_value(), plateau, "plateau factor",
                             "schedule plateau only", k),
      ScheduleApplies(s.patience.has_value(), plateau, "plateau patience",
                             "schedule plateau only", k),
      ScheduleApplies(s.threshold.has_value(), plateau, "plateau threshold",
                             "schedule plateau only", k),
      ScheduleApplies(s.cooldown != 0, plateau, "plateau cooldown",
                             "schedule plateau only", k),
  };
  for (const absl::Status& status : applies) {
    if (!status.ok()) return status;
  }
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (step && s.step_epochs < 1) {
    return invalid("schedule step needs step epochs of at least 1; got ", s.step_epochs);
  }
  if ((step || multistep || exponential) && !(s.gamma > 0 && s.gamma <= 1)) {
    return invalid("schedule ", kind, " needs gamma in (0, 1]; got ", s.gamma);
  }
  if ((cosine || restarts) &&
      !(s.min_learning_rate >= 0 && s.min_learning_rate < spec.learning_rate)) {
    return invalid("schedule ", kind, " needs a minimum learning rate in [0, learning rate ",
                   spec.learning_rate, "); got ", s.min_learning_rate);
  }
  if (plateau && !(s.min_learning_rate >= 0 && std::isfinite(s.min_learning_rate))) {
    return invalid("schedule plateau needs a minimum learning rate of 0 or more; got ",
                   s.min_learning_rate);
  }
  if (multistep) {
    if (s.milestones.empty()) {
      return invalid("schedule multistep needs milestones (the epochs, or steps, where the rate "
                     "is multiplied by gamma)");
    }
    if (s.milestones.size() > ScheduleSpec::kMaxMilestones) {
      return invalid("schedule multistep takes at most ", ScheduleSpec::kMaxMilestones,
                     " milestones; got ", s.milestones.size());
    }
    for (size_t i = 0; i < s.milestones.size(); ++i) {
      if (s.milestones[i] < 1 || (i > 0 && s.milestones[i] < s.milestones[i - 1])) {
        return invalid("milestones must be at least 1 and in ascending order; got ",
                       s.milestones[i], " at position ", i + 1);
      }
    }
  }
  if (restarts) {
    if (s.t_0 < 1) return invalid("schedule cosine_restarts needs t_0 of at least 1; got ", s.t_0);
    if (s.t_mult.has_value() && *s.t_mult < 1) {
      return invalid("t_mult must be at least 1; got ", *s.t_mult);
    }
  }
  if (onecycle) {
    if (s.pct_start.has_value() && !(*s.pct_start >= 0 && *s.pct_start <= 1)) {
      return invalid("pct_start must be in [0, 1]; got ", *s.pct_start);
    }
    if (!s.anneal_strategy.empty() && s.anneal_strategy != "cos" &&
        s.anneal_strategy != "linear") {
      return invalid("anneal_strategy must be cos or linear; got '", s.anneal_strategy, "'");
    }
    for (const auto& [option, value] :
         {std::pair<const char*, const std::optional<double>&>{"div_factor", s.div_factor},
          std::pair<const char*, const std::optional<double>&>{"final_div_factor",
                                                               s.final_div_factor}}) {
      if (value.has_value() && !(*value > 0 && std::isfinite(*value))) {
        return invalid(option, " must be a positive number; got ", *value);
      }
    }
  }
  if (plateau) {
    if (s.factor.has_value() && !(*s.factor > 0 && *s.factor < 1)) {
      return invalid("plateau factor must be in (0, 1); got ", *s.factor);
    }
    if (s.patience.has_value() && *s.patience < 0) {
      return invalid("plateau patience must be at least 0; got ", *s.patience);
    }
    if (s.threshold.has_value() && !(*s.threshold >= 0 && *s.threshold < 1)) {
      return invalid("plateau threshold must be in [0, 1); got ", *s.threshold);
    }
    if (s.cooldown < 0) return invalid("plateau cooldown must be at least 0; got ", s.cooldown);
    if (!spec.has_validation()) {
      return invalid("schedule plateau steps on the validation loss: it needs a validation "
                     "fraction or a validation dataset");
    }
    if (s.per_step) {
      return invalid("schedule plateau steps once per epoch, on its validation loss; it cannot "
                     "be per step");
    }
  }
  if (s.warmup_epochs < 0) return invalid("warm-up epochs must be at least 0; got ", s.warmup_epochs);
  if (s.warmup_steps < 0) return invalid("warm-up steps must be at least 0; got ", s.warmup_steps);
  if (s.warmup_epochs > 0 || s.warmup_steps > 0) {
    if (onecycle || plateau) {
      return invalid("schedule ", kind, " takes no warm-up",
                     onecycle ? " (its first phase warms up: see pct_start)" : "");
    }
  }
  if (s.warmup_epochs > 0 && s.per_step) {
    return invalid("a per-step schedule warms up by steps: use warm-up steps, not warm-up epochs");
  }
  if (s.warmup_steps > 0 && !s.per_step) {
    return invalid("warm-up steps need a per-step schedule; an epoch schedule warms up by "
                   "warm-up epochs");
  }
  if (s.warmup_epochs > 0 && s.warmup_epochs >= spec.epochs) {
    return invalid("warm-up epochs (", s.warmup_epochs, ") must be fewer than the epochs (",
                   spec.epochs, ")");
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

LearningRateSchedule::LearningRateSchedule(const JobSpec& spec, int64_t steps_per_epoch)
    : spec_(spec) {
  const ScheduleSpec& s = spec.schedule;
  per_step_ = s.per_step || s.kind == ScheduleKind::kOneCycle;
  const int64_t epochs = std::max<int64_t>(spec.epochs, 1);
  total_units_ = per_step_ ? epochs * std::max<int64_t>(steps_per_epoch, 1) : epochs;
  plateau_.rate = spec.learning_rate;
}

double LearningRateSchedule::Rate(int32_t epoch, int64_t step) const {
  const ScheduleSpec& s = spec_.schedule;
  const double lr = spec_.learning_rate;
  if (s.kind == ScheduleKind::kPlateau) return plateau_.rate;
  const int64_t t = per_step_ ? step : int64_t{epoch} - 1;
  if (s.kind == ScheduleKind::kOneCycle) return OneCycleRate(t);
  const int64_t warmup = std::max<int64_t>(per_step_ ? s.warmup_steps : s.warmup_epochs, 0);
  if (t < warmup) return lr * static_cast<double>(t + 1) / static_cast<double>(warmup + 1);
  const int64_t u = t - warmup;  // 0-based within the schedule
  const int64_t n = std::max<int64_t>(total_units_ - warmup, 1);
  const double min = s.min_learning_rate;
  switch (s.kind) {
    case ScheduleKind::kConstant:
    case ScheduleKind::kPlateau:
    case ScheduleKind::kOneCycle:
      return lr;
    case ScheduleKind::kStep:
      return lr * std::pow(s.gamma, static_cast<double>(u / std::max<int32_t>(s.step_epochs, 1)));
    case ScheduleKind::kMultiStep: {
      const auto passed = std::upper_bound(s.milestones.begin(), s.milestones.end(), u) -
                          s.milestones.begin();
      return lr * std::pow(s.gamma, static_cast<double>(passed));
    }
    case ScheduleKind::kExponential:
      return lr * std::pow(s.gamma, static_cast<double>(u));
    case ScheduleKind::kCosine:
      return min + (lr - min) * (1 + std::cos(kPi * static_cast<double>(u) / n)) / 2;
    case ScheduleKind::kCosineWarmRestarts: {
      const int64_t mult = s.t_mult.value_or(1);
      int64_t period = std::max<int32_t>(s.t_0, 1);
      int64_t t_cur = u;
      if (mult == 1) {
        t_cur = u % period;
      } else {
        while (t_cur >= period) {
          t_cur -= period;
          // A cycle longer than any count of units ends the loop (no overflow for huge t_mult).
          if (period > std::numeric_limits<int64_t>::max() / mult) {
            period = std::numeric_limits<int64_t>::max();
            break;
          }
          period *= mult;
        }
      }
      return min + (lr - min) * (1 + std::cos(kPi * static_cast<double>(t_cur) / period)) / 2;
    }
  }
  return lr;
}

double LearningRateSchedule::OneCycleRate(int64_t step) const {
  const ScheduleSpec& s = spec_.schedule;
  const double max_lr = spec_.learning_rate;
  const double initial = max_lr / s.div_factor.value_or(25.0);
  const double min = initial / s.final_div_factor.value_or(1e4);
  const double pct_start = s.pct_start.value_or(0.3);
  const double total = static_cast<double>(total_units_);
  struct Phase {
    double end_step;
    double start;
    double end;
  };
  const Phase three[] = {{pct_start * total - 1, initial, max_lr},
                         {2 * pct_start * total - 2, max_lr, initial},
                         {total - 1, initial, min}};
  const Phase two[] = {{pct_start * total - 1, initial, max_lr}, {total - 1, max_lr, min}};
  const Phase* phases = s.three_phase ? three : two;
  const size_t count = s.three_phase ? 3 : 2;
  const bool linear = s.anneal_strategy == "linear";
  const double x = static_cast<double>(step);
  double start_step = 0;
  for (size_t i = 0; i < count; ++i) {
    const Phase& phase = phases[i];
    if (x <= phase.end_step || i + 1 == count) {
      const double width = phase.end_step - start_step;
      const double pct = width == 0 ? 1.0 : (x - start_step) / width;
      if (linear) return (phase.end - phase.start) * pct + phase.start;
      return phase.end + (phase.start - phase.end) / 2.0 * (std::cos(kPi * pct) + 1);
    }
    start_step = phase.end_step;
  }
  return max_lr;
}

void LearningRateSchedule::EndEpoch(double validation_loss) {
  const ScheduleSpec& s = spec_.schedule;
  if (s.kind != ScheduleKind::kPlateau) return;
  // ReduceLROnPlateau.step(metrics), mode "min", threshold_mode "rel", eps 1e-8.
  constexpr double kPlateauEps = 1e-8;
  PlateauState& p = plateau_;
  if (validation_loss < p.best * (1.0 - s.threshold.value_or(1e-4))) {
    p.best = validation_loss;
    p.bad_epochs = 0;
  } else {
    ++p.bad_epochs;
  }
  if (p.cooldown_left > 0) {
    --p.cooldown_left;
    p.bad_epochs = 0;
  }
  if (p.bad_epochs > s.patience.value_or(10)) {
    const double reduced = std::max(p.rate * s.factor.value_or(0.1), s.min_learning_rate);
    if (p.rate - reduced > kPlateauEps) p.rate = reduced;
    p.cooldown_left = s.cooldown;
    p.bad_epochs = 0;
  }
}

double LearningRateForEpoch(const JobSpec& spec, int32_t epoch) {
  return LearningRateSchedule(spec, 1).Rate(epoch, int64_t{epoch} - 1);
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
