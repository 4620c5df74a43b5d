#include "server/engine/training/precision.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <utility>

#include "server/engine/training/device_step_optimizer.h"

namespace trainerd::engine {
namespace {

// The state tensors of `optimizer` for one parameter that a step may change in place (defined
// ones only); empty before the optimizer's first step for that parameter. A DeviceStepOptimizer's
// step count is one of them; LibTorch's host-side step counters are not tensors and are not
// covered (see LossScaler).
std::vector<torch::Tensor> StateTensors(torch::optim::Optimizer& optimizer,
                                        const torch::Tensor& parameter) {
  std::vector<torch::Tensor> out;
  auto it = optimizer.state().find(parameter.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return out;
  torch::optim::OptimizerParamState* state = it->second.get();
  auto add = [&out](const torch::Tensor& t) {
    if (t.defined()) out.push_back(t);
  };
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state)) {
    add(s->momentum_buffer());
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(state)) {
    add(s->exp_avg());
    add(s->exp_avg_sq());
    add(s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
    add(s->exp_avg());
    add(s->exp_avg_sq());
    add(s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(state)) {
    add(s->square_avg());
    add(s->momentum_buffer());
    add(s->grad_avg());
  } else if (auto* s = dynamic_cast<DeviceStepParamState*>(state)) {
    for (torch::Tensor& t : s->tensors()) add(t);
  } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(state)) {
    add(s->sum());
  }
  return out;
}

}  // namespace

torch::ScalarType AutocastDtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return torch::kBFloat16;
    case Precision::kFp16:
      return torch::kHalf;
    case Precision::kFp32:
      break;
  }
  return torch::kFloat;
}

AutocastGuard::AutocastGuard(const torch::Device& device, Precision precision) {
  if (precision == Precision::kFp32) return;
  type_ = device.type();
  previous_enabled_ = at::autocast::is_autocast_enabled(type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(type_);
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::set_autocast_dtype(type_, AutocastDtype(precision));
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // As torch.autocast's __exit__: the outermost region drops the cached casts of the weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, previous_enabled_);
  at::autocast::set_autocast_dtype(type_, previous_dtype_);
}

LossScaler::LossScaler(const torch::Device& device, const Options& options) : options_(options) {
  const auto on_device = torch::TensorOptions().device(device);
  scale_ = torch::full({}, options.init_scale, on_device.dtype(torch::kFloat32));
  growth_tracker_ = torch::zeros({}, on_device.dtype(torch::kInt32));
  found_inf_ = torch::zeros({}, on_device.dtype(torch::kFloat32));
  skipped_ = torch::zeros({}, on_device.dtype(torch::kFloat64));
}

torch::Tensor LossScaler::Scale(const torch::Tensor& loss) const {
  return loss * scale_.to(loss.scalar_type());
}

void LossScaler::Unscale(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  found_inf_.zero_();
  if (grads.empty()) return;
  // PyTorch's GradScaler computes the reciprocal in float64 and rounds it once.
  const torch::Tensor inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
}

void LossScaler::Step(torch::optim::Optimizer& optimizer,
                      const std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  // Everything the step may change, and copies of what it was.
  std::vector<torch::Tensor> before;  // parameters and the state that existed before the step
  std::vector<torch::Tensor> saved;
  std::vector<size_t> state_count(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    before.push_back(parameters[i]);
    saved.push_back(parameters[i].clone());
    std::vector<torch::Tensor> state = StateTensors(optimizer, parameters[i]);
    state_count[i] = state.size();
    for (torch::Tensor& t : state) {
      saved.push_back(t.clone());
      before.push_back(std::move(t));
    }
  }
  optimizer.step();
  const torch::Tensor overflow = found_inf_.to(torch::kBool);
  for (size_t i = 0; i < before.size(); ++i) {
    before[i].copy_(torch::where(overflow, saved[i], before[i]));
  }
  // State that this step created (a parameter's first step) goes back to zeros: the value every
  // one of these buffers starts from, so the next step proceeds as a first step would. (SGD's
  // momentum buffer starts as a copy of the first gradient, which equals 0 * momentum + gradient.)
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::vector<torch::Tensor> state = StateTensors(optimizer, parameters[i]);
    for (size_t k = state_count[i]; k < state.size(); ++k) state[k].masked_fill_(overflow, 0);
  }
  skipped_.add_(found_inf_);
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
}

void LossScaler::CorrectStepCounters(torch::optim::Optimizer& optimizer, int64_t skipped) {
  if (skipped <= 0) return;
  auto wind_back = [skipped](auto* state) {
    state->step(std::max<int64_t>(0, state->step() - skipped));
  };
  for (auto& [key, state] : optimizer.state()) {
    (void)key;
    if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(state.get())) wind_back(s);
  }
}

void LossScaler::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", scale_);
  archive.write("growth_tracker", growth_tracker_);
}

void LossScaler::Load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale;
  torch::Tensor growth_tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", growth_tracker);
  torch::NoGradGuard no_grad;
  scale_.copy_(scale);
  growth_tracker_.copy_(growth_tracker);
}

}  // namespace trainerd::engine
