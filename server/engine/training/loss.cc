#include "server/engine/training/loss.h"

#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace trainerd::engine {
namespace {

namespace F = torch::nn::functional;

bool IsScalarLike(const std::vector<int64_t>& shape) {
  return shape.empty() || (shape.size() == 1 && shape[0] == 1);
}

// Whether the loss compares float32 targets with the output element by element (as opposed to
// taking class indices).
bool IsElementwise(LossKind loss) {
  switch (loss) {
    case LossKind::kMse:
    case LossKind::kL1:
    case LossKind::kHuber:
    case LossKind::kBceWithLogits:
      return true;
    case LossKind::kCrossEntropy:
    case LossKind::kNll:
      return false;
  }
  return false;
}

// A loss's weight list (class_weights, pos_weight): empty, or `count` positive finite values. The
// length is checked first, so that no value of an over-long list is read.
absl::Status CheckWeightList(const char* option, const std::vector<double>& values, int64_t count,
                             const std::string& of_what) {
  if (values.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(values.size()) != count) {
    return absl::InvalidArgumentError(absl::StrCat(option, " needs one weight for each of ",
                                                   of_what, "; got ", values.size(), " values"));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(values[i] > 0) || !std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          option, " values must be positive finite numbers; value ", i, " is ", values[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckElementwiseLoss(const JobSpec& spec, const std::vector<int64_t>& output,
                                  const DatasetMeta& dataset) {
  const char* name = LossKindName(spec.loss);
  if (dataset.target_dtype != TargetDType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", name, " needs float32 targets; dataset '", dataset.name,
                     "' has int64 class targets (use cross_entropy or nll)"));
  }
  if (output != dataset.target_shape &&
      !(IsScalarLike(output) && IsScalarLike(dataset.target_shape))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss ", name, " compares the model's output with the targets, but model '", spec.model,
        "' outputs ", ShapeToString(output), " per row and dataset '", dataset.name, "' has ",
        ShapeToString(dataset.target_shape), " targets per row"));
  }
  const int64_t columns = output.empty() ? 1 : output.back();
  return CheckWeightList(
      "pos_weight", spec.pos_weight, columns,
      absl::StrCat("the model's ", columns, " output column", columns == 1 ? "" : "s"));
}

absl::Status CheckClassLoss(const JobSpec& spec, const std::vector<int64_t>& output,
                            const DatasetMeta& dataset) {
  const char* name = LossKindName(spec.loss);
  if (dataset.target_dtype != TargetDType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", name, " needs int64 class targets; dataset '", dataset.name,
                     "' has float32 targets (upload with --target-dtype int64, or use mse)"));
  }
  if (!IsScalarLike(dataset.target_shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", name, " needs one class index per row; dataset '", dataset.name,
                     "' has ", ShapeToString(dataset.target_shape), " targets per row"));
  }
  if (output.size() != 1 || output[0] < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss ", name, " needs one ", spec.loss == LossKind::kNll ? "log-probability" : "score",
        " per class (at least 2) per row, but model '", spec.model, "' outputs ",
        ShapeToString(output), " per row"));
  }
  const int64_t classes = output[0];
  TRAINERD_RETURN_IF_ERROR(CheckWeightList("class_weights", spec.class_weights, classes,
                                           absl::StrCat("the model's ", classes, " classes")));
  // Without ignore_index every target must be a class. With it, the smallest target may be a
  // negative ignore_index (the targets between it and 0 are counted when the job starts) and the
  // largest may be the ignore_index `classes` (nothing lies between it and the last class).
  const std::optional<int64_t>& ignore = spec.ignore_index;
  const bool low_ok = dataset.target_min >= 0 ||
                      (ignore.has_value() && *ignore < 0 && dataset.target_min == *ignore);
  const bool high_ok = dataset.target_max < classes ||
                       (ignore.has_value() && *ignore == classes && dataset.target_max == classes);
  if (!low_ok || !high_ok) {
    std::string why = absl::StrFormat(
        "dataset '%s' has class indices %d..%d but model '%s' outputs %d classes (0..%d)",
        dataset.name, dataset.target_min, dataset.target_max, spec.model, classes, classes - 1);
    if (ignore.has_value()) {
      absl::StrAppend(&why, "; with ignore_index ", *ignore,
                      " the targets outside the classes must all be that value, which needs a "
                      "negative ignore_index (such as -100) or one equal to the class count (",
                      classes, ")");
    }
    return absl::InvalidArgumentError(why);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLoss(const JobSpec& spec, const std::vector<int64_t>& output_shape,
                       const DatasetMeta& dataset) {
  const char* name = LossKindName(spec.loss);
  if (!(spec.huber_delta > 0) || !std::isfinite(spec.huber_delta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("huber delta must be a positive number; got ", spec.huber_delta));
  }
  if (spec.loss != LossKind::kHuber && spec.huber_delta != 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("huber delta applies to loss huber only; loss ", name, " does not take it"));
  }
  if (!(spec.label_smoothing >= 0 && spec.label_smoothing < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label smoothing must be in [0, 1); got ", spec.label_smoothing));
  }
  if (spec.loss != LossKind::kCrossEntropy && spec.label_smoothing != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "label smoothing applies to loss cross_entropy only; loss ", name, " does not take it"));
  }
  const bool class_loss = spec.loss == LossKind::kCrossEntropy || spec.loss == LossKind::kNll;
  if (!spec.class_weights.empty() && !class_loss) {
    return absl::InvalidArgumentError(
        absl::StrCat("class_weights apply to losses cross_entropy and nll only; loss ", name,
                     " does not take them"));
  }
  if (spec.ignore_index.has_value() && !class_loss) {
    return absl::InvalidArgumentError(
        absl::StrCat("ignore_index applies to losses cross_entropy and nll only; loss ", name,
                     " does not take it"));
  }
  if (!spec.pos_weight.empty() && spec.loss != LossKind::kBceWithLogits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pos_weight applies to loss bce_with_logits only; loss ", name, " does not take it"));
  }
  return IsElementwise(spec.loss) ? CheckElementwiseLoss(spec, output_shape, dataset)
                                  : CheckClassLoss(spec, output_shape, dataset);
}

LossTensors MakeLossTensors(const JobSpec& spec, const torch::Device& device) {
  LossTensors tensors;
  const auto floats = torch::TensorOptions(torch::kFloat32);
  auto to_tensor = [&](const std::vector<double>& values) {
    std::vector<float> narrow(values.begin(), values.end());
    return torch::tensor(narrow, floats).to(device);
  };
  if (!spec.class_weights.empty()) tensors.class_weights = to_tensor(spec.class_weights);
  if (!spec.pos_weight.empty()) tensors.pos_weight = to_tensor(spec.pos_weight);
  return tensors;
}

namespace {

// The options a loss is computed with: the job's (training) or the plain ones (validation).
struct LossTerms {
  double label_smoothing = 0.0;
  torch::Tensor class_weights;  // undefined: none
  std::optional<int64_t> ignore_index;
  torch::Tensor pos_weight;  // undefined: none
};

// A class loss's sum over the batch's rows not ignored (weighted), and that sum's divisor:
// the rows' weights summed (their count without weights), or 1 when every row is ignored, so
// that such a batch gives 0 and zero gradients rather than PyTorch's 0/0.
torch::Tensor IgnoringClassLoss(LossKind loss, const LossTerms& terms, const torch::Tensor& output,
                                const torch::Tensor& target) {
  const int64_t ignore = *terms.ignore_index;
  torch::Tensor sum;
  if (loss == LossKind::kCrossEntropy) {
    auto options = F::CrossEntropyFuncOptions()
                       .ignore_index(ignore)
                       .label_smoothing(terms.label_smoothing)
                       .reduction(torch::kSum);
    if (terms.class_weights.defined()) options.weight(terms.class_weights);
    sum = F::cross_entropy(output, target, options);
  } else {
    auto options = F::NLLLossFuncOptions().ignore_index(ignore).reduction(torch::kSum);
    if (terms.class_weights.defined()) options.weight(terms.class_weights);
    sum = F::nll_loss(output, target, options);
  }
  const torch::Tensor kept = target.ne(ignore);
  torch::Tensor divisor;
  if (terms.class_weights.defined()) {
    // An ignored target (which may lie outside the classes) reads class 0's weight, then drops.
    const torch::Tensor safe = target.masked_fill(kept.logical_not(), 0);
    divisor = terms.class_weights.index_select(/*dim=*/0, safe).mul(kept).sum();
  } else {
    divisor = kept.sum().to(sum.scalar_type());
  }
  return sum / torch::where(divisor.gt(0), divisor, torch::ones_like(divisor));
}

torch::Tensor LossWith(LossKind loss, double huber_delta, const LossTerms& terms,
                       const torch::Tensor& output, const torch::Tensor& targets) {
  switch (loss) {
    case LossKind::kMse:
      return F::mse_loss(output, targets.view(output.sizes()));
    case LossKind::kL1:
      return F::l1_loss(output, targets.view(output.sizes()));
    case LossKind::kHuber:
      return F::huber_loss(output, targets.view(output.sizes()),
                           F::HuberLossFuncOptions().delta(huber_delta));
    case LossKind::kBceWithLogits: {
      auto options = F::BinaryCrossEntropyWithLogitsFuncOptions();
      if (terms.pos_weight.defined()) options.pos_weight(terms.pos_weight);
      return F::binary_cross_entropy_with_logits(output, targets.view(output.sizes()), options);
    }
    case LossKind::kCrossEntropy: {
      if (terms.ignore_index.has_value()) {
        return IgnoringClassLoss(loss, terms, output, targets.view({-1}));
      }
      auto options = F::CrossEntropyFuncOptions().label_smoothing(terms.label_smoothing);
      if (terms.class_weights.defined()) options.weight(terms.class_weights);
      return F::cross_entropy(output, targets.view({-1}), options);
    }
    case LossKind::kNll: {
      if (terms.ignore_index.has_value()) {
        return IgnoringClassLoss(loss, terms, output, targets.view({-1}));
      }
      auto options = F::NLLLossFuncOptions();
      if (terms.class_weights.defined()) options.weight(terms.class_weights);
      return F::nll_loss(output, targets.view({-1}), options);
    }
  }
  return {};
}

}  // namespace

torch::Tensor ComputeLoss(const JobSpec& spec, const torch::Tensor& output,
                          const torch::Tensor& targets, const LossTensors& tensors) {
  LossTerms terms;
  terms.label_smoothing = spec.label_smoothing;
  terms.ignore_index = spec.ignore_index;
  const bool made = (spec.class_weights.empty() || tensors.class_weights.defined()) &&
                    (spec.pos_weight.empty() || tensors.pos_weight.defined());
  const LossTensors own = made ? LossTensors{} : MakeLossTensors(spec, output.device());
  const LossTensors& use = made ? tensors : own;
  terms.class_weights = use.class_weights;
  terms.pos_weight = use.pos_weight;
  return LossWith(spec.loss, spec.huber_delta, terms, output, targets);
}

void AddValidationBatch(const JobSpec& spec, const torch::Tensor& output,
                        const torch::Tensor& targets, torch::Tensor& loss_sum,
                        torch::Tensor* correct) {
  LossTerms plain;  // no label smoothing, class weights or pos_weight
  const bool class_loss = spec.loss == LossKind::kCrossEntropy || spec.loss == LossKind::kNll;
  if (!spec.ignore_index.has_value()) {
    loss_sum.add_(LossWith(spec.loss, spec.huber_delta, plain, output, targets),
                  /*alpha=*/static_cast<double>(output.size(0)));
    if (class_loss && correct != nullptr) {
      correct->add_(output.argmax(/*dim=*/1).eq(targets.reshape({-1})).sum());
    }
    return;
  }
  const int64_t ignore = *spec.ignore_index;
  const torch::Tensor target = targets.reshape({-1});
  torch::Tensor sum =
      spec.loss == LossKind::kCrossEntropy
          ? F::cross_entropy(
                output, target,
                F::CrossEntropyFuncOptions().ignore_index(ignore).reduction(torch::kSum))
          : F::nll_loss(output, target,
                        F::NLLLossFuncOptions().ignore_index(ignore).reduction(torch::kSum));
  loss_sum.add_(sum.to(torch::kFloat64));
  if (correct != nullptr) {
    correct->add_(output.argmax(/*dim=*/1).eq(target).logical_and(target.ne(ignore)).sum());
  }
}

torch::Tensor IgnoredTargetCounts(const JobSpec& spec, const torch::Tensor& targets) {
  const int64_t ignore = spec.ignore_index.value_or(0);
  const torch::Tensor t = targets.reshape({-1});
  const torch::Tensor ignored = t.eq(ignore);
  const torch::Tensor counted = ignored.logical_not().sum();
  const torch::Tensor invalid = t.lt(0).logical_and(ignored.logical_not()).sum();
  return torch::stack({counted, invalid});
}

}  // namespace trainerd::engine
