#include "server/engine/training/loss.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
  return absl::OkStatus();
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
  if (dataset.target_min < 0 || dataset.target_max >= classes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dataset '%s' has class indices %d..%d but model '%s' outputs %d classes (0..%d)",
        dataset.name, dataset.target_min, dataset.target_max, spec.model, classes, classes - 1));
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
  return IsElementwise(spec.loss) ? CheckElementwiseLoss(spec, output_shape, dataset)
                                  : CheckClassLoss(spec, output_shape, dataset);
}

torch::Tensor ComputeLoss(const JobSpec& spec, const torch::Tensor& output,
                          const torch::Tensor& targets) {
  switch (spec.loss) {
    case LossKind::kMse:
      return F::mse_loss(output, targets.view(output.sizes()));
    case LossKind::kL1:
      return F::l1_loss(output, targets.view(output.sizes()));
    case LossKind::kHuber:
      return F::huber_loss(output, targets.view(output.sizes()),
                           F::HuberLossFuncOptions().delta(spec.huber_delta));
    case LossKind::kBceWithLogits:
      return F::binary_cross_entropy_with_logits(output, targets.view(output.sizes()));
    case LossKind::kCrossEntropy:
      return F::cross_entropy(output, targets.view({-1}),
                              F::CrossEntropyFuncOptions().label_smoothing(spec.label_smoothing));
    case LossKind::kNll:
      return F::nll_loss(output, targets.view({-1}));
  }
  return {};
}

}  // namespace trainerd::engine
