#include "server/engine/training/device_step_optimizer.h"

#include <string>
#include <tuple>
#include <utility>

namespace trainerd::engine {
namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

template <typename T>
void ReadIfPresent(InputArchive& archive, const char* key, T& value) {
  c10::IValue ivalue;
  if (archive.try_read(key, ivalue)) value = ivalue.to<T>();
}

torch::Tensor ReadTensor(InputArchive& archive, const char* key) {
  c10::IValue ivalue;
  if (!archive.try_read(key, ivalue)) return {};
  return ivalue.toTensor();
}

void WriteIfDefined(OutputArchive& archive, const char* key, const torch::Tensor& value) {
  if (value.defined()) archive.write(key, c10::IValue(value));
}

}  // namespace

void DeviceStepOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("betas", c10::IValue(std::make_tuple(beta1(), beta2())));
  archive.write("eps", c10::IValue(eps()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("amsgrad", c10::IValue(amsgrad()));
  archive.write("momentum_decay", c10::IValue(momentum_decay()));
  archive.write("decoupled_weight_decay", c10::IValue(decoupled_weight_decay()));
  archive.write("lr_decay", c10::IValue(lr_decay()));
  archive.write("initial_accumulator_value", c10::IValue(initial_accumulator_value()));
}

void DeviceStepOptions::serialize(InputArchive& archive) {
  // Every key may be missing (a LibTorch Adam's options have the first five only); what is
  // missing keeps its value here.
  ReadIfPresent(archive, "lr", lr());
  std::tuple<double, double> betas{beta1(), beta2()};
  ReadIfPresent(archive, "betas", betas);
  beta1(std::get<0>(betas));
  beta2(std::get<1>(betas));
  ReadIfPresent(archive, "eps", eps());
  ReadIfPresent(archive, "weight_decay", weight_decay());
  ReadIfPresent(archive, "amsgrad", amsgrad());
  ReadIfPresent(archive, "momentum_decay", momentum_decay());
  ReadIfPresent(archive, "decoupled_weight_decay", decoupled_weight_decay());
  ReadIfPresent(archive, "lr_decay", lr_decay());
  ReadIfPresent(archive, "initial_accumulator_value", initial_accumulator_value());
}

void DeviceStepParamState::serialize(OutputArchive& archive) const {
  WriteIfDefined(archive, "step", step());
  WriteIfDefined(archive, "exp_avg", exp_avg());
  WriteIfDefined(archive, "exp_avg_sq", exp_avg_sq());
  WriteIfDefined(archive, "max_exp_avg_sq", max_exp_avg_sq());
  WriteIfDefined(archive, "mu_product", mu_product());
  WriteIfDefined(archive, "sum", sum());
}

void DeviceStepParamState::serialize(InputArchive& archive) {
  c10::IValue step_value;
  if (archive.try_read("step", step_value)) {
    // LibTorch's AdamParamState keeps the step as an integer.
    step(step_value.isTensor()
             ? step_value.toTensor()
             : torch::full({}, static_cast<double>(step_value.toInt()), torch::kFloat32));
  }
  exp_avg(ReadTensor(archive, "exp_avg"));
  exp_avg_sq(ReadTensor(archive, "exp_avg_sq"));
  max_exp_avg_sq(ReadTensor(archive, "max_exp_avg_sq"));
  mu_product(ReadTensor(archive, "mu_product"));
  sum(ReadTensor(archive, "sum"));
}

std::vector<torch::Tensor> DeviceStepParamState::tensors() const {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor* t :
       {&step(), &exp_avg(), &exp_avg_sq(), &max_exp_avg_sq(), &mu_product(), &sum()}) {
    if (t->defined()) out.push_back(*t);
  }
  return out;
}

DeviceStepOptimizer::DeviceStepOptimizer(
    DeviceStepKind kind, const std::vector<torch::optim::OptimizerParamGroup>& groups,
    const DeviceStepOptions& defaults)
    : Optimizer(groups, std::make_unique<DeviceStepOptions>(defaults)), kind_(kind) {
  InitState();
}

void DeviceStepOptimizer::InitState() {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const DeviceStepOptions&>(group.options());
    for (const torch::Tensor& p : group.params()) {
      auto state = std::make_unique<DeviceStepParamState>();
      const auto scalar = torch::TensorOptions().dtype(torch::kFloat32).device(p.device());
      state->step(torch::zeros({}, scalar));
      if (kind_ == DeviceStepKind::kAdagrad) {
        state->sum(torch::full_like(p, options.initial_accumulator_value(),
                                    torch::MemoryFormat::Preserve));
      } else {
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (options.amsgrad()) {
          state->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        }
        if (kind_ == DeviceStepKind::kNAdam) state->mu_product(torch::ones({}, scalar));
      }
      state_[p.unsafeGetTensorImpl()] = std::move(state);
    }
  }
}

torch::Tensor DeviceStepOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const DeviceStepOptions&>(group.options());
    const double lr = o.lr();
    const double beta1 = o.beta1();
    const double beta2 = o.beta2();
    const double wd = o.weight_decay();
    const bool decoupled = kind_ == DeviceStepKind::kAdamW || o.decoupled_weight_decay();
    for (torch::Tensor& param : group.params()) {
      if (!param.grad().defined()) continue;
      auto& s = static_cast<DeviceStepParamState&>(*state_.at(param.unsafeGetTensorImpl()));
      torch::Tensor grad = param.grad();
      torch::Tensor step = s.step();
      step.add_(1);
      // The step as float64, for the scalars that torch.optim's default (capturable=False) code
      // computes in Python floats from step.item(): the same values, computed on the device.
      // Each is cast to float32 where it meets a float32 tensor, as a Python float is.
      const torch::Tensor t = step.to(torch::kFloat64);
      if (kind_ == DeviceStepKind::kAdagrad) {
        // adagrad.py: the L2 penalty, then clr = lr / (1 + (step - 1) * lr_decay).
        if (wd != 0) grad = grad.add(param, wd);
        torch::Tensor state_sum = s.sum();
        state_sum.addcmul_(grad, grad, 1);
        torch::Tensor std = state_sum.sqrt().add_(o.eps());
        if (o.lr_decay() == 0) {
          param.addcdiv_(grad, std, -lr);  // clr is lr itself
        } else {
          // addcdiv_(grad, std, value=-clr): param + (-clr * grad) / std.
          const torch::Tensor clr = lr / ((t - 1) * o.lr_decay() + 1);
          param.add_(grad * clr.neg() / std);
        }
        continue;
      }
      if (wd != 0) {
        if (decoupled) {
          param.mul_(1 - lr * wd);
        } else {
          grad = grad.add(param, wd);
        }
      }
      torch::Tensor exp_avg = s.exp_avg();
      torch::Tensor exp_avg_sq = s.exp_avg_sq();
      switch (kind_) {
        case DeviceStepKind::kAdam:
        case DeviceStepKind::kAdamW: {
          // adam.py (single tensor).
          exp_avg.lerp_(grad, 1 - beta1);
          exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
          const torch::Tensor bias_correction1 = 1 - torch::pow(beta1, t);
          const torch::Tensor bias_correction2 = 1 - torch::pow(beta2, t);
          const torch::Tensor step_size = lr / bias_correction1;
          const torch::Tensor bias_correction2_sqrt = bias_correction2.sqrt();
          torch::Tensor second = exp_avg_sq;
          if (o.amsgrad()) {
            torch::Tensor max_sq = s.max_exp_avg_sq();
            torch::maximum_out(max_sq, max_sq, exp_avg_sq);
            second = max_sq;
          }
          const torch::Tensor denom = (second.sqrt() / bias_correction2_sqrt).add_(o.eps());
          param.add_(exp_avg * step_size.neg() / denom);  // addcdiv_(value=-step_size)
          break;
        }
        case DeviceStepKind::kNAdam: {
          // nadam.py (single tensor).
          const torch::Tensor bias_correction2 = 1 - torch::pow(beta2, t);
          const torch::Tensor mu = beta1 * (1.0 - 0.5 * torch::pow(0.96, t * o.momentum_decay()));
          const torch::Tensor mu_next =
              beta1 * (1.0 - 0.5 * torch::pow(0.96, (t + 1) * o.momentum_decay()));
          torch::Tensor mu_product = s.mu_product();
          mu_product.mul_(mu.to(torch::kFloat32));  // a float32 product, as in torch.optim
          exp_avg.lerp_(grad, 1 - beta1);
          exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
          const torch::Tensor denom = exp_avg_sq.div(bias_correction2).sqrt().add_(o.eps());
          const torch::Tensor product = mu_product.to(torch::kFloat64);
          const torch::Tensor mu_product_next = product * mu_next;
          param.add_(grad * (-lr * (1.0 - mu) / (1.0 - product)) / denom);
          param.add_(exp_avg * ((-lr * mu_next) / (1.0 - mu_product_next)) / denom);
          break;
        }
        case DeviceStepKind::kRAdam: {
          // radam.py (single tensor); both branches computed, the one rho_t selects kept.
          exp_avg.lerp_(grad, 1 - beta1);
          exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
          const torch::Tensor bias_correction1 = 1 - torch::pow(beta1, t);
          const torch::Tensor bias_correction2 = 1 - torch::pow(beta2, t);
          const torch::Tensor bias_corrected_exp_avg = exp_avg / bias_correction1;
          const double rho_inf = 2 / (1 - beta2) - 1;
          const torch::Tensor rho_t = rho_inf - 2 * t * torch::pow(beta2, t) / bias_correction2;
          const torch::Tensor rect = torch::pow(
              (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0.5);
          const torch::Tensor adaptive_lr =
              torch::pow(bias_correction2, 0.5) / exp_avg_sq.sqrt().add_(o.eps());
          const torch::Tensor plain = bias_corrected_exp_avg * lr;
          param.sub_(torch::where(rho_t > 5.0, plain * adaptive_lr * rect, plain));
          break;
        }
        case DeviceStepKind::kAdagrad:
          break;
      }
    }
  }
  return loss;
}

void DeviceStepOptimizer::save(OutputArchive& archive) const {
  torch::optim::serialize<DeviceStepParamState, DeviceStepOptions>(archive, *this);
}

void DeviceStepOptimizer::load(InputArchive& archive) {
  torch::optim::serialize<DeviceStepParamState, DeviceStepOptions>(archive, *this);
  // A loaded step may be an integer's (LibTorch's Adam) or on another device: float32 [] on the
  // parameter's device, as InitState makes it. Parameters the archive had no state for keep theirs.
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const DeviceStepOptions&>(group.options());
    for (const torch::Tensor& p : group.params()) {
      auto& s = static_cast<DeviceStepParamState&>(*state_.at(p.unsafeGetTensorImpl()));
      s.step(s.step().defined()
                 ? s.step().to(p.device(), torch::kFloat32).reshape({})
                 : torch::zeros({}, torch::TensorOptions(torch::kFloat32).device(p.device())));
      if (options.amsgrad() && !s.max_exp_avg_sq().defined()) {
        s.max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      }
    }
  }
}

}  // namespace trainerd::engine
