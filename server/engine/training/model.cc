// CheckJobSpec (the whole spec against the dataset, before a job is queued) and BuildModel (the
// LibTorch module for a text model spec).
#include "server/engine/training/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_limits.h"
#include "common/status_macros.h"
#include "server/engine/training/loss.h"
#include "server/engine/training/optimizer.h"

namespace trainerd::engine {
namespace {

// Inverted dropout whose masks come from a given generator (the job's), so that the job's seed
// reproduces them; torch::nn::Dropout always draws from the default generator. Training mode:
// x * mask / (1 - p) with mask ~ Bernoulli(1 - p), all on the input's device; eval mode: x.
// Owned by the model; not thread-safe (a generator is shared with the job's shuffling, and both
// run on the job's one worker thread).
class SeededDropoutImpl : public torch::nn::Module {
 public:
  SeededDropoutImpl(double rate, std::optional<at::Generator> generator)
      : rate_(rate), generator_(std::move(generator)) {}

  torch::Tensor forward(const torch::Tensor& input) {
    if (!is_training() || rate_ == 0.0) return input;
    const double keep = 1.0 - rate_;
    torch::Tensor mask = torch::empty_like(input).bernoulli_(keep, generator_);
    return input * mask.div_(keep);
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "SeededDropout(p=" << rate_ << ")";
  }

 private:
  double rate_;
  std::optional<at::Generator> generator_;
};
TORCH_MODULE(SeededDropout);

// BatchNorm in training mode needs more than one value per channel: a batch of one row fails
// when each row has a single value per channel (a vector, or CxHxW with H*W == 1).
absl::Status CheckBatchNormBatch(const JobSpec& spec, const ModelSpec& model,
                                 const DatasetMeta& dataset) {
  // Only the training rows form training batches; validation runs in eval mode, where batchnorm
  // uses its running statistics and any batch size works.
  const int64_t training_rows = dataset.rows - HeldOutRows(spec.validation_fraction, dataset.rows);
  if (std::min<int64_t>(spec.batch_size, training_rows) != 1) return absl::OkStatus();
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> shapes,
                            InferLayerShapes(model, dataset.feature_shape));
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const std::vector<int64_t>& in = shapes[i];
    if (model.layers[i].kind != LayerKind::kBatchNorm) continue;
    if (in.size() == 1 || (in.size() == 3 && in[1] * in[2] == 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", i + 1, " (batchnorm) needs at least 2 rows per batch to train on ",
          ShapeToString(in), " rows; the batch size is ", spec.batch_size, " and dataset '",
          dataset.name, "' has ", dataset.rows, " rows",
          training_rows < dataset.rows ? absl::StrCat(", ", training_rows, " of them to train on")
                                       : ""));
    }
  }
  return absl::OkStatus();
}

// The validation options that can be checked without the second dataset: ranges, exclusivity,
// and a split that leaves rows on both sides.
absl::Status CheckValidationOptions(const JobSpec& spec, const DatasetMeta& dataset) {
  const double f = spec.validation_fraction;
  if (!(f >= 0 && f < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation fraction must be in [0, 1); got ", f));
  }
  if (f > 0 && !spec.validation_dataset.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("give either a validation fraction (", f,
                                                   ") or a validation dataset ('",
                                                   spec.validation_dataset, "'), not both"));
  }
  if (spec.halving.has_value()) {
    const HalvingSpec& halving = *spec.halving;
    if (halving.min_epochs < 1 || halving.min_epochs >= spec.epochs) {
      return absl::InvalidArgumentError(
          absl::StrCat("halving's first rung must be at least 1 epoch and below the ", spec.epochs,
                       " epochs a member trains; got ", halving.min_epochs));
    }
    if (halving.reduction_factor < 2 || halving.reduction_factor > 100) {
      return absl::InvalidArgumentError(absl::StrCat(
          "halving's reduction factor must be 2 to 100; got ", halving.reduction_factor));
    }
  }
  if (spec.split_seed.has_value() && !(f > 0)) {
    return absl::InvalidArgumentError(
        "a validation split seed draws the rows a validation fraction holds out; give a "
        "validation fraction too");
  }
  if (spec.early_stop_patience < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("early stop patience must be 0 (off) or a number of epochs; got ",
                     spec.early_stop_patience));
  }
  if (spec.early_stop_patience > 0 && !spec.has_validation()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "early stopping (patience ", spec.early_stop_patience,
        ") watches the validation loss; give a validation fraction or a validation dataset"));
  }
  if (!(spec.early_stop_min_delta >= 0) || std::isinf(spec.early_stop_min_delta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("early stop min_delta must be a finite number >= 0 (0: any improvement); got ",
                     spec.early_stop_min_delta));
  }
  if (spec.early_stop_patience == 0 && spec.early_stop_min_delta != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("early stop min_delta (", spec.early_stop_min_delta,
                     ") applies to early stopping; give early_stop_patience N (>= 1) too"));
  }
  if (spec.early_stop_metric == EarlyStopMetric::kValidationAccuracy) {
    // What early stopping watches, and what a sweep's halving compares at its rungs.
    if (spec.early_stop_patience == 0 && !spec.halving.has_value()) {
      return absl::InvalidArgumentError(
          "early stop metric accuracy applies to early stopping and halving; give "
          "early_stop_patience N (>= 1) or a sweep's halving too");
    }
    if (spec.loss != LossKind::kCrossEntropy && spec.loss != LossKind::kNll) {
      return absl::InvalidArgumentError(
          absl::StrCat("early stop metric accuracy needs a class loss (cross_entropy or nll), not ",
                       LossKindName(spec.loss), "; watch the validation loss instead"));
    }
  }
  if (spec.model_from == ModelFrom::kBest && !spec.has_validation()) {
    return absl::InvalidArgumentError(
        "model_from best hands back the best validation epoch's weights; give a validation "
        "fraction or a validation dataset, or model_from last");
  }
  if (f > 0) {
    const int64_t held_out = HeldOutRows(f, dataset.rows);
    if (held_out < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("validation fraction ", f, " of dataset '", dataset.name, "' (",
                       dataset.rows, " rows) holds out no rows; use a larger fraction"));
    }
    if (held_out >= dataset.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("validation fraction ", f, " of dataset '", dataset.name, "' (",
                       dataset.rows, " rows) leaves no rows to train on; use a smaller fraction"));
    }
  }
  return absl::OkStatus();
}

// What CheckJobSpec checks of a spec apart from its model: the optimizer, the batch, the epochs
// and checkpoints, the validation options, accumulation and drop_last.
absl::Status CheckSpecOptions(const JobSpec& spec, const DatasetMeta& dataset) {
  TRAINERD_RETURN_IF_ERROR(CheckOptimizer(spec));
  if (spec.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be at least 1; got ", spec.batch_size));
  }
  TRAINERD_RETURN_IF_ERROR(CheckEpochsAndCheckpoints(spec.epochs, spec.checkpoint_every));
  TRAINERD_RETURN_IF_ERROR(CheckValidationOptions(spec, dataset));
  if (spec.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient accumulation steps must be at least 1 (1: a step per batch); got ",
                     spec.gradient_accumulation_steps));
  }
  if (spec.drop_last) {
    // A data-parallel job drops its short last global batch (replicas * batch_size rows).
    const int64_t training_rows =
        dataset.rows - HeldOutRows(spec.validation_fraction, dataset.rows);
    const int64_t ranks = std::max<int32_t>(1, spec.replicas);
    if (spec.batch_size > training_rows / ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("drop_last with batch size ", spec.batch_size,
                       ranks > 1 ? absl::StrCat(" on ", ranks, " ranks") : "",
                       " would drop every row: dataset '", dataset.name, "' has ", training_rows,
                       " rows to train on; use a batch size of at most ", training_rows / ranks,
                       " or keep the last batch"));
    }
  }
  return absl::OkStatus();
}

// A submitted module's spec names no model of its own: the module is checked by
// LoadTorchScriptModule.
absl::Status CheckNoModelBesideModule(const JobSpec& spec) {
  // "torchscript" is accepted as well as "", so that a spec can say what it trains.
  if (!spec.model.empty() && spec.model != "torchscript" && spec.model != "exported") {
    return absl::InvalidArgumentError(absl::StrCat("give either a model spec ('", spec.model,
                                                   "') or a TorchScript module, not both"));
  }
  return absl::OkStatus();
}

// The parsed model against the dataset: its layers on the features, batchnorm's batch, the loss
// on its output and the targets.
absl::Status CheckModelAgainstDataset(const JobSpec& spec, const ModelSpec& model,
                                      const DatasetMeta& dataset) {
  auto output = InferOutputShape(model, dataset.feature_shape);
  if (!output.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec.model, "' does not fit dataset '", dataset.name, "' (",
        ShapeToString(dataset.feature_shape), " features per row): ", output.status().message()));
  }
  TRAINERD_RETURN_IF_ERROR(CheckBatchNormBatch(spec, model, dataset));
  TRAINERD_RETURN_IF_ERROR(CheckLoss(spec, *output, dataset));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> CheckJobSpec(const JobSpec& spec, const DatasetMeta& dataset) {
  TRAINERD_RETURN_IF_ERROR(CheckSpecOptions(spec, dataset));
  if (!spec.torchscript.empty()) {
    TRAINERD_RETURN_IF_ERROR(CheckNoModelBesideModule(spec));
    return ModelSpec{};
  }
  TRAINERD_ASSIGN_OR_RETURN(ModelSpec model, ParseModelSpec(spec.model));
  TRAINERD_RETURN_IF_ERROR(CheckModelAgainstDataset(spec, model, dataset));
  return model;
}

absl::Status CheckJobSpec(const JobSpec& spec, const ModelSpec& model, const DatasetMeta& dataset) {
  TRAINERD_RETURN_IF_ERROR(CheckSpecOptions(spec, dataset));
  if (!spec.torchscript.empty()) return CheckNoModelBesideModule(spec);
  return CheckModelAgainstDataset(spec, model, dataset);
}

absl::Status CheckValidationDataset(const JobSpec& spec, const ModelSpec& model,
                                    const DatasetMeta& dataset, const DatasetMeta& validation,
                                    const std::vector<int64_t>* output_shape) {
  if (validation.feature_shape != dataset.feature_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation dataset '", validation.name, "' has ",
                     ShapeToString(validation.feature_shape), " features per row; dataset '",
                     dataset.name, "' has ", ShapeToString(dataset.feature_shape)));
  }
  if (validation.target_shape != dataset.target_shape ||
      validation.target_dtype != dataset.target_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation dataset '", validation.name, "' has ", ShapeToString(validation.target_shape),
        " ", TargetDTypeName(validation.target_dtype), " targets per row; dataset '", dataset.name,
        "' has ", ShapeToString(dataset.target_shape), " ", TargetDTypeName(dataset.target_dtype),
        " targets"));
  }
  // The same loss checks again: above all the class-index range, since an index past the
  // model's outputs would fail the job in its first validation pass (or assert on a GPU).
  if (output_shape != nullptr) return CheckLoss(spec, *output_shape, validation);
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<int64_t> output,
                            InferOutputShape(model, validation.feature_shape));
  return CheckLoss(spec, output, validation);
}

torch::nn::Sequential BuildModel(const ModelSpec& spec, const std::vector<int64_t>& input_shape,
                                 std::optional<at::Generator> generator) {
  const absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      InferLayerShapes(spec, input_shape);
  if (!shapes.ok()) throw std::invalid_argument(std::string(shapes.status().message()));
  torch::nn::Sequential seq;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    const std::vector<int64_t>& in = (*shapes)[i];  // this layer's per-row input shape
    switch (layer.kind) {
      case LayerKind::kLinear:
        seq->push_back(torch::nn::Linear(in.back(), layer.args[0]));
        break;
      case LayerKind::kConv2d: {
        // A hand-built spec may leave out stride and padding; the parser always fills them in.
        const int64_t stride = layer.args.size() > 2 ? layer.args[2] : 1;
        const int64_t padding = layer.args.size() > 3 ? layer.args[3] : 0;
        seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(/*in_channels=*/in[0],
                                                                  /*out_channels=*/layer.args[0],
                                                                  /*kernel_size=*/layer.args[1])
                                             .stride(stride)
                                             .padding(padding)));
        break;
      }
      case LayerKind::kMaxPool2d:  // stride defaults to the kernel size
        seq->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(layer.args[0])));
        break;
      case LayerKind::kAvgPool2d:
        seq->push_back(torch::nn::AvgPool2d(torch::nn::AvgPool2dOptions(layer.args[0])));
        break;
      case LayerKind::kFlatten:
        seq->push_back(torch::nn::Flatten(torch::nn::FlattenOptions().start_dim(1)));
        break;
      case LayerKind::kDropout:
        seq->push_back(SeededDropout(layer.rate, generator));
        break;
      case LayerKind::kBatchNorm:
        if (in.size() == 1) {
          seq->push_back(torch::nn::BatchNorm1d(/*num_features=*/in[0]));
        } else {
          seq->push_back(torch::nn::BatchNorm2d(/*num_features=*/in[0]));
        }
        break;
      case LayerKind::kLayerNorm:
        seq->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions(in)));
        break;
      case LayerKind::kRelu:
        seq->push_back(torch::nn::ReLU());
        break;
      case LayerKind::kGelu:
        seq->push_back(torch::nn::GELU());
        break;
      case LayerKind::kTanh:
        seq->push_back(torch::nn::Tanh());
        break;
      case LayerKind::kSigmoid:
        seq->push_back(torch::nn::Sigmoid());
        break;
      case LayerKind::kSoftmax:
        seq->push_back(torch::nn::Softmax(/*dim=*/1));
        break;
      case LayerKind::kLogSoftmax:
        seq->push_back(torch::nn::LogSoftmax(/*dim=*/1));
        break;
    }
  }
  return seq;
}

}  // namespace trainerd::engine
