// Optimizers, learning-rate schedules and gradient clipping: checking their hyper-parameters,
// making the optimizer, the learning rate of each epoch, and clipping on the device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// Checks the optimizer, its options, the schedule and clip_grad_norm: INVALID_ARGUMENT with a
// sentence for an out-of-range value, or for an option the chosen optimizer or schedule does not
// take (e.g. "beta1 applies to adam and adamw; optimizer sgd does not take it").
absl::Status CheckOptimizer(const JobSpec& spec);

// The weight decay spec.optimizer applies: spec.weight_decay, unset 0 (adamw: 0.01).
double EffectiveWeightDecay(const JobSpec& spec);

// Why a hand-written path (fused, stacked), whose update arithmetic covers sgd, adam, adamw and
// rmsprop with their original options, cannot run spec's optimizer, e.g. "optimizer nadam runs
// on LibTorch's optimizers" or "amsgrad runs on LibTorch's optimizers"; "" when it can.
std::string HandWrittenOptimizerUnsupported(const JobSpec& spec);

// Whether MakeOptimizer gives spec a DeviceStepOptimizer (device_step_optimizer.h): nadam and
// radam always, adam, adamw and adagrad under fp16, so that a step the loss scaler skips leaves
// their step count unchanged.
bool UsesDeviceStepOptimizer(const JobSpec& spec);

// The optimizer of spec.optimizer with its options (unset ones take PyTorch's defaults; adamw's
// weight decay is 0.01), at spec.learning_rate: LibTorch's own (torch::optim) where it has one,
// else a DeviceStepOptimizer (nadam, radam), which adam, adamw and adagrad get too under fp16
// (UsesDeviceStepOptimizer). Under weight_decay_exclude_bias_and_norm, two parameter groups: the
// parameters of more than one dimension with the weight decay, then those of one or fewer with
// weight decay 0 (an empty group is left out).
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const JobSpec& spec,
                                                       std::vector<torch::Tensor> parameters);

// The learning rate of `epoch` (1-based) under spec.schedule; pure host arithmetic. The first
// warmup_epochs epochs ramp linearly: learning_rate * epoch / (warmup_epochs + 1). The schedule
// then runs over the remaining n = epochs - warmup_epochs epochs, e = 1..n:
//   constant: learning_rate
//   step:     learning_rate * gamma^floor((e - 1) / step_epochs)
//   cosine:   min + (learning_rate - min) * (1 + cos(pi * (e - 1) / n)) / 2
//             (PyTorch's CosineAnnealingLR with T_max = n: epoch e = 1 has the full rate).
double LearningRateForEpoch(const JobSpec& spec, int32_t epoch);

// Sets the learning rate of every parameter group of `optimizer`.
void SetLearningRate(torch::optim::Optimizer& optimizer, double learning_rate);

// Scales the gradients of `parameters` in place so that their global L2 norm
// sqrt(sum_i ||g_i||^2) is at most max_norm (> 0), all on the gradients' device: nothing is read
// back to the host (unlike torch::nn::utils::clip_grad_norm_). Parameters without a gradient are
// skipped. Returns the global norm before clipping, as a 0-d tensor on the device (undefined when
// no parameter has a gradient).
torch::Tensor ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace trainerd::engine
