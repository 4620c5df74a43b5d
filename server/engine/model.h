// From a JobSpec to LibTorch objects: checking the spec against the dataset, building the model,
// the loss and the optimizer.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "server/engine/types.h"
#include <torch/torch.h>

namespace trainerd::engine {

// Checks everything about a spec that can be known before training: hyper-parameter ranges, the
// model against the dataset's feature shape, the loss against the model's output and the
// dataset's targets. INVALID_ARGUMENT with a sentence that names what does not fit.
absl::StatusOr<ModelSpec> CheckJobSpec(const JobSpec& spec, const DatasetMeta& dataset);

// Builds the model on the CPU (initialised from the default CPU generator, which the caller
// seeds); layers are named "0", "1", ... as in torch.nn.Sequential.
torch::nn::Sequential BuildModel(const ModelSpec& spec, const std::vector<int64_t>& input_shape);

// The loss of a batch, reduced to its mean. `targets` is the batch's slice of the dataset's
// targets; mse reshapes it to the output's shape.
torch::Tensor ComputeLoss(LossKind loss, const torch::Tensor& output, const torch::Tensor& targets);

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const JobSpec& spec,
                                                       std::vector<torch::Tensor> parameters);

}  // namespace trainerd::engine
