#include "server/engine/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace trainerd::engine {
namespace {

bool IsScalarLike(const std::vector<int64_t>& shape) {
  return shape.empty() || (shape.size() == 1 && shape[0] == 1);
}

}  // namespace

absl::StatusOr<ModelSpec> CheckJobSpec(const JobSpec& spec, const DatasetMeta& dataset) {
  if (!(spec.learning_rate > 0) || !std::isfinite(spec.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be a positive number; got ", spec.learning_rate));
  }
  if (!(spec.momentum >= 0 && spec.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum must be in [0, 1); got ", spec.momentum));
  }
  if (spec.optimizer != OptimizerKind::kSgd && spec.momentum != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "momentum applies to sgd only; optimizer ", OptimizerKindName(spec.optimizer),
        " does not take it"));
  }
  if (spec.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be at least 1; got ", spec.batch_size));
  }
  if (spec.epochs < 1 || spec.epochs > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs must be between 1 and 1000000; got ", spec.epochs));
  }
  TRAINERD_ASSIGN_OR_RETURN(ModelSpec model, ParseModelSpec(spec.model));
  auto output = InferOutputShape(model, dataset.feature_shape);
  if (!output.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec.model, "' does not fit dataset '", dataset.name, "' (",
        ShapeToString(dataset.feature_shape), " features per row): ", output.status().message()));
  }
  const std::string out = ShapeToString(*output);
  switch (spec.loss) {
    case LossKind::kMse:
      if (dataset.target_dtype != TargetDType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss mse needs float32 targets; dataset '", dataset.name,
            "' has int64 class targets (use cross_entropy)"));
      }
      if (*output != dataset.target_shape &&
          !(IsScalarLike(*output) && IsScalarLike(dataset.target_shape))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss mse compares the model's output with the targets, but model '", spec.model,
            "' outputs ", out, " per row and dataset '", dataset.name, "' has ",
            ShapeToString(dataset.target_shape), " targets per row"));
      }
      break;
    case LossKind::kCrossEntropy: {
      if (dataset.target_dtype != TargetDType::kInt64) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss cross_entropy needs int64 class targets; dataset '", dataset.name,
            "' has float32 targets (upload with --target-dtype int64, or use mse)"));
      }
      if (!IsScalarLike(dataset.target_shape)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss cross_entropy needs one class index per row; dataset '", dataset.name,
            "' has ", ShapeToString(dataset.target_shape), " targets per row"));
      }
      if (output->size() != 1 || (*output)[0] < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss cross_entropy needs one score per class (at least 2) per row, but model '",
            spec.model, "' outputs ", out, " per row"));
      }
      const int64_t classes = (*output)[0];
      if (dataset.target_min < 0 || dataset.target_max >= classes) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "dataset '%s' has class indices %d..%d but model '%s' outputs %d classes (0..%d)",
            dataset.name, dataset.target_min, dataset.target_max, spec.model, classes,
            classes - 1));
      }
      break;
    }
  }
  return model;
}

torch::nn::Sequential BuildModel(const ModelSpec& spec, const std::vector<int64_t>& input_shape) {
  torch::nn::Sequential seq;
  int64_t width = input_shape.empty() ? 1 : input_shape.back();
  for (const LayerSpec& layer : spec.layers) {
    switch (layer.kind) {
      case LayerKind::kLinear:
        seq->push_back(torch::nn::Linear(width, layer.args[0]));
        width = layer.args[0];
        break;
      case LayerKind::kRelu:
        seq->push_back(torch::nn::ReLU());
        break;
      case LayerKind::kTanh:
        seq->push_back(torch::nn::Tanh());
        break;
      case LayerKind::kSigmoid:
        seq->push_back(torch::nn::Sigmoid());
        break;
    }
  }
  return seq;
}

torch::Tensor ComputeLoss(LossKind loss, const torch::Tensor& output,
                          const torch::Tensor& targets) {
  switch (loss) {
    case LossKind::kMse:
      return torch::mse_loss(output, targets.view(output.sizes()));
    case LossKind::kCrossEntropy:
      return torch::nn::functional::cross_entropy(output, targets.view({-1}));
  }
  return {};
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const JobSpec& spec,
                                                       std::vector<torch::Tensor> parameters) {
  switch (spec.optimizer) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGD>(
          std::move(parameters),
          torch::optim::SGDOptions(spec.learning_rate).momentum(spec.momentum));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(std::move(parameters),
                                                  torch::optim::AdamOptions(spec.learning_rate));
  }
  return nullptr;
}

}  // namespace trainerd::engine
