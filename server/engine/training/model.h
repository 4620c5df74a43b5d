// From a JobSpec to a LibTorch model: checking the whole spec against the dataset (the loss and
// optimizer parts in loss.h and optimizer.h) and building the module.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// Checks everything about a spec that can be known before training: hyper-parameter ranges, the
// model against the dataset's feature shape, the loss against the model's output and the
// dataset's targets. INVALID_ARGUMENT with a sentence that names what does not fit.
// Also the validation options: fraction in [0, 1) leaving at least one row on each side,
// fraction and validation dataset not both, patience >= 0 and only with validation.
// A TorchScript job (spec.torchscript set) gets an empty ModelSpec: its model and loss are
// checked by LoadTorchScriptModule (torchscript_module.h), which runs its forward.
absl::StatusOr<ModelSpec> CheckJobSpec(const JobSpec& spec, const DatasetMeta& dataset);
// The same for a spec whose model was parsed already (`model`, from spec.model; empty for a
// submitted module): admission parses a request's model once.
absl::Status CheckJobSpec(const JobSpec& spec, const ModelSpec& model, const DatasetMeta& dataset);

// Checks spec.validation_dataset's metadata (`validation`) against the training `dataset`: the
// same per-row feature and target shapes and target dtype, and targets the loss accepts (class
// indices within the model's outputs). Called after CheckJobSpec, which returned `model`.
// `output_shape`, when given, is the model's per-row output (a TorchScript job's, whose `model`
// is empty) and is used instead of inferring it from `model`.
absl::Status CheckValidationDataset(const JobSpec& spec, const ModelSpec& model,
                                    const DatasetMeta& dataset, const DatasetMeta& validation,
                                    const std::vector<int64_t>* output_shape = nullptr);

// Builds the model on the CPU (initialised from the default CPU generator, which the caller
// seeds); layers are named "0", "1", ... as in torch.nn.Sequential. Each layer gets its input
// size from the per-row shapes InferLayerShapes gives: conv2d its input channels, batchnorm
// BatchNorm1d for a per-row vector and BatchNorm2d for CxHxW, layernorm the whole per-row shape;
// softmax and logsoftmax act on dim 1 of the batch (the classes). Dropout draws its masks from
// `generator`, the job's generator on the device the model will run on (the default generator
// when none is given), so that the job's seed covers it; it is the identity in eval mode.
// Throws std::invalid_argument when the spec does not fit `input_shape` (CheckJobSpec refuses
// such a spec first).
torch::nn::Sequential BuildModel(const ModelSpec& spec, const std::vector<int64_t>& input_shape,
                                 std::optional<at::Generator> generator = std::nullopt);

}  // namespace trainerd::engine
