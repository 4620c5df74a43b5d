#include "server/engine/training/stacked_path.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/optimizer.h"

namespace trainerd::engine {
namespace {

namespace F = torch::nn::functional;

// Added to the global norm before dividing, as ClipGradNorm (and PyTorch's clip_grad_norm_) do.
constexpr double kClipEpsilon = 1e-6;

bool IsActivation(LayerKind kind) {
  return kind == LayerKind::kRelu || kind == LayerKind::kTanh || kind == LayerKind::kSigmoid ||
         kind == LayerKind::kGelu;
}

// `values` ([M]) shaped to broadcast against `like` ([M, ...]) member by member.
torch::Tensor PerMember(const torch::Tensor& values, const torch::Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[0] = values.size(0);
  return values.view(shape);
}

// Every dimension but the member dimension.
std::vector<int64_t> InnerDims(const torch::Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

}  // namespace

std::string StackedPathUnsupported(const TrainingRun& run) {
  if (run.submitted_module()) return "a submitted module trains alone";
  if (run.spec.precision != Precision::kFp32) return "mixed precision trains alone";
  if (std::string why = HandWrittenOptimizerUnsupported(run.spec); !why.empty()) {
    return absl::StrCat(why, ": the member trains alone");
  }
  if (run.dataset == nullptr || run.dataset->meta.feature_shape.size() != 1) {
    return "the stacked path takes flat feature vectors";
  }
  bool has_linear = false;
  for (const LayerSpec& layer : run.model.layers) {
    if (layer.kind == LayerKind::kLinear) {
      has_linear = true;
    } else if (!IsActivation(layer.kind)) {
      return absl::StrCat("layer ", layer.ToString(), " has no stacked form");
    }
  }
  if (!has_linear) return "the model has no linear layer";
  if (run.spec.loss == LossKind::kNll) return "loss nll has no stacked form";
  if (!run.spec.class_weights.empty()) return "class_weights have no stacked form";
  if (run.spec.ignore_index.has_value()) return "ignore_index has no stacked form";
  if (!run.spec.pos_weight.empty()) return "pos_weight has no stacked form";
  if (run.spec.gradient_accumulation_steps > 1) {
    return "gradient accumulation trains alone (the stacked step updates per batch)";
  }
  return "";
}

class StackedPack::Impl {
 public:
  explicit Impl(const std::vector<const TrainingRun*>& members)
      : runs_(members),
        spec_(members.front()->spec),
        model_spec_(members.front()->model),
        feature_shape_(members.front()->dataset->meta.feature_shape),
        device_(members.front()->device),
        count_(static_cast<int64_t>(members.size())),
        slots_(members.size()) {
    classification_ = spec_.loss == LossKind::kCrossEntropy;
    learning_rates_.assign(members.size(), spec_.learning_rate);
    const double default_decay = spec_.optimizer == OptimizerKind::kAdamW ? 0.01 : 0.0;
    std::vector<float> momenta;
    std::vector<float> decays;
    for (const TrainingRun* run : members) {
      momenta.push_back(static_cast<float>(run->spec.momentum));
      decays.push_back(static_cast<float>(run->spec.weight_decay.value_or(default_decay)));
      has_momentum_ = has_momentum_ || run->spec.momentum > 0;
      has_decay_ = has_decay_ || run->spec.weight_decay.value_or(default_decay) != 0;
    }
    const auto floats = torch::TensorOptions(torch::kFloat32);
    momenta_ = torch::tensor(momenta, floats).to(device_);
    decays_ = torch::tensor(decays, floats).to(device_);
    const auto doubles = torch::TensorOptions(torch::kFloat64).device(device_);
    steps_ = torch::zeros({count_}, doubles);
    loss_sums_ = torch::zeros({count_}, doubles);
    val_loss_sums_ = torch::zeros({count_}, doubles);
    val_correct_ = torch::zeros({count_}, torch::TensorOptions(torch::kInt64).device(device_));
  }

  void AddMember(size_t i, at::Generator& gen) {
    slots_[i].model = BuildSeededModel(*runs_[i], gen);
  }

  void SetLearningRate(size_t i, double learning_rate) {
    if (learning_rates_[i] != learning_rate) dirty_learning_rates_ = true;
    learning_rates_[i] = learning_rate;
  }
  void BeginEpoch(size_t i) {
    Build();
    loss_sums_.select(/*dim=*/0, static_cast<int64_t>(i)).zero_();
  }
  void Record(size_t i, const BatchView& batch) {
    slots_[i].batch = batch;
    slots_[i].has_batch = true;
  }
  void BeginValidation(size_t i) {
    Build();
    val_loss_sums_.select(0, static_cast<int64_t>(i)).zero_();
    val_correct_.select(0, static_cast<int64_t>(i)).zero_();
  }
  void RecordValidation(size_t i, const BatchView& batch) {
    slots_[i].val_batch = batch;
    slots_[i].has_val_batch = true;
  }
  torch::Tensor loss_sum(size_t i) const { return loss_sums_.select(0, static_cast<int64_t>(i)); }
  torch::Tensor validation_loss_sum(size_t i) const {
    return val_loss_sums_.select(0, static_cast<int64_t>(i));
  }
  torch::Tensor validation_correct(size_t i) const {
    return val_correct_.select(0, static_cast<int64_t>(i));
  }

  void StepAll() {
    torch::Tensor x;
    torch::Tensor y;
    if (!Gather(/*validation=*/false, x, y)) return;
    Build();
    UploadLearningRates();
    for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
    const torch::Tensor losses = MemberLosses(Forward(x), y, spec_.label_smoothing);
    // The members' losses are independent: the gradient of their sum is each member's own.
    losses.sum().backward();
    torch::NoGradGuard no_grad;
    if (spec_.clip_grad_norm > 0) ClipPerMember();
    Update();
    loss_sums_.add_(losses.detach().to(torch::kFloat64), static_cast<double>(x.size(1)));
  }

  void ValidateAll() {
    torch::Tensor x;
    torch::Tensor y;
    if (!Gather(/*validation=*/true, x, y)) return;
    Build();
    torch::NoGradGuard no_grad;
    const torch::Tensor output = Forward(x);
    // The plain loss (loss.h's AddValidationBatch): without label smoothing.
    val_loss_sums_.add_(MemberLosses(output, y, /*label_smoothing=*/0.0).to(torch::kFloat64),
                        static_cast<double>(x.size(1)));
    if (classification_) {
      val_correct_.add_(output.argmax(/*dim=*/2).eq(y.reshape({count_, -1})).sum(/*dim=*/1));
    }
  }

  absl::StatusOr<int64_t> WriteCheckpoint(size_t i, const std::string& path,
                                          const LoopState& state) {
    torch::nn::Sequential& model = CopySlotToModel(i);
    std::vector<torch::Tensor> params = model->parameters();
    const JobSpec& spec = runs_[i]->spec;
    std::unique_ptr<torch::optim::Optimizer> optimizer = MakeOptimizer(spec, params);
    engine::SetLearningRate(*optimizer, learning_rates_[i]);
    // The member's optimizer state, as LibTorch's optimizer would hold it after the same steps.
    auto& states = optimizer->state();
    const int64_t slot = static_cast<int64_t>(i);
    const int64_t step = static_cast<int64_t>(std::llround(steps_[slot].item<double>()));
    for (size_t k = 0; k < params.size(); ++k) {
      void* key = params[k].unsafeGetTensorImpl();
      switch (spec.optimizer) {
        case OptimizerKind::kSgd:
          if (spec.momentum > 0) {
            auto s = std::make_unique<torch::optim::SGDParamState>();
            s->momentum_buffer(state_a_[k][slot].clone());
            states[key] = std::move(s);
          }
          break;
        case OptimizerKind::kAdam: {
          auto s = std::make_unique<torch::optim::AdamParamState>();
          s->step(step);
          s->exp_avg(state_a_[k][slot].clone());
          s->exp_avg_sq(state_b_[k][slot].clone());
          states[key] = std::move(s);
          break;
        }
        case OptimizerKind::kAdamW: {
          auto s = std::make_unique<torch::optim::AdamWParamState>();
          s->step(step);
          s->exp_avg(state_a_[k][slot].clone());
          s->exp_avg_sq(state_b_[k][slot].clone());
          states[key] = std::move(s);
          break;
        }
        case OptimizerKind::kRmsprop: {
          auto s = std::make_unique<torch::optim::RMSpropParamState>();
          s->step(step);
          s->square_avg(state_a_[k][slot].clone());
          if (spec.momentum > 0) s->momentum_buffer(state_b_[k][slot].clone());
          states[key] = std::move(s);
          break;
        }
        case OptimizerKind::kNAdam:
        case OptimizerKind::kRAdam:
        case OptimizerKind::kAdagrad:
          break;  // not on this path (StackedPathUnsupported)
      }
    }
    return engine::WriteCheckpoint(
        path, [&model](torch::serialize::OutputArchive& a) { model->save(a); }, *optimizer, state,
        std::function<void(torch::serialize::OutputArchive&)>());
  }

  // Member `i`'s slot of the stacked parameters, as views (a spec-built model of linear layers and
  // activations has no buffers).
  std::vector<torch::Tensor> MemberTensors(size_t i) {
    Build();
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& p : parameters_) out.push_back(p.select(/*dim=*/0, static_cast<int64_t>(i)));
    return out;
  }

  absl::StatusOr<std::string> Finish(size_t i, HostTransfers& host, TrainingOutcome& outcome) {
    torch::nn::Sequential& model = CopySlotToModel(i);
    return FinishSequential(model, model_spec_, feature_shape_, device_, host, outcome);
  }

 private:
  struct Slot {
    torch::nn::Sequential model{nullptr};
    BatchView batch;
    bool has_batch = false;
    BatchView val_batch;
    bool has_val_batch = false;
  };

  // The members' parameters stacked (once, after every member built its model), with zeroed
  // optimizer state of the same shapes.
  void Build() {
    if (built_) return;
    built_ = true;
    std::vector<std::vector<torch::Tensor>> per_member;
    for (const Slot& slot : slots_) per_member.push_back(slot.model->parameters());
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < per_member.front().size(); ++k) {
      std::vector<torch::Tensor> column;
      for (const auto& params : per_member) column.push_back(params[k]);
      torch::Tensor stacked = torch::stack(column).contiguous();
      stacked.set_requires_grad(true);
      parameters_.push_back(stacked);
      switch (spec_.optimizer) {
        case OptimizerKind::kSgd:
          state_a_.push_back(has_momentum_ ? torch::zeros_like(stacked) : torch::Tensor());
          break;
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW:
          state_a_.push_back(torch::zeros_like(stacked));
          state_b_.push_back(torch::zeros_like(stacked));
          break;
        case OptimizerKind::kRmsprop:
          state_a_.push_back(torch::zeros_like(stacked));
          state_b_.push_back(has_momentum_ ? torch::zeros_like(stacked) : torch::Tensor());
          break;
        case OptimizerKind::kNAdam:
        case OptimizerKind::kRAdam:
        case OptimizerKind::kAdagrad:
          break;  // not on this path (StackedPathUnsupported)
      }
    }
  }

  // The learning rates of the coming steps, copied to the device when the schedule changed one
  // (once an epoch at most, or once a step under a per-step schedule): from pinned memory without waiting on a GPU, so that it never
  // synchronises the host with the device.
  void UploadLearningRates() {
    if (learning_rates_device_.defined() && !dirty_learning_rates_) return;
    dirty_learning_rates_ = false;
    std::vector<float> rates(learning_rates_.begin(), learning_rates_.end());
    torch::Tensor host = torch::tensor(rates, torch::TensorOptions(torch::kFloat32));
    if (device_.is_cuda()) {
      learning_rates_device_ = host.pin_memory().to(device_, /*non_blocking=*/true);
    } else {
      learning_rates_device_ = host;
    }
  }

  // The round's batches stacked [M, rows, ...]; a member without one (it ended) gets zeros. False
  // when no member gave one.
  bool Gather(bool validation, torch::Tensor& x, torch::Tensor& y) {
    const Slot* any = nullptr;
    for (const Slot& slot : slots_) {
      if (validation ? slot.has_val_batch : slot.has_batch) any = &slot;
    }
    if (any == nullptr) return false;
    const BatchView& sample = validation ? any->val_batch : any->batch;
    const torch::Tensor x0 = sample.x();
    const torch::Tensor y0 = sample.y();
    std::vector<torch::Tensor> xs;
    std::vector<torch::Tensor> ys;
    for (Slot& slot : slots_) {
      bool& has = validation ? slot.has_val_batch : slot.has_batch;
      const BatchView& batch = validation ? slot.val_batch : slot.batch;
      if (has && batch.rows == sample.rows) {
        xs.push_back(batch.x());
        ys.push_back(batch.y());
      } else {
        xs.push_back(torch::zeros_like(x0));
        ys.push_back(torch::zeros_like(y0));
      }
      has = false;
    }
    x = torch::stack(xs);
    y = torch::stack(ys);
    return true;
  }

  torch::Tensor Forward(torch::Tensor h) {
    size_t k = 0;
    for (const LayerSpec& layer : model_spec_.layers) {
      switch (layer.kind) {
        case LayerKind::kLinear: {
          const torch::Tensor& weight = parameters_[k];
          const torch::Tensor& bias = parameters_[k + 1];
          k += 2;
          h = torch::baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2));
          break;
        }
        case LayerKind::kRelu:
          h = torch::relu(h);
          break;
        case LayerKind::kTanh:
          h = torch::tanh(h);
          break;
        case LayerKind::kSigmoid:
          h = torch::sigmoid(h);
          break;
        case LayerKind::kGelu:
          h = torch::gelu(h);
          break;
        default:
          throw std::runtime_error(
              absl::StrCat("layer ", layer.ToString(), " has no stacked form"));
      }
    }
    return h;
  }

  // Each member's mean loss over its batch ([M]), as ComputeLoss computes one job's, with
  // `label_smoothing` (the spec's to train, 0 to validate).
  torch::Tensor MemberLosses(const torch::Tensor& output, const torch::Tensor& targets,
                             double label_smoothing) const {
    const int64_t members = output.size(0);
    switch (spec_.loss) {
      case LossKind::kMse:
        return (output - targets.view(output.sizes())).square().mean(InnerDims(output));
      case LossKind::kL1:
        return (output - targets.view(output.sizes())).abs().mean(InnerDims(output));
      case LossKind::kHuber:
        return F::huber_loss(
                   output, targets.view(output.sizes()),
                   F::HuberLossFuncOptions().delta(spec_.huber_delta).reduction(torch::kNone))
            .mean(InnerDims(output));
      case LossKind::kBceWithLogits:
        return F::binary_cross_entropy_with_logits(
                   output, targets.view(output.sizes()),
                   F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone))
            .mean(InnerDims(output));
      case LossKind::kCrossEntropy: {
        const int64_t rows = output.size(1);
        return F::cross_entropy(output.reshape({members * rows, output.size(2)}),
                                targets.reshape({-1}),
                                F::CrossEntropyFuncOptions()
                                    .label_smoothing(label_smoothing)
                                    .reduction(torch::kNone))
            .view({members, rows})
            .mean(/*dim=*/1);
      }
      case LossKind::kNll:
        break;
    }
    throw std::runtime_error("loss nll has no stacked form");
  }

  // Each member's gradients scaled so that their own global L2 norm is at most clip_grad_norm.
  void ClipPerMember() {
    torch::Tensor squares;
    for (const torch::Tensor& p : parameters_) {
      const torch::Tensor s = p.grad().square().sum(InnerDims(p));
      squares = squares.defined() ? squares + s : s;
    }
    const torch::Tensor coef =
        (spec_.clip_grad_norm / (squares.sqrt() + kClipEpsilon)).clamp_max(1.0);
    for (torch::Tensor& p : parameters_) p.mutable_grad().mul_(PerMember(coef, p));
  }

  // One optimizer step for every member, with the arithmetic of LibTorch's C++ optimizers
  // (torch/csrc/api/src/optim) and each member's learning rate, momentum and weight decay.
  void Update() {
    const torch::Tensor& lr = learning_rates_device_;
    const bool adaptive = spec_.optimizer != OptimizerKind::kSgd;
    torch::Tensor bias1;
    torch::Tensor sqrt_bias2;
    if (adaptive) steps_.add_(1.0);
    if (spec_.optimizer == OptimizerKind::kAdam || spec_.optimizer == OptimizerKind::kAdamW) {
      const double beta1 = spec_.beta1.value_or(0.9);
      const double beta2 = spec_.beta2.value_or(0.999);
      bias1 = (1.0 - torch::pow(beta1, steps_)).to(torch::kFloat32);
      sqrt_bias2 = (1.0 - torch::pow(beta2, steps_)).sqrt().to(torch::kFloat32);
    }
    for (size_t k = 0; k < parameters_.size(); ++k) {
      torch::Tensor& p = parameters_[k];
      torch::Tensor grad = p.grad();
      const torch::Tensor member_lr = PerMember(lr, p);
      switch (spec_.optimizer) {
        case OptimizerKind::kSgd: {
          if (has_decay_) grad = grad + PerMember(decays_, p) * p;
          if (has_momentum_) {
            const torch::Tensor momentum = PerMember(momenta_, p);
            torch::Tensor& buffer = state_a_[k];
            buffer.mul_(momentum).add_(grad);  // dampening 0; a new buffer is the gradient
            grad = spec_.nesterov ? grad + momentum * buffer : buffer;
          }
          p.sub_(member_lr * grad);
          break;
        }
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
          const double beta1 = spec_.beta1.value_or(0.9);
          const double beta2 = spec_.beta2.value_or(0.999);
          const double eps = spec_.eps.value_or(1e-8);
          if (spec_.optimizer == OptimizerKind::kAdamW) {
            if (has_decay_) p.mul_(1.0 - member_lr * PerMember(decays_, p));
          } else if (has_decay_) {
            grad = grad + PerMember(decays_, p) * p;
          }
          torch::Tensor& exp_avg = state_a_[k];
          torch::Tensor& exp_avg_sq = state_b_[k];
          exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
          exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
          const torch::Tensor denom = exp_avg_sq.sqrt() / PerMember(sqrt_bias2, p) + eps;
          p.sub_(member_lr / PerMember(bias1, p) * exp_avg / denom);
          break;
        }
        case OptimizerKind::kRmsprop: {
          const double alpha = spec_.alpha.value_or(0.99);
          const double eps = spec_.eps.value_or(1e-8);
          if (has_decay_) grad = grad + PerMember(decays_, p) * p;
          torch::Tensor& square_avg = state_a_[k];
          square_avg.mul_(alpha).addcmul_(grad, grad, 1.0 - alpha);
          const torch::Tensor avg = square_avg.sqrt() + eps;
          if (has_momentum_) {
            torch::Tensor& buffer = state_b_[k];
            buffer.mul_(PerMember(momenta_, p)).add_(grad / avg);
            p.sub_(member_lr * buffer);
          } else {
            p.sub_(member_lr * grad / avg);
          }
          break;
        }
        case OptimizerKind::kNAdam:
        case OptimizerKind::kRAdam:
        case OptimizerKind::kAdagrad:
          break;  // not on this path (StackedPathUnsupported)
      }
    }
  }

  // Member `i`'s slot copied into its own model (for a checkpoint or the end of its job).
  torch::nn::Sequential& CopySlotToModel(size_t i) {
    Build();
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> params = slots_[i].model->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      params[k].copy_(parameters_[k][static_cast<int64_t>(i)]);
    }
    return slots_[i].model;
  }

  const std::vector<const TrainingRun*> runs_;
  const JobSpec spec_;  // the first member's: what all share
  const ModelSpec model_spec_;
  const std::vector<int64_t> feature_shape_;
  const torch::Device device_;
  const int64_t count_;
  bool classification_ = false;
  bool has_momentum_ = false;
  bool has_decay_ = false;
  bool built_ = false;
  std::vector<Slot> slots_;
  std::vector<double> learning_rates_;  // host: the schedule's, per member
  bool dirty_learning_rates_ = true;
  torch::Tensor learning_rates_device_;    // [M] float32
  torch::Tensor momenta_;                  // [M] float32
  torch::Tensor decays_;                   // [M] float32
  torch::Tensor steps_;                    // [M] float64: adam, adamw and rmsprop step counts
  std::vector<torch::Tensor> parameters_;  // [M, ...] each, in the Sequential's order
  std::vector<torch::Tensor> state_a_;     // momentum buffer, exp_avg or square_avg
  std::vector<torch::Tensor> state_b_;     // exp_avg_sq or rmsprop's momentum buffer
  torch::Tensor loss_sums_;                // [M] float64
  torch::Tensor val_loss_sums_;            // [M] float64
  torch::Tensor val_correct_;              // [M] int64
};

namespace {

// One member as the epoch loop sees it.
class StackedMemberPath final : public TrainingPath {
 public:
  StackedMemberPath(StackedPack::Impl* pack, size_t slot) : pack_(pack), slot_(slot) {}

  void SetLearningRate(double learning_rate) override {
    pack_->SetLearningRate(slot_, learning_rate);
  }
  void BeginEpoch() override { pack_->BeginEpoch(slot_); }
  void Step(const BatchView& batch) override { pack_->Record(slot_, batch); }
  void BeginValidation() override { pack_->BeginValidation(slot_); }
  void ValidateBatch(const BatchView& batch) override { pack_->RecordValidation(slot_, batch); }
  void EndValidation() override {}
  torch::Tensor loss_sum() const override { return pack_->loss_sum(slot_); }
  torch::Tensor validation_loss_sum() const override { return pack_->validation_loss_sum(slot_); }
  torch::Tensor validation_correct() const override { return pack_->validation_correct(slot_); }
  std::vector<torch::Tensor> ExtraEpochValues() override { return {}; }
  void AfterTransfer(const double* /*extra_values*/) override {}
  std::vector<torch::Tensor> ModelTensors() override { return pack_->MemberTensors(slot_); }
  absl::StatusOr<int64_t> WriteCheckpoint(const std::string& path,
                                          const LoopState& state) override {
    return pack_->WriteCheckpoint(slot_, path, state);
  }
  absl::StatusOr<LoopState> ReadCheckpoint(const std::string& /*path*/,
                                           const std::string* /*bytes*/) override {
    return absl::FailedPreconditionError(
        "a packed sweep member does not resume from a checkpoint; it resumes alone");
  }
  absl::StatusOr<std::string> Finish(HostTransfers& host, TrainingOutcome& outcome) override {
    return pack_->Finish(slot_, host, outcome);
  }

 private:
  StackedPack::Impl* const pack_;
  const size_t slot_;
};

}  // namespace

StackedPack::StackedPack(const std::vector<const TrainingRun*>& members)
    : impl_(std::make_unique<Impl>(members)) {}
StackedPack::~StackedPack() = default;

std::unique_ptr<TrainingPath> StackedPack::MemberPath(size_t i, at::Generator gen) {
  impl_->AddMember(i, gen);
  return std::make_unique<StackedMemberPath>(impl_.get(), i);
}

void StackedPack::StepAll() { impl_->StepAll(); }
void StackedPack::ValidateAll() { impl_->ValidateAll(); }

}  // namespace trainerd::engine
