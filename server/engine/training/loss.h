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
//   cross_entropy, nll: int64 class indices, one per row, within the output's width (>= 2); with
//     ignore_index, the dataset's smallest target may be a negative ignore_index (the targets
//     between it and 0 are then counted when the job starts, IgnoredTargetCounts: the range
//     cannot tell) and its largest may be an ignore_index equal to the class count.
//   huber_delta > 0 (and left at 1 for other losses); label_smoothing in [0, 1) and only with
//   cross_entropy; class_weights (cross_entropy, nll): one positive finite weight per class;
//   ignore_index: cross_entropy and nll only; pos_weight (bce_with_logits): one positive finite
//   weight per output column (the last dimension of the per-row output, 1 for a scalar). A list
//   of the wrong length is refused on its length before any value of it is read.
absl::Status CheckLoss(const JobSpec& spec, const std::vector<int64_t>& output_shape,
                       const DatasetMeta& dataset);

// The loss options as device tensors, made once per job (on `device`) rather than per batch.
struct LossTensors {
  torch::Tensor class_weights;  // float32 [classes], when spec.class_weights is set
  torch::Tensor pos_weight;     // float32 [columns], when spec.pos_weight is set
};
LossTensors MakeLossTensors(const JobSpec& spec, const torch::Device& device);

// The training loss of a batch, reduced on the device, with spec.loss and all its options
// (huber_delta, label_smoothing, class_weights, ignore_index, pos_weight), as torch.nn's loss
// with the same options and reduction 'mean' computes it: with class weights the mean is
// weighted (sum_i w[y_i] l_i / sum_i w[y_i]); with ignore_index it is over the rows not ignored,
// and a batch whose rows are all ignored has loss 0 and zero gradients where PyTorch gives NaN.
// `targets` is the batch's slice of the dataset's targets: the float losses reshape it to the
// output's shape, the class losses to one index per row. `tensors`: MakeLossTensors of the job
// (made here, on the output's device, when left empty).
torch::Tensor ComputeLoss(const JobSpec& spec, const torch::Tensor& output,
                          const torch::Tensor& targets, const LossTensors& tensors = {});

// A validation batch: adds its plain loss to `loss_sum` (float64 scalar) and, for a class loss,
// the rows whose largest output is their target to `correct` (int64 scalar). The plain loss is
// the loss without training-only terms (label_smoothing, class_weights, pos_weight), as an eval
// loop computes it. Without ignore_index it adds the batch's mean times its rows; with it, the
// sum over the rows not ignored (and ignored rows are never correct), so that the epoch's
// validation loss is the sum divided by ValidationRowsCounted.
void AddValidationBatch(const JobSpec& spec, const torch::Tensor& output,
                        const torch::Tensor& targets, torch::Tensor& loss_sum,
                        torch::Tensor* correct);

// With ignore_index: two int64 device scalars [counted, invalid] for `targets` (class targets on
// the device): how many are not ignored, and how many are negative without being the
// ignore_index. CheckLoss rules out every other bad target from the dataset's range; these are
// the ones it cannot, read by the job's loop in one transfer when it starts.
torch::Tensor IgnoredTargetCounts(const JobSpec& spec, const torch::Tensor& targets);

}  // namespace trainerd::engine
