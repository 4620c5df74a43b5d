// The LibTorch eager path (training_path.h): LibTorch's modules, autograd and optimizers, one
// operator at a time, under autocast and loss scaling for mixed precision. Serves every model and
// option trainerd accepts; the other paths serve subsets of them faster.
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "server/engine/training/checkpoint.h"
#include "server/engine/training/loss.h"
#include "server/engine/training/model.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/precision.h"
#include "server/engine/training/state_dict.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"
#include "server/engine/training/training_path.h"

namespace trainerd::engine {
namespace {

// Module initialisation draws from LibTorch's process-wide CPU generator. Seeding it and building
// the model happen under this lock so that concurrent jobs on different devices each get exactly
// their own seed's initial weights.
std::mutex& InitMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

// The model a job trains: a Sequential built from the spec, or a user's TorchScript module. The
// loop needs only forward, the training flag and the parameters, so one small wrapper keeps it
// the same for both. Not thread-safe (one job's worker thread).
class TrainableModel {
 public:
  explicit TrainableModel(torch::nn::Sequential sequential) : sequential_(std::move(sequential)) {}
  explicit TrainableModel(torch::jit::Module module) : script_(std::move(module)) {}
  explicit TrainableModel(std::shared_ptr<ExportedProgram> program)
      : exported_(std::move(program)) {}

  bool is_torchscript() const { return script_.has_value(); }
  bool is_exported() const { return exported_ != nullptr; }
  ExportedProgram& exported() { return *exported_; }
  torch::jit::Module& script() { return *script_; }
  torch::nn::Sequential& sequential() { return sequential_; }

  torch::Tensor forward(const torch::Tensor& x) {
    if (script_) return script_->forward({x}).toTensor();
    if (exported_) return exported_->Forward(x);
    return sequential_->forward(x);
  }
  void train(bool on = true) {
    if (script_) {
      script_->train(on);
    } else if (exported_) {
      exported_->Train(on);
    } else {
      sequential_->train(on);
    }
  }
  void to(const torch::Device& device) {
    if (script_) {
      script_->to(device);  // parameters and buffers, in place (set_data)
    } else if (exported_) {
      exported_->To(device);  // the same, and the graph's tensor factories
    } else {
      sequential_->to(device);
    }
  }
  // A TorchScript module's parameters all train: a module assembled in C++ registers tensors
  // that do not require gradients, and a weight that should stay fixed belongs in a buffer.
  std::vector<torch::Tensor> parameters() {
    std::vector<torch::Tensor> out;
    if (exported_) {
      for (const auto& [name, p] : exported_->named_parameters()) out.push_back(p);
      return out;
    }
    if (!script_) return sequential_->parameters();
    for (torch::Tensor p : script_->parameters()) out.push_back(p.requires_grad_(true));
    return out;
  }
  // Parameters, then buffers, as the module lists them.
  std::vector<torch::Tensor> tensors() {
    std::vector<torch::Tensor> out;
    if (exported_) {
      for (const auto& [name, p] : exported_->named_parameters()) out.push_back(p);
      for (const auto& [name, b] : exported_->named_buffers()) out.push_back(b);
      return out;
    }
    if (!script_) {
      out = sequential_->parameters();
      for (const torch::Tensor& b : sequential_->buffers()) out.push_back(b);
      return out;
    }
    for (const torch::Tensor& p : script_->parameters()) out.push_back(p);
    for (const torch::Tensor& b : script_->buffers()) out.push_back(b);
    return out;
  }
  // Checkpoints: Module::save/load for a Sequential; a TorchScript module's parameters and buffers
  // by flat name ("fc.weight").
  void Save(torch::serialize::OutputArchive& archive) {
    if (exported_) {
      for (const auto& [name, p] : exported_->named_parameters()) archive.write(name, p);
      for (const auto& [name, b] : exported_->named_buffers()) {
        archive.write(name, b, /*is_buffer=*/true);
      }
      return;
    }
    if (!script_) {
      sequential_->save(archive);
      return;
    }
    for (const auto& p : script_->named_parameters()) archive.write(p.name, p.value);
    for (const auto& b : script_->named_buffers()) {
      archive.write(b.name, b.value, /*is_buffer=*/true);
    }
  }
  void Load(torch::serialize::InputArchive& archive) {
    if (exported_) {
      torch::NoGradGuard no_grad;
      for (const auto& [name, p] : exported_->named_parameters()) {
        torch::Tensor value;
        archive.read(name, value);
        torch::Tensor target = p;
        target.copy_(value);
      }
      for (const auto& [name, b] : exported_->named_buffers()) {
        torch::Tensor value;
        archive.read(name, value, /*is_buffer=*/true);
        torch::Tensor target = b;
        target.copy_(value);
      }
      return;
    }
    if (!script_) {
      sequential_->load(archive);
      return;
    }
    torch::NoGradGuard no_grad;
    for (const auto& p : script_->named_parameters()) {
      torch::Tensor value;
      archive.read(p.name, value);
      p.value.copy_(value);
    }
    for (const auto& b : script_->named_buffers()) {
      torch::Tensor value;
      archive.read(b.name, value, /*is_buffer=*/true);
      b.value.copy_(value);
    }
  }

 private:
  torch::nn::Sequential sequential_{nullptr};
  std::optional<torch::jit::Module> script_;
  std::shared_ptr<ExportedProgram> exported_;
};

// The end of an exported-program job: as FinishTorchScriptModule (its state_dict kept as
// safetensors under the module's own names), and the download is the same .pt2 archive with its
// weights (parameters and buffers) replaced by the trained ones. Throws c10::Error.
absl::StatusOr<std::string> FinishExportedProgram(ExportedProgram& program,
                                                  const torch::Device& device,
                                                  const std::vector<int64_t>& feature_shape,
                                                  HostTransfers& host, TrainingOutcome& outcome) {
  torch::NoGradGuard no_grad;
  program.To(torch::kCPU);
  if (!device.is_cpu()) host.CountCrossDeviceCopy();
  program.Train(false);
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  for (const auto& [name, p] : program.named_parameters()) parameters.emplace_back(name, p.detach());
  if (ReportParameters(parameters, outcome) && device.is_cpu()) host.CountCrossDeviceCopy();
  absl::StatusOr<std::string> state_dict = ExportedSafetensors(program, feature_shape);
  if (!state_dict.ok()) return state_dict.status();
  outcome.state_dict = *std::move(state_dict);
  return program.SaveArchive();
}

// The end of a TorchScript job: moves the module to the CPU (after the last epoch; off the CPU that
// is the job's end-of-job transfer, counted once like a spec-built model's single copy, though
// LibTorch copies tensor by tensor), reads back a small model's parameters (float32, named as in
// the module, e.g. "fc.weight"), keeps its state_dict as safetensors in `outcome` and returns the
// module's saved archive. Throws c10::Error.
absl::StatusOr<std::string> FinishTorchScriptModule(torch::jit::Module& module,
                                                    const torch::Device& device,
                                                    const std::vector<int64_t>& feature_shape,
                                                    HostTransfers& host,
                                                    TrainingOutcome& outcome) {
  torch::NoGradGuard no_grad;
  module.to(torch::kCPU);
  if (!device.is_cpu()) host.CountCrossDeviceCopy();
  module.eval();
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    parameters.emplace_back(p.name, p.value.detach());
  }
  // As for a spec-built model: on the CPU the read-back counts as the copy.
  if (ReportParameters(parameters, outcome) && device.is_cpu()) host.CountCrossDeviceCopy();
  absl::StatusOr<std::string> state_dict = ModuleSafetensors(module, feature_shape);
  if (!state_dict.ok()) return state_dict.status();
  outcome.state_dict = *std::move(state_dict);
  std::ostringstream archive;
  module.save(archive);
  return archive.str();
}

TrainableModel BuildTrainable(const TrainingRun& run, at::Generator& gen) {
  if (run.torchscript != nullptr) return TrainableModel(*run.torchscript);
  if (run.exported != nullptr) {
    // Dropout's masks from the job's generator, as a spec-built model's; the other draws inside
    // operators (scaled_dot_product_attention's dropout) from LibTorch's default CPU generator,
    // seeded with the job's seed here.
    run.exported->SetGenerator(gen);
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpu_gen.mutex());
      cpu_gen.set_current_seed(run.spec.seed.value_or(0));
    }
    return TrainableModel(run.exported);
  }
  return TrainableModel(BuildSeededModel(run, gen));
}

class LibTorchPath final : public TrainingPath {
 public:
  LibTorchPath(const TrainingRun& run, at::Generator gen)
      : spec_(run.spec),
        model_spec_(run.model),
        feature_shape_(run.dataset->meta.feature_shape),
        device_(run.device),
        net_(BuildTrainable(run, gen)) {
    net_.to(device_);
    net_.train();
    parameters_ = net_.parameters();
    optimizer_ = MakeOptimizer(spec_, parameters_);
    // fp16's narrow range needs loss scaling; bf16 has float32's range and needs none.
    if (spec_.precision == Precision::kFp16) scaler_.emplace(device_, LossScaler::Options{});
    classification_ = spec_.loss == LossKind::kCrossEntropy || spec_.loss == LossKind::kNll;
    loss_tensors_ = MakeLossTensors(spec_, device_);
    const auto index_options = torch::TensorOptions(torch::kInt64).device(device_);
    const auto sum_options = torch::TensorOptions(torch::kFloat64).device(device_);
    loss_sum_ = torch::zeros({}, sum_options);
    val_loss_sum_ = torch::zeros({}, sum_options);
    val_correct_ = torch::zeros({}, index_options);
  }

  void SetLearningRate(double learning_rate) override {
    engine::SetLearningRate(*optimizer_, learning_rate);
  }

  void BeginEpoch() override {
    loss_sum_.zero_();
    if (scaler_) scaler_->ResetSkippedSteps();
  }

  void Step(const BatchView& batch) override {
    if (batch.rows == 0 && exchange_ != nullptr) return EmptySliceStep();
    const torch::Tensor x = batch.x();
    const torch::Tensor y = batch.y();
    optimizer_->zero_grad();
    torch::Tensor loss = ComputeLoss(spec_, Forward(x), y, loss_tensors_);
    if (scaler_) {
      scaler_->Scale(loss).backward();
      scaler_->Unscale(parameters_);  // clipping below sees the true gradients
    } else {
      loss.backward();
    }
    if (exchange_ != nullptr) {
      std::vector<torch::Tensor> gradients;
      gradients.reserve(parameters_.size());
      for (torch::Tensor& p : parameters_) {
        // A parameter the loss did not reach has no gradient yet: zeros, so that every rank's
        // bucket has the same layout.
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        gradients.push_back(p.grad());
      }
      exchange_->Exchange(gradients, x.size(0));
    }
    // Clipping scales the gradients by a device scalar; its norm never reaches the host.
    if (spec_.clip_grad_norm > 0) ClipGradNorm(parameters_, spec_.clip_grad_norm);
    if (scaler_) {
      scaler_->Step(*optimizer_, parameters_);  // undone on the device if gradients overflowed
    } else {
      optimizer_->step();
    }
    torch::NoGradGuard no_grad;
    loss_sum_.add_(loss.detach(), /*alpha=*/static_cast<double>(x.size(0)));
  }

  // Gradient accumulation, as PyTorch's usual loop: (loss / n).backward() per batch (under fp16,
  // scaler.scale(loss / n).backward()), and at the group's last batch the step Step takes.
  void AccumulationStep(const BatchView& batch, bool first, bool last, int32_t n) override {
    const torch::Tensor x = batch.x();
    const torch::Tensor y = batch.y();
    if (first) optimizer_->zero_grad();
    torch::Tensor loss = ComputeLoss(spec_, Forward(x), y);
    const torch::Tensor part = loss / static_cast<double>(n);
    if (scaler_) {
      scaler_->Scale(part).backward();
    } else {
      part.backward();
    }
    if (last) {
      if (scaler_) scaler_->Unscale(parameters_);
      if (spec_.clip_grad_norm > 0) ClipGradNorm(parameters_, spec_.clip_grad_norm);
      if (scaler_) {
        scaler_->Step(*optimizer_, parameters_);
      } else {
        optimizer_->step();
      }
    }
    torch::NoGradGuard no_grad;
    loss_sum_.add_(loss.detach(), /*alpha=*/static_cast<double>(x.size(0)));
  }

  // A data-parallel rank whose slice of a short last global batch is empty still takes the step
  // with the others: no forward, zero gradients weighted by no rows into the exchange, then the
  // same clipping and update as every rank, so that the ranks' models stay one.
  void EmptySliceStep() {
    optimizer_->zero_grad();
    std::vector<torch::Tensor> gradients;
    gradients.reserve(parameters_.size());
    for (torch::Tensor& p : parameters_) {
      p.mutable_grad() = torch::zeros_like(p);
      gradients.push_back(p.grad());
    }
    exchange_->Exchange(gradients, 0);
    if (spec_.clip_grad_norm > 0) ClipGradNorm(parameters_, spec_.clip_grad_norm);
    if (scaler_) {
      scaler_->Step(*optimizer_, parameters_);
    } else {
      optimizer_->step();
    }
  }

  bool SetGradientExchange(GradientExchange* exchange) override {
    exchange_ = exchange;
    return true;
  }

  void BeginValidation() override {
    net_.train(false);
    val_loss_sum_.zero_();
    val_correct_.zero_();
  }

  void ValidateBatch(const BatchView& batch) override {
    const torch::Tensor x = batch.x();
    const torch::Tensor y = batch.y();
    torch::NoGradGuard no_grad;
    torch::Tensor output = Forward(x);
    // The plain loss (loss.h): what an eval loop computes, without training-only terms.
    AddValidationBatch(spec_, output, y, val_loss_sum_, classification_ ? &val_correct_ : nullptr);
  }

  void EndValidation() override { net_.train(); }

  torch::Tensor loss_sum() const override { return loss_sum_; }
  torch::Tensor validation_loss_sum() const override { return val_loss_sum_; }
  torch::Tensor validation_correct() const override { return val_correct_; }

  std::vector<torch::Tensor> ExtraEpochValues() override {
    if (!scaler_) return {};
    return {scaler_->scale().to(torch::kFloat64), scaler_->skipped_steps()};
  }

  void AfterTransfer(const double* extra_values) override {
    if (!scaler_) return;
    // Before any checkpoint of this epoch, so that saved step counts are the true ones.
    LossScaler::CorrectStepCounters(*optimizer_, std::llround(extra_values[1]));
  }

  std::vector<torch::Tensor> ModelTensors() override { return net_.tensors(); }

  absl::StatusOr<int64_t> WriteCheckpoint(const std::string& path,
                                          const LoopState& state) override {
    return engine::WriteCheckpoint(
        path, [this](torch::serialize::OutputArchive& a) { net_.Save(a); }, *optimizer_, state,
        scaler_ ? [this](torch::serialize::OutputArchive& a) { scaler_->Save(a); }
                : std::function<void(torch::serialize::OutputArchive&)>());
  }

  absl::StatusOr<LoopState> ReadCheckpoint(const std::string& path,
                                           const std::string* bytes) override {
    return engine::ReadCheckpoint(
        path, device_, [this](torch::serialize::InputArchive& a) { net_.Load(a); }, *optimizer_,
        scaler_ ? [this](torch::serialize::InputArchive& a) { scaler_->Load(a); }
                : std::function<void(torch::serialize::InputArchive&)>(),
        bytes);
  }

  absl::StatusOr<std::string> Finish(HostTransfers& host, TrainingOutcome& outcome) override {
    // The trained state on the host, for the parameter read-back and the TorchScript export
    // (DownloadModel). After the last epoch, so never an in-epoch sync. Off the CPU it is one
    // device-to-host transfer, counted here; it also serves the read-back, so a small model still
    // reports epochs + 1. On the CPU nothing crosses a device and only the read-back of a small
    // model is counted, as it always was.
    if (net_.is_exported()) {
      return FinishExportedProgram(net_.exported(), device_, feature_shape_, host, outcome);
    }
    if (net_.is_torchscript()) {
      // Bring your own model: the download is the trained module itself, on the CPU and in eval
      // mode (as a spec-built model's export is), saved with its own code, parameters and buffers.
      return FinishTorchScriptModule(net_.script(), device_, feature_shape_, host, outcome);
    }
    return FinishSequential(net_.sequential(), model_spec_, feature_shape_, device_, host, outcome);
  }

 private:
  // The forward pass, under autocast for bf16/fp16. The loss is always computed in float32 (the
  // output is cast up; autocast's own lists do that for most losses, this makes it all of them).
  torch::Tensor Forward(const torch::Tensor& x) {
    torch::Tensor output;
    {
      AutocastGuard autocast(device_, spec_.precision);
      output = net_.forward(x);
    }
    return output.scalar_type() == torch::kFloat32 ? output : output.to(torch::kFloat32);
  }

  const JobSpec spec_;
  const ModelSpec model_spec_;
  const std::vector<int64_t> feature_shape_;
  const torch::Device device_;
  TrainableModel net_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<LossScaler> scaler_;
  bool classification_ = false;
  LossTensors loss_tensors_;              // the job's class weights and pos_weight on its device
  GradientExchange* exchange_ = nullptr;  // a data-parallel rank's; not owned
  torch::Tensor loss_sum_;
  torch::Tensor val_loss_sum_;
  torch::Tensor val_correct_;
};

}  // namespace

void TrainingPath::AccumulationStep(const BatchView&, bool, bool, int32_t) {
  throw std::logic_error("this training path does not accumulate gradients");
}

bool ReportParameters(const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                      TrainingOutcome& outcome) {
  for (const auto& [name, value] : parameters) outcome.parameter_count += value.numel();
  if (outcome.parameter_count <= 0 || outcome.parameter_count > kMaxReportedParameters) {
    return false;
  }
  for (const auto& [name, value] : parameters) {
    const torch::Tensor values = value.to(torch::kCPU, torch::kFloat32).contiguous();
    ParameterValues out;
    out.name = name;
    out.shape = values.sizes().vec();
    out.values.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
    outcome.parameters.push_back(std::move(out));
  }
  return true;
}

absl::StatusOr<std::string> FinishSequential(const torch::nn::Sequential& model,
                                             const ModelSpec& spec,
                                             const std::vector<int64_t>& feature_shape,
                                             const torch::Device& device, HostTransfers& host,
                                             TrainingOutcome& outcome) {
  const auto copy_start = std::chrono::steady_clock::now();
  const HostModelState state = CopyModelStateToHost(model);
  if (!device.is_cpu()) {
    host.AddSeconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count());
    host.CountCrossDeviceCopy();
  }
  if (ReportParameters(state.parameters, outcome) && device.is_cpu()) host.CountCrossDeviceCopy();
  absl::StatusOr<std::string> state_dict = SequentialSafetensors(state, spec, feature_shape);
  if (!state_dict.ok()) return state_dict.status();
  outcome.state_dict = *std::move(state_dict);
  return ExportTorchScript(state, spec, feature_shape);
}

torch::nn::Sequential BuildSeededModel(const TrainingRun& run, at::Generator& gen) {
  torch::nn::Sequential model{nullptr};
  {
    std::lock_guard<std::mutex> lock(InitMutex());
    // Not under the generator's own mutex: the initialisers below take it themselves.
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    cpu_gen.set_current_seed(run.spec.seed.value_or(0));
    model = BuildModel(run.model, run.dataset->meta.feature_shape, gen);
  }
  model->to(run.device);
  return model;
}

std::unique_ptr<TrainingPath> MakeLibTorchPath(const TrainingRun& run, at::Generator gen) {
  return std::make_unique<LibTorchPath>(run, std::move(gen));
}

}  // namespace trainerd::engine
