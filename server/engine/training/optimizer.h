// Optimizers, learning-rate schedules and gradient clipping: checking their hyper-parameters,
// making the optimizer, the learning rate of each epoch, and clipping on the device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <limits>
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

// The state of a ReduceLROnPlateau schedule (mode min, threshold_mode rel), which a checkpoint
// keeps: the current rate, the best validation loss so far (+inf before any), the epochs since it
// (num_bad_epochs) and the epochs of cooldown left.
struct PlateauState {
  double rate = 0;
  double best = std::numeric_limits<double>::infinity();
  int32_t bad_epochs = 0;
  int32_t cooldown_left = 0;
};

// A job's learning rate, step by step: pure host arithmetic, each kind as its twin in
// torch.optim.lr_scheduler stepped once per epoch (or once per optimizer step when per_step, and
// always for onecycle). With t the 0-based count of the schedule's units (epochs or steps) before
// the coming one, n the job's units (epochs, or epochs * steps per epoch) and w the warm-up's
// (warmup_epochs or warmup_steps): t < w ramps linearly, learning_rate * (t + 1) / (w + 1)
// (LinearLR(start_factor = 1 / (w + 1), total_iters = w)); the schedule then runs on u = t - w
// over N = n - w units:
//   constant:        learning_rate
//   step:            learning_rate * gamma^floor(u / step_epochs)                 (StepLR)
//   multistep:       learning_rate * gamma^(number of milestones <= u)            (MultiStepLR)
//   exponential:     learning_rate * gamma^u                                      (ExponentialLR)
//   cosine:          min + (learning_rate - min) * (1 + cos(pi * u / N)) / 2  (CosineAnnealingLR,
//                    T_max = N: the first unit has the full rate, none reaches min)
//   cosine_restarts: min + (learning_rate - min) * (1 + cos(pi * T_cur / T_i)) / 2
//                    (CosineAnnealingWarmRestarts: T_i starts at t_0, times t_mult each restart)
//   onecycle:        OneCycleLR(max_lr = learning_rate, total_steps = n) at step t, with
//                    cycle_momentum=False (the optimizer's momentum/beta1 stay as set); a phase
//                    of no length (pct_start * n == 1) gives its end rate
//   plateau:         ReduceLROnPlateau on each epoch's validation loss (EndEpoch)
class LearningRateSchedule {
 public:
  // `steps_per_epoch`: the job's optimizer steps in one epoch (>= 1).
  LearningRateSchedule(const JobSpec& spec, int64_t steps_per_epoch);

  // Whether the rate may change at every optimizer step (else only at an epoch's start).
  bool per_step() const { return per_step_; }
  // The schedule's units in the whole job (epochs, or steps when per_step).
  int64_t total_units() const { return total_units_; }
  // The rate of the coming optimizer step: the job's `step`-th (0-based, earlier runs included),
  // in `epoch` (1-based).
  double Rate(int32_t epoch, int64_t step) const;
  // The epoch's validation loss: plateau steps on it; the other kinds ignore it.
  void EndEpoch(double validation_loss);

  const PlateauState& plateau() const { return plateau_; }
  void set_plateau(const PlateauState& state) { plateau_ = state; }

 private:
  double OneCycleRate(int64_t step) const;

  const JobSpec& spec_;
  bool per_step_ = false;
  int64_t total_units_ = 1;
  PlateauState plateau_;
};

// The rate of `epoch` (1-based) under an epoch schedule (not per_step, not onecycle or plateau):
// LearningRateSchedule(spec, 1).Rate(epoch, epoch - 1).
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
