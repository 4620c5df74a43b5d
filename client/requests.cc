// Local checks and request building for `submit` and `sweep`.
#include "client/requests.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/contexts.h"
#include "common/csv_reader.h"
#include "common/dataset_header.h"
#include "common/file_io.h"
#include "common/job_limits.h"
#include "common/model_spec.h"
#include "common/npy_reader.h"
#include "common/status_macros.h"

namespace trainerd::client {
namespace {

constexpr double kDefaultGamma = 0.1;

absl::StatusOr<v1::Loss> ParseLoss(const std::string& text) {
  if (text == "mse") return v1::LOSS_MSE;
  if (text == "cross_entropy" || text == "cross-entropy") return v1::LOSS_CROSS_ENTROPY;
  if (text == "l1") return v1::LOSS_L1;
  if (text == "huber") return v1::LOSS_HUBER;
  if (text == "bce_with_logits" || text == "bce-with-logits") return v1::LOSS_BCE_WITH_LOGITS;
  if (text == "nll") return v1::LOSS_NLL;
  return absl::InvalidArgumentError(
      absl::StrCat("--loss: unknown loss '", text,
                   "' (expected mse, cross_entropy, l1, huber, bce_with_logits or nll)"));
}

absl::StatusOr<v1::OptimizerKind> ParseOptimizer(const std::string& text) {
  if (text == "sgd") return v1::OPTIMIZER_KIND_SGD;
  if (text == "adam") return v1::OPTIMIZER_KIND_ADAM;
  if (text == "adamw") return v1::OPTIMIZER_KIND_ADAMW;
  if (text == "rmsprop") return v1::OPTIMIZER_KIND_RMSPROP;
  if (text == "nadam") return v1::OPTIMIZER_KIND_NADAM;
  if (text == "radam") return v1::OPTIMIZER_KIND_RADAM;
  if (text == "adagrad") return v1::OPTIMIZER_KIND_ADAGRAD;
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer: unknown optimizer '", text,
                   "' (expected sgd, adam, adamw, rmsprop, nadam, radam or adagrad)"));
}

absl::StatusOr<v1::Schedule::Kind> ParseSchedule(const std::string& text) {
  if (text == "constant") return v1::Schedule::CONSTANT;
  if (text == "step") return v1::Schedule::STEP;
  if (text == "cosine") return v1::Schedule::COSINE;
  if (text == "onecycle") return v1::Schedule::ONE_CYCLE;
  if (text == "plateau") return v1::Schedule::REDUCE_ON_PLATEAU;
  if (text == "multistep") return v1::Schedule::MULTI_STEP;
  if (text == "exponential") return v1::Schedule::EXPONENTIAL;
  if (text == "cosine_restarts") return v1::Schedule::COSINE_WARM_RESTARTS;
  return absl::InvalidArgumentError(
      absl::StrCat("--schedule: unknown schedule '", text,
                   "' (expected constant, step, multistep, exponential, cosine, cosine_restarts, "
                   "onecycle or plateau)"));
}

absl::StatusOr<v1::Precision> ParsePrecision(const std::string& text) {
  if (text == "fp32") return v1::PRECISION_FP32;
  if (text == "bf16") return v1::PRECISION_BF16;
  if (text == "fp16") return v1::PRECISION_FP16;
  return absl::InvalidArgumentError(
      absl::StrCat("--precision: unknown precision '", text, "' (expected fp32, bf16 or fp16)"));
}

absl::StatusOr<v1::Engine> ParseEngine(const std::string& text) {
  if (text == "auto") return v1::ENGINE_AUTO;
  if (text == "fused") return v1::ENGINE_FUSED;
  if (text == "libtorch") return v1::ENGINE_LIBTORCH;
  return absl::InvalidArgumentError(
      absl::StrCat("--engine: unknown engine '", text, "' (expected auto, fused or libtorch)"));
}

absl::StatusOr<v1::JobPriority> ParsePriority(const std::string& text) {
  if (text == "high") return v1::JOB_PRIORITY_HIGH;
  if (text == "normal") return v1::JOB_PRIORITY_NORMAL;
  if (text == "low") return v1::JOB_PRIORITY_LOW;
  return absl::InvalidArgumentError(
      absl::StrCat("--priority: unknown priority '", text, "' (expected high, normal or low)"));
}

// "--FLAG applies to WHAT only" when the flag was given but does not apply.
absl::Status CheckApplies(const Invocation& invocation, absl::string_view flag, bool applies,
                          absl::string_view what) {
  if (!invocation.Has(flag) || applies) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " applies to ", what, " only"));
}

// The flag's value (or `fallback`), which must lie between lo and hi; `lo_open` / `hi_open` exclude
// the bound itself, and hi = infinity means no upper bound. The error names the interval.
absl::StatusOr<double> GetDoubleIn(const Invocation& invocation, absl::string_view flag,
                                   double fallback, double lo, bool lo_open, double hi,
                                   bool hi_open) {
  TRAINERD_ASSIGN_OR_RETURN(double value, invocation.GetDouble(flag, fallback));
  const bool ok = (lo_open ? value > lo : value >= lo) && (hi_open ? value < hi : value <= hi);
  if (ok) return value;
  std::string interval;
  if (hi == std::numeric_limits<double>::infinity()) {
    interval = absl::StrFormat("%s %g", lo_open ? ">" : ">=", lo);
  } else {
    interval = absl::StrFormat("in %s%g, %g%s", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--%s must be %s, got %g", std::string(flag), interval, value));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// A loss's weight list flag (--class-weights, --pos-weight): comma-separated positive finite
// numbers, at most kMaxLossWeights of them (the daemon matches the count to the model's output).
absl::StatusOr<std::vector<double>> GetWeightList(const Invocation& invocation,
                                                  absl::string_view flag) {
  std::vector<double> values;
  if (!invocation.Has(flag)) return values;
  const std::string text = invocation.Get(flag);
  if (static_cast<int64_t>(std::count(text.begin(), text.end(), ',')) >= kMaxLossWeights) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " takes at most ", kMaxLossWeights, " weights"));
  }
  for (absl::string_view element : absl::StrSplit(text, ',')) {
    element = absl::StripAsciiWhitespace(element);
    double value = 0;
    if (!absl::SimpleAtod(element, &value) || !std::isfinite(value) || !(value > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " takes comma-separated positive numbers, one per ",
          flag == "pos-weight" ? "output column" : "class", "; '", element, "' is not one"));
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace

absl::StatusOr<v1::JobSpec> JobSpecFromFlags(const Invocation& invocation) {
  v1::JobSpec spec;
  // `sweep` builds its spec here too; a missing flag is then the sweep's.
  const bool sweep = invocation.command != nullptr && invocation.command->path == "sweep";
  const absl::string_view command = sweep ? "sweep" : "submit";
  if (!invocation.Has("dataset")) {
    return absl::InvalidArgumentError(
        absl::StrCat(command, " needs --dataset NAME (see 'trainctl ", command, " --help')"));
  }
  const bool torchscript = invocation.Has("torchscript");
  if (torchscript && invocation.Has("model")) {
    return absl::InvalidArgumentError("give either --model SPEC or --torchscript FILE, not both");
  }
  if (!torchscript && !invocation.Has("model")) {
    return absl::InvalidArgumentError(
        sweep ? "sweep needs --model SPEC, e.g. --model linear:64,relu,linear:1"
              : "submit needs --model SPEC, e.g. --model linear:64,relu,linear:1, or --torchscript "
                "FILE");
  }
  spec.set_dataset(invocation.Get("dataset"));
  TRAINERD_RETURN_IF_ERROR(ParseDatasetReference(spec.dataset()).status());

  if (torchscript) {
    // The module's bytes travel beside the spec (SubmitJobRequest.torchscript_module, or
    // exported_program for a .pt2 file; Submit clears the name for those).
    spec.set_model("torchscript");
  } else {
    absl::StatusOr<ModelSpec> model = ParseModelSpec(invocation.Get("model"));
    if (!model.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--model: ", model.status().message()));
    }
    spec.set_model(model->ToString());
  }

  // Without --loss the daemon picks it by the dataset's targets (cross_entropy for int64 class
  // indices, mse for float32 values), which trainctl does not know.
  v1::Loss loss = v1::LOSS_UNSPECIFIED;
  if (invocation.Has("loss")) {
    TRAINERD_ASSIGN_OR_RETURN(loss, ParseLoss(invocation.Get("loss")));
  }
  spec.set_loss(loss);

  v1::Optimizer* optimizer = spec.mutable_optimizer();
  TRAINERD_ASSIGN_OR_RETURN(v1::OptimizerKind kind,
                            ParseOptimizer(invocation.Get("optimizer", "sgd")));
  optimizer->set_kind(kind);
  TRAINERD_ASSIGN_OR_RETURN(double lr, invocation.GetDouble("lr", kDefaultLearningRate));
  if (lr <= 0) return absl::InvalidArgumentError(absl::StrFormat("--lr must be > 0, got %g", lr));
  optimizer->set_learning_rate(lr);
  const bool sgd = kind == v1::OPTIMIZER_KIND_SGD;
  const bool rmsprop = kind == v1::OPTIMIZER_KIND_RMSPROP;
  const bool adam_like = kind == v1::OPTIMIZER_KIND_ADAM || kind == v1::OPTIMIZER_KIND_ADAMW;
  const bool nadam = kind == v1::OPTIMIZER_KIND_NADAM;
  const bool radam = kind == v1::OPTIMIZER_KIND_RADAM;
  const bool adagrad = kind == v1::OPTIMIZER_KIND_ADAGRAD;
  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "momentum", sgd || rmsprop, "--optimizer sgd and rmsprop"));
  TRAINERD_ASSIGN_OR_RETURN(double momentum,
                            GetDoubleIn(invocation, "momentum", 0, 0, false, 1, true));
  optimizer->set_momentum(momentum);
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "nesterov", sgd, "--optimizer sgd"));
  if (invocation.Has("nesterov")) {
    if (momentum <= 0) return absl::InvalidArgumentError("--nesterov needs --momentum above 0");
    optimizer->set_nesterov(true);
  }
  if (invocation.Has("weight-decay")) {
    TRAINERD_ASSIGN_OR_RETURN(double decay,
                              GetDoubleIn(invocation, "weight-decay", 0, 0, false, kInf, true));
    optimizer->set_weight_decay(decay);
  }
  for (absl::string_view flag : {"beta1", "beta2"}) {
    TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, flag, adam_like || nadam || radam,
                                          "--optimizer adam, adamw, nadam and radam"));
    if (!invocation.Has(flag)) continue;
    TRAINERD_ASSIGN_OR_RETURN(double beta, GetDoubleIn(invocation, flag, 0, 0, false, 1, true));
    if (flag == "beta1") {
      optimizer->set_beta1(beta);
    } else {
      optimizer->set_beta2(beta);
    }
  }
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "eps", !sgd, "--optimizer other than sgd"));
  if (invocation.Has("eps")) {
    TRAINERD_ASSIGN_OR_RETURN(double eps, GetDoubleIn(invocation, "eps", 0, 0, true, kInf, true));
    optimizer->set_eps(eps);
  }
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "alpha", rmsprop, "--optimizer rmsprop"));
  if (invocation.Has("alpha")) {
    TRAINERD_ASSIGN_OR_RETURN(double alpha, GetDoubleIn(invocation, "alpha", 0, 0, true, 1, true));
    optimizer->set_alpha(alpha);
  }
  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "amsgrad", adam_like, "--optimizer adam and adamw"));
  optimizer->set_amsgrad(invocation.Has("amsgrad"));
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "centered", rmsprop, "--optimizer rmsprop"));
  optimizer->set_centered(invocation.Has("centered"));
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "momentum-decay", nadam, "--optimizer nadam"));
  if (invocation.Has("momentum-decay")) {
    TRAINERD_ASSIGN_OR_RETURN(double decay,
                              GetDoubleIn(invocation, "momentum-decay", 0, 0, false, kInf, true));
    optimizer->set_momentum_decay(decay);
  }
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "decoupled-weight-decay", nadam || radam,
                                        "--optimizer nadam and radam"));
  optimizer->set_decoupled_weight_decay(invocation.Has("decoupled-weight-decay"));
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "lr-decay", adagrad, "--optimizer adagrad"));
  if (invocation.Has("lr-decay")) {
    TRAINERD_ASSIGN_OR_RETURN(double decay,
                              GetDoubleIn(invocation, "lr-decay", 0, 0, false, kInf, true));
    optimizer->set_lr_decay(decay);
  }
  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "initial-accumulator-value", adagrad, "--optimizer adagrad"));
  if (invocation.Has("initial-accumulator-value")) {
    TRAINERD_ASSIGN_OR_RETURN(double value, GetDoubleIn(invocation, "initial-accumulator-value", 0,
                                                        0, false, kInf, true));
    optimizer->set_initial_accumulator_value(value);
  }
  if (invocation.Has("weight-decay-exclude-bias-and-norm")) {
    const bool adamw = kind == v1::OPTIMIZER_KIND_ADAMW;
    if (!(optimizer->has_weight_decay() ? optimizer->weight_decay() > 0 : adamw)) {
      return absl::InvalidArgumentError(
          "--weight-decay-exclude-bias-and-norm needs a weight decay above 0 (--weight-decay; "
          "adamw's default is 0.01)");
    }
    optimizer->set_weight_decay_exclude_bias_and_norm(true);
  }

  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "huber-delta", loss == v1::LOSS_HUBER, "--loss huber"));
  if (invocation.Has("huber-delta")) {
    TRAINERD_ASSIGN_OR_RETURN(double delta,
                              GetDoubleIn(invocation, "huber-delta", 0, 0, true, kInf, true));
    spec.set_huber_delta(delta);
  }
  // Without --loss, the daemon says whether the loss its targets call for takes it.
  TRAINERD_RETURN_IF_ERROR(CheckApplies(
      invocation, "label-smoothing", loss == v1::LOSS_CROSS_ENTROPY || loss == v1::LOSS_UNSPECIFIED,
      "--loss cross_entropy"));
  TRAINERD_ASSIGN_OR_RETURN(double smoothing,
                            GetDoubleIn(invocation, "label-smoothing", 0, 0, false, 1, true));
  spec.set_label_smoothing(smoothing);
  const bool class_loss =
      loss == v1::LOSS_CROSS_ENTROPY || loss == v1::LOSS_NLL || loss == v1::LOSS_UNSPECIFIED;
  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "class-weights", class_loss, "--loss cross_entropy and nll"));
  TRAINERD_ASSIGN_OR_RETURN(std::vector<double> class_weights,
                            GetWeightList(invocation, "class-weights"));
  spec.mutable_class_weights()->Add(class_weights.begin(), class_weights.end());
  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "ignore-index", class_loss, "--loss cross_entropy and nll"));
  if (invocation.Has("ignore-index")) {
    TRAINERD_ASSIGN_OR_RETURN(
        int64_t ignore_index,
        invocation.GetInt("ignore-index", 0, std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max()));
    spec.set_ignore_index(ignore_index);
  }
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "pos-weight", loss == v1::LOSS_BCE_WITH_LOGITS,
                                        "--loss bce_with_logits"));
  TRAINERD_ASSIGN_OR_RETURN(std::vector<double> pos_weight,
                            GetWeightList(invocation, "pos-weight"));
  spec.mutable_pos_weight()->Add(pos_weight.begin(), pos_weight.end());

  v1::Schedule* schedule = spec.mutable_schedule();
  TRAINERD_ASSIGN_OR_RETURN(v1::Schedule::Kind schedule_kind,
                            ParseSchedule(invocation.Get("schedule", "constant")));
  schedule->set_kind(schedule_kind);
  const bool step = schedule_kind == v1::Schedule::STEP;
  const bool cosine = schedule_kind == v1::Schedule::COSINE;
  const bool multistep = schedule_kind == v1::Schedule::MULTI_STEP;
  const bool exponential = schedule_kind == v1::Schedule::EXPONENTIAL;
  const bool restarts = schedule_kind == v1::Schedule::COSINE_WARM_RESTARTS;
  const bool onecycle = schedule_kind == v1::Schedule::ONE_CYCLE;
  const bool plateau = schedule_kind == v1::Schedule::REDUCE_ON_PLATEAU;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "step-epochs", step, "--schedule step"));
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "gamma", step || multistep || exponential,
                                        "--schedule step, multistep and exponential"));
  TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "min-lr", cosine || restarts || plateau,
                                        "--schedule cosine, cosine_restarts and plateau"));
  TRAINERD_RETURN_IF_ERROR(
      CheckApplies(invocation, "milestones", multistep, "--schedule multistep"));
  for (const char* flag : {"t0", "t-mult"}) {
    TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, flag, restarts, "--schedule cosine_restarts"));
  }
  for (const char* flag :
       {"pct-start", "anneal-strategy", "div-factor", "final-div-factor", "three-phase"}) {
    TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, flag, onecycle, "--schedule onecycle"));
  }
  for (const char* flag :
       {"plateau-factor", "plateau-patience", "plateau-threshold", "plateau-cooldown"}) {
    TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, flag, plateau, "--schedule plateau"));
  }
  if (step) {
    if (!invocation.Has("step-epochs")) {
      return absl::InvalidArgumentError("--schedule step needs --step-epochs N");
    }
    TRAINERD_ASSIGN_OR_RETURN(int64_t step_epochs,
                              invocation.GetInt("step-epochs", 0, 1, kInt32Max));
    schedule->set_step_epochs(static_cast<int32_t>(step_epochs));
  }
  if (step || multistep || exponential) {
    TRAINERD_ASSIGN_OR_RETURN(double gamma,
                              GetDoubleIn(invocation, "gamma", kDefaultGamma, 0, true, 1, false));
    schedule->set_gamma(gamma);
  }
  if (multistep) {
    if (!invocation.Has("milestones")) {
      return absl::InvalidArgumentError("--schedule multistep needs --milestones N,N,...");
    }
    int64_t last = 1;
    for (absl::string_view part : absl::StrSplit(invocation.Get("milestones"), ',')) {
      int64_t milestone = 0;
      if (!absl::SimpleAtoi(part, &milestone) || milestone < last || milestone > kInt32Max) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--milestones: '", part, "' is not a whole number of at least ", last,
            " (milestones are >= 1 and ascending)"));
      }
      last = milestone;
      schedule->add_milestones(static_cast<int32_t>(milestone));
    }
  }
  if (cosine || restarts) {
    TRAINERD_ASSIGN_OR_RETURN(double min_lr,
                              GetDoubleIn(invocation, "min-lr", 0, 0, false, lr, true));
    schedule->set_min_learning_rate(min_lr);
  }
  if (plateau) {
    TRAINERD_ASSIGN_OR_RETURN(double min_lr,
                              GetDoubleIn(invocation, "min-lr", 0, 0, false, kInf, true));
    schedule->set_min_learning_rate(min_lr);
    if (invocation.Has("plateau-factor")) {
      TRAINERD_ASSIGN_OR_RETURN(double factor,
                                GetDoubleIn(invocation, "plateau-factor", 0, 0, true, 1, true));
      schedule->set_factor(factor);
    }
    if (invocation.Has("plateau-patience")) {
      TRAINERD_ASSIGN_OR_RETURN(int64_t patience,
                                invocation.GetInt("plateau-patience", 0, 0, kInt32Max));
      schedule->set_patience(static_cast<int32_t>(patience));
    }
    if (invocation.Has("plateau-threshold")) {
      TRAINERD_ASSIGN_OR_RETURN(double threshold,
                                GetDoubleIn(invocation, "plateau-threshold", 0, 0, false, 1, true));
      schedule->set_threshold(threshold);
    }
    TRAINERD_ASSIGN_OR_RETURN(int64_t cooldown,
                              invocation.GetInt("plateau-cooldown", 0, 0, kInt32Max));
    schedule->set_cooldown(static_cast<int32_t>(cooldown));
  }
  if (restarts) {
    if (!invocation.Has("t0")) {
      return absl::InvalidArgumentError("--schedule cosine_restarts needs --t0 N");
    }
    TRAINERD_ASSIGN_OR_RETURN(int64_t t_0, invocation.GetInt("t0", 0, 1, kInt32Max));
    schedule->set_t_0(static_cast<int32_t>(t_0));
    if (invocation.Has("t-mult")) {
      TRAINERD_ASSIGN_OR_RETURN(int64_t t_mult, invocation.GetInt("t-mult", 1, 1, kInt32Max));
      schedule->set_t_mult(static_cast<int32_t>(t_mult));
    }
  }
  if (onecycle) {
    if (invocation.Has("pct-start")) {
      TRAINERD_ASSIGN_OR_RETURN(double pct,
                                GetDoubleIn(invocation, "pct-start", 0, 0, false, 1, false));
      schedule->set_pct_start(pct);
    }
    if (invocation.Has("anneal-strategy")) {
      const std::string anneal = invocation.Get("anneal-strategy");
      if (anneal != "cos" && anneal != "linear") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--anneal-strategy: unknown strategy '", anneal, "' (expected cos or linear)"));
      }
      schedule->set_anneal_strategy(anneal);
    }
    for (const char* flag : {"div-factor", "final-div-factor"}) {
      if (!invocation.Has(flag)) continue;
      TRAINERD_ASSIGN_OR_RETURN(double factor, GetDoubleIn(invocation, flag, 0, 0, true, kInf, true));
      if (absl::string_view(flag) == "div-factor") {
        schedule->set_div_factor(factor);
      } else {
        schedule->set_final_div_factor(factor);
      }
    }
    schedule->set_three_phase(invocation.Has("three-phase"));
  }
  const bool per_step = invocation.Has("schedule-per-step");
  if (per_step && plateau) {
    return absl::InvalidArgumentError(
        "--schedule-per-step: plateau steps once per epoch, on the validation loss");
  }
  schedule->set_per_step(per_step);
  TRAINERD_ASSIGN_OR_RETURN(int64_t warmup,
                            invocation.GetInt("warmup-epochs", 0, 0, kInt32Max));
  TRAINERD_ASSIGN_OR_RETURN(int64_t warmup_steps,
                            invocation.GetInt("warmup-steps", 0, 0, kInt32Max));
  if ((warmup > 0 || warmup_steps > 0) && (onecycle || plateau)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--schedule ", invocation.Get("schedule"), " takes no --warmup-epochs or --warmup-steps"));
  }
  if (warmup > 0 && per_step) {
    return absl::InvalidArgumentError(
        "--warmup-epochs: a per-step schedule warms up by steps (--warmup-steps)");
  }
  if (warmup_steps > 0 && !per_step) {
    return absl::InvalidArgumentError("--warmup-steps needs --schedule-per-step");
  }
  schedule->set_warmup_epochs(static_cast<int32_t>(warmup));
  schedule->set_warmup_steps(static_cast<int32_t>(warmup_steps));
  TRAINERD_ASSIGN_OR_RETURN(double clip,
                            GetDoubleIn(invocation, "clip-grad-norm", 0, 0, false, kInf, true));
  spec.set_clip_grad_norm(clip);

  TRAINERD_ASSIGN_OR_RETURN(
      int64_t batch_size,
      invocation.GetInt("batch-size", kDefaultBatchSize, 1, std::numeric_limits<int64_t>::max()));
  spec.set_batch_size(batch_size);
  TRAINERD_ASSIGN_OR_RETURN(int64_t epochs,
                            invocation.GetInt("epochs", kDefaultEpochs, 1, kMaxEpochs));
  spec.set_epochs(static_cast<int32_t>(epochs));

  // The daemon checks these too (and the split against the dataset's rows); checking the flags
  // here turns a typo into an error before anything is sent.
  TRAINERD_ASSIGN_OR_RETURN(double validation_fraction,
                            GetDoubleIn(invocation, "validation-fraction", 0, 0, false, 1, true));
  if (invocation.Has("validation-dataset")) {
    if (invocation.Get("validation-dataset").empty()) {
      return absl::InvalidArgumentError("--validation-dataset needs a dataset name");
    }
    if (validation_fraction > 0) {
      return absl::InvalidArgumentError(
          "give either --validation-fraction or --validation-dataset, not both");
    }
    spec.set_validation_dataset(invocation.Get("validation-dataset"));
    TRAINERD_RETURN_IF_ERROR(ParseDatasetReference(spec.validation_dataset()).status());
  }
  spec.set_validation_fraction(validation_fraction);
  if (invocation.Has("validation-split-seed")) {
    TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "validation-split-seed",
                                          validation_fraction > 0, "--validation-fraction F"));
    TRAINERD_ASSIGN_OR_RETURN(uint64_t split_seed, invocation.GetUint("validation-split-seed", 0));
    spec.set_validation_split_seed(split_seed);
  }
  TRAINERD_ASSIGN_OR_RETURN(
      int64_t patience,
      invocation.GetInt("early-stop-patience", 0, 0, std::numeric_limits<int32_t>::max()));
  if (patience > 0 && validation_fraction == 0 && spec.validation_dataset().empty()) {
    return absl::InvalidArgumentError(
        "--early-stop-patience watches the validation loss; add --validation-fraction F or "
        "--validation-dataset NAME");
  }
  spec.set_early_stop_patience(static_cast<int32_t>(patience));
  if (invocation.Has("early-stop-min-delta")) {
    TRAINERD_RETURN_IF_ERROR(CheckApplies(invocation, "early-stop-min-delta", patience > 0,
                                          "early stopping (--early-stop-patience N)"));
    TRAINERD_ASSIGN_OR_RETURN(
        double min_delta, GetDoubleIn(invocation, "early-stop-min-delta", 0, 0, false, kInf, true));
    spec.set_early_stop_min_delta(min_delta);
  }
  if (invocation.Has("early-stop-metric")) {
    // What early stopping watches, and what a sweep's halving compares at its rungs.
    TRAINERD_RETURN_IF_ERROR(CheckApplies(
        invocation, "early-stop-metric", patience > 0 || invocation.Has("halving-min-epochs"),
        "early stopping (--early-stop-patience N) or a sweep's halving (--halving-min-epochs N)"));
    const std::string metric = invocation.Get("early-stop-metric");
    if (metric == "loss") {
      spec.set_early_stop_metric(v1::EARLY_STOP_METRIC_VALIDATION_LOSS);
    } else if (metric == "accuracy") {
      // The daemon checks the loss too, once a loss picked from the targets is known.
      if (spec.loss() != v1::LOSS_UNSPECIFIED && spec.loss() != v1::LOSS_CROSS_ENTROPY &&
          spec.loss() != v1::LOSS_NLL) {
        return absl::InvalidArgumentError(
            "--early-stop-metric accuracy needs a class loss (--loss cross_entropy or nll)");
      }
      spec.set_early_stop_metric(v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--early-stop-metric: unknown metric '",
                                                     metric, "' (expected loss or accuracy)"));
    }
  }
  if (invocation.Has("model-from")) {
    const std::string from = invocation.Get("model-from");
    if (from == "last") {
      spec.set_model_from(v1::MODEL_FROM_LAST);
    } else if (from == "best") {
      if (validation_fraction == 0 && spec.validation_dataset().empty()) {
        return absl::InvalidArgumentError(
            "--model-from best hands back the best validation epoch's weights; add "
            "--validation-fraction F or --validation-dataset NAME");
      }
      spec.set_model_from(v1::MODEL_FROM_BEST);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--model-from: unknown choice '", from,
                                                     "' (expected best or last)"));
    }
  }
  // Checked here as well as by the daemon, with the same limits (common/job_limits.h): a
  // checkpoint interval beyond --epochs would never fire, and a small one writes too many files.
  TRAINERD_ASSIGN_OR_RETURN(int64_t checkpoint_every,
                            invocation.GetInt("checkpoint-every", 0, 0, epochs));
  TRAINERD_RETURN_IF_ERROR(CheckEpochsAndCheckpoints(epochs, checkpoint_every));
  spec.set_checkpoint_every(static_cast<int32_t>(checkpoint_every));

  TRAINERD_ASSIGN_OR_RETURN(v1::Precision precision,
                            ParsePrecision(invocation.Get("precision", "fp32")));
  spec.set_precision(precision);
  TRAINERD_ASSIGN_OR_RETURN(v1::JobPriority priority,
                            ParsePriority(invocation.Get("priority", "normal")));
  spec.set_priority(priority);
  TRAINERD_ASSIGN_OR_RETURN(v1::Engine engine, ParseEngine(invocation.Get("engine", "auto")));
  spec.set_engine(engine);
  spec.set_shuffle(!invocation.Has("no-shuffle"));
  TRAINERD_ASSIGN_OR_RETURN(
      const int64_t accumulation,
      invocation.GetInt("gradient-accumulation-steps", 1, 1, std::numeric_limits<int32_t>::max()));
  if (accumulation > 1) spec.set_gradient_accumulation_steps(static_cast<int32_t>(accumulation));
  spec.set_drop_last(invocation.Has("drop-last"));
  // The daemon bounds it (--max_replicas); here only its type and sign.
  TRAINERD_ASSIGN_OR_RETURN(const int64_t replicas, invocation.GetInt("replicas", 1, 1, 1 << 20));
  if (replicas > 1) spec.set_replicas(static_cast<int32_t>(replicas));
  if (invocation.Has("nodes")) {
    if (replicas < 2 && !sweep) {
      return absl::InvalidArgumentError("--nodes places ranks: give --replicas N (N >= 2) too");
    }
    // A context's name stands for its address, which the daemon matches against its --peers.
    absl::StatusOr<ClientConfig> config = LoadClientConfig(ConfigPath(
        std::getenv("TRAINCTL_CONFIG"), std::getenv("XDG_CONFIG_HOME"), std::getenv("HOME")));
    for (absl::string_view node :
         absl::StrSplit(invocation.Get("nodes"), ',', absl::SkipWhitespace())) {
      const std::string name(absl::StripAsciiWhitespace(node));
      const ClientContext* context = config.ok() ? config->Find(name) : nullptr;
      if (name == "all" || name == "*") {
        spec.add_nodes("*");  // every peer the daemon knows (a context named "all" loses)
      } else if (context != nullptr) {
        spec.add_nodes(context->address);
      } else if (name.find(':') != std::string::npos) {
        spec.add_nodes(name);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--nodes: '", name,
                         "' is neither a context (trainctl config get-contexts) nor "
                         "HOST:PORT"));
      }
    }
    if (spec.nodes_size() == 0) return absl::InvalidArgumentError("--nodes needs a node");
  }
  if (invocation.Has("max-job-time")) {
    TRAINERD_ASSIGN_OR_RETURN(const absl::Duration duration,
                              ParseDurationFlag("--max-job-time", invocation.Get("max-job-time")));
    spec.set_max_job_seconds(absl::ToDoubleSeconds(duration));
  }
  if (invocation.Has("seed")) {
    TRAINERD_ASSIGN_OR_RETURN(uint64_t seed, invocation.GetUint("seed", 0));
    spec.set_seed(seed);
  }
  if (invocation.Has("device")) {
    if (invocation.Get("device").empty()) {
      return absl::InvalidArgumentError("--device needs a device, e.g. cpu, cuda or cuda:0");
    }
    spec.set_device(invocation.Get("device"));
  }
  return spec;
}

absl::StatusOr<std::string> ReadTorchScriptFlag(const Invocation& invocation) {
  if (!invocation.Has("torchscript")) return std::string();
  const std::string path = invocation.Get("torchscript");
  TRAINERD_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--torchscript: '", path, "' is empty"));
  }
  if (static_cast<int64_t>(bytes.size()) > kMaxTorchScriptBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--torchscript: '", path, "' has ", bytes.size(), " bytes; modules of at most ",
        kMaxTorchScriptBytes, " bytes can be sent (the daemon's message limit)"));
  }
  return bytes;
}

bool IsExportedProgramFile(absl::string_view bytes) {
  return absl::StartsWith(bytes, "PK\x03\x04") &&
         absl::StrContains(bytes, "/models/model.json");
}

absl::StatusOr<v1::JobState> ParseJobState(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "queued") return v1::JOB_STATE_QUEUED;
  if (lower == "running") return v1::JOB_STATE_RUNNING;
  if (lower == "succeeded") return v1::JOB_STATE_SUCCEEDED;
  if (lower == "failed") return v1::JOB_STATE_FAILED;
  if (lower == "cancelled" || lower == "canceled") return v1::JOB_STATE_CANCELLED;
  return absl::InvalidArgumentError(absl::StrCat(
      "--state must be queued, running, succeeded, failed or cancelled, not '", text, "'"));
}

}  // namespace trainerd::client
