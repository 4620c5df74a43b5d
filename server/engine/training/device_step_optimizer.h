// Optimizers whose update depends on the step count (Adam, AdamW, NAdam, RAdam, Adagrad), with
// that count kept on the parameter's device as a float32 tensor, as torch.optim's
// `capturable=True` optimizers keep it, so that a step the loss scaler undoes on the device
// (precision.h, LossScaler::Step) leaves the step count where it was, exactly as
// torch.amp.GradScaler skipping optimizer.step() does, without reading anything back.
//
// The arithmetic is torch/optim's single-tensor code of each optimizer (adam.py, nadam.py,
// radam.py, adagrad.py) as it runs by default (capturable=False): the scalars it computes from
// the step in Python floats (bias corrections, NAdam's momentum cache, RAdam's rectification,
// Adagrad's decayed rate) are computed here in float64 on the device, and each is cast to float32
// where it meets a float32 tensor, as a Python float is. LibTorch has no NAdam or RAdam;
// MakeOptimizer (optimizer.h) uses these for them always, and for adam, adamw and adagrad under
// fp16.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace trainerd::engine {

enum class DeviceStepKind { kAdam, kAdamW, kNAdam, kRAdam, kAdagrad };

// One parameter group's hyper-parameters (each group may have its own weight decay). Saved under
// the keys LibTorch's AdamOptions and AdagradOptions use, so that a checkpoint of LibTorch's
// Adam or AdamW loads into DeviceStepOptimizer.
struct DeviceStepOptions : public torch::optim::OptimizerCloneableOptions<DeviceStepOptions> {
  explicit DeviceStepOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, amsgrad) = false;                  // adam, adamw
  TORCH_ARG(double, momentum_decay) = 4e-3;          // nadam
  TORCH_ARG(bool, decoupled_weight_decay) = false;   // nadam, radam (adamw: always)
  TORCH_ARG(double, lr_decay) = 0;                   // adagrad
  TORCH_ARG(double, initial_accumulator_value) = 0;  // adagrad

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

// A parameter's state. `step` is float32 [] on the parameter's device (torch.optim's capturable
// state); the others are shaped like the parameter, defined where the optimizer keeps them:
// exp_avg and exp_avg_sq (adam, adamw, nadam, radam), max_exp_avg_sq (amsgrad), mu_product
// (nadam, float32 [] starting at 1), sum (adagrad, starting at initial_accumulator_value).
struct DeviceStepParamState
    : public torch::optim::OptimizerCloneableParamState<DeviceStepParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, max_exp_avg_sq);
  TORCH_ARG(torch::Tensor, mu_product);
  TORCH_ARG(torch::Tensor, sum);

 public:
  // Reads "step" as a tensor or, from LibTorch's AdamParamState, as an integer (moved to the
  // parameter's device and made float32 by DeviceStepOptimizer::load).
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  // Every defined tensor, for the loss scaler's snapshot (step first).
  std::vector<torch::Tensor> tensors() const;
};

// The state of every parameter is created with the optimizer (zeros; Adagrad's sums at
// initial_accumulator_value; NAdam's mu_product 1), so that a step never creates state. A
// parameter without a gradient is skipped, as torch.optim skips it.
class DeviceStepOptimizer : public torch::optim::Optimizer {
 public:
  DeviceStepOptimizer(DeviceStepKind kind,
                      const std::vector<torch::optim::OptimizerParamGroup>& groups,
                      const DeviceStepOptions& defaults);

  DeviceStepKind kind() const { return kind_; }
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void InitState();

  DeviceStepKind kind_;
};

}  // namespace trainerd::engine
