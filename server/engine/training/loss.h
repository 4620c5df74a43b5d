// Losses: which loss fits which model output and targets, and the loss of a batch.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "absl/status/status.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// Checks the loss and its options against the model's per-row output shape and the dataset's
// targets: INVALID_ARGUMENT with a sentence naming the loss, the model and the dataset.
//   mse, l1, huber, bce_with_logits: float32 targets shaped like the output. bce_with_logits also
//     wants targets in [0, 1]; that is not checked here (it would mean scanning the targets), and
//     values outside it train towards a meaningless optimum rather than failing.
//   cross_entropy, nll: int64 class indices, one per row, within the output's width (>= 2).
//   huber_delta > 0 (and left at 1 for other losses); label_smoothing in [0, 1) and only with
//   cross_entropy.
absl::Status CheckLoss(const JobSpec& spec, const std::vector<int64_t>& output_shape,
                       const DatasetMeta& dataset);

// The loss of a batch, reduced to its mean on the device, with spec.loss and its options
// (huber_delta, label_smoothing). `targets` is the batch's slice of the dataset's targets: the
// float losses reshape it to the output's shape, the class losses to one index per row.
torch::Tensor ComputeLoss(const JobSpec& spec, const torch::Tensor& output,
                          const torch::Tensor& targets);

}  // namespace trainerd::engine
