#include "server/engine/training/fused_path.h"

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flops.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"

// BLAS's single-precision product, column-major (Fortran's interface): MKL's, which LibTorch's CPU
// library carries and exports, vectorised for this CPU at run time (AVX-512 where it has it).
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

namespace trainerd::engine {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Products of at least this many multiply-adds (m * n * k) go to BLAS (RowMajorGemm); smaller
// ones stay with Eigen, whose inlined products cost no call: the seed's 16 x 1 x 1 step would pay
// more for MKL's entry than for its arithmetic. Eigen's products are compiled for the baseline
// x86-64 the binaries target (SSE2), MKL's for the CPU it finds: on the 2-core AVX-512 Xeon of
// docs/PERFORMANCE.md ("The fused CPU path"), MLPs of 1.7 to 16 MFLOPs a step step 2.2-3.7x
// faster with MKL's products. MKL rather than a BLAS from Debian: it is already in the process
// (LibTorch's CPU library carries and exports it), and a second BLAS would clash with its symbols.
constexpr int64_t kBlasMinProduct = 16384;

// Row-major C (m x n) = op(A) (m x k) * op(B) (k x n), C overwritten: CBLAS's row-major call
// through the column-major interface (C^T = op(B)^T op(A)^T). Dimensions within int, as every
// fused layer's are (width <= kFusedMaxWidth; batch rows checked by the caller).
void RowMajorGemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
                  const float* b, int ldb, float* c, int ldc) {
  const char ta = trans_a ? 'T' : 'N';
  const char tb = trans_b ? 'T' : 'N';
  const float one = 1.0f, zero = 0.0f;
  sgemm_(&tb, &ta, &n, &m, &k, &one, b, &ldb, a, &lda, &zero, c, &ldc);
}

// Whether the product of m x k by k x n goes to BLAS.
bool UseBlas(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  return m <= kIntMax && m * n * k >= kBlasMinProduct;
}

// Added to the global norm before dividing, as ClipGradNorm (and PyTorch's clip_grad_norm_) do.
constexpr double kClipEpsilon = 1e-6;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

bool IsActivation(LayerKind kind) {
  return kind == LayerKind::kRelu || kind == LayerKind::kTanh || kind == LayerKind::kSigmoid ||
         kind == LayerKind::kGelu;
}

// One layer of the fused model. A linear layer's weight ([out, in], row-major) and bias are the
// Sequential's own parameter tensors; their gradients live here.
struct FusedLayer {
  LayerKind kind = LayerKind::kLinear;
  int64_t in = 0;
  int64_t out = 0;
  torch::Tensor weight;
  torch::Tensor bias;
  RowMatrix weight_grad;
  Eigen::VectorXf bias_grad;
};

// A parameter with its gradient and its optimizer state, all as plain float memory.
struct FusedParameter {
  float* value = nullptr;
  float* grad = nullptr;
  int64_t size = 0;
  torch::Tensor tensor;  // keeps `value` alive; the key of its optimizer state
};

class FusedCpuPath final : public TrainingPath {
 public:
  FusedCpuPath(const TrainingRun& run, at::Generator gen)
      : spec_(run.spec),
        model_spec_(run.model),
        feature_shape_(run.dataset->meta.feature_shape),
        sequential_(BuildSeededModel(run, gen)) {
    sequential_->train();
    TORCH_CHECK(sequential_->size() == model_spec_.layers.size(),
                "the fused path needs one module per layer of ", run.spec.model);
    optimizer_ = MakeOptimizer(spec_, sequential_->parameters());
    learning_rate_ = spec_.learning_rate;
    classification_ = spec_.loss == LossKind::kCrossEntropy;
    // The layers, in order, with the widths of what flows between them.
    int64_t width = feature_shape_.at(0);
    max_width_ = width;
    for (size_t i = 0; i < model_spec_.layers.size(); ++i) {
      FusedLayer layer;
      layer.kind = model_spec_.layers[i].kind;
      layer.in = width;
      if (layer.kind == LayerKind::kLinear) {
        auto linear = sequential_[i]->as<torch::nn::Linear>();
        layer.weight = linear->weight;
        layer.bias = linear->bias;
        layer.out = layer.weight.size(0);
        layer.weight_grad = RowMatrix::Zero(layer.out, layer.in);
        layer.bias_grad = Eigen::VectorXf::Zero(layer.out);
      } else {
        layer.out = width;
      }
      width = layer.out;
      max_width_ = std::max(max_width_, width);
      layers_.push_back(std::move(layer));
    }
    outputs_ = width;
    // The parameters in the Sequential's order (weight, bias per linear layer), which is the
    // optimizer's.
    for (FusedLayer& layer : layers_) {
      if (layer.kind != LayerKind::kLinear) continue;
      parameters_.push_back({layer.weight.data_ptr<float>(), layer.weight_grad.data(),
                             layer.weight.numel(), layer.weight});
      parameters_.push_back(
          {layer.bias.data_ptr<float>(), layer.bias_grad.data(), layer.bias.numel(), layer.bias});
    }
    BindOptimizerState();
    loss_sum_ = torch::zeros({}, torch::kFloat64);
    val_loss_sum_ = torch::zeros({}, torch::kFloat64);
    val_correct_ = torch::zeros({}, torch::kInt64);
  }

  void SetLearningRate(double learning_rate) override {
    learning_rate_ = learning_rate;
    engine::SetLearningRate(*optimizer_, learning_rate);  // what a checkpoint keeps
  }

  void BeginEpoch() override { epoch_loss_ = 0.0; }

  void Step(const BatchView& batch) override {
    const int64_t n = batch.rows;
    const float* x = Features(batch);
    Reserve(n);
    Forward(x, n);
    epoch_loss_ += LossAndGradient(batch, n, /*gradient=*/true) * static_cast<double>(n);
    Backward(x, n);
    if (spec_.clip_grad_norm > 0) ClipGradients();
    Update();
  }

  void BeginValidation() override {
    val_loss_ = 0.0;
    val_correct_count_ = 0;
  }

  void ValidateBatch(const BatchView& batch) override {
    const int64_t n = batch.rows;
    const float* x = Features(batch);
    Reserve(n);
    Forward(x, n);
    // The plain loss (loss.h's AddValidationBatch): without label smoothing.
    val_loss_ +=
        LossAndGradient(batch, n, /*gradient=*/false, /*plain=*/true) * static_cast<double>(n);
    if (classification_) {
      const float* out = Output();
      const int64_t* target = ClassTargets(batch);
      for (int64_t r = 0; r < n; ++r) {
        const float* row = out + r * outputs_;
        const int64_t best = std::max_element(row, row + outputs_) - row;
        if (best == target[r]) ++val_correct_count_;
      }
    }
  }

  void EndValidation() override {
    val_loss_sum_.fill_(val_loss_);
    val_correct_.fill_(val_correct_count_);
  }

  torch::Tensor loss_sum() const override {
    loss_sum_.fill_(epoch_loss_);  // once per epoch, when the loop reads it
    return loss_sum_;
  }
  torch::Tensor validation_loss_sum() const override { return val_loss_sum_; }
  torch::Tensor validation_correct() const override { return val_correct_; }
  std::vector<torch::Tensor> ExtraEpochValues() override { return {}; }
  void AfterTransfer(const double* /*extra_values*/) override {}

  // The kernels read the parameters' memory in place: copies into these tensors are what the next
  // step sees.
  std::vector<torch::Tensor> ModelTensors() override {
    std::vector<torch::Tensor> out = sequential_->parameters();
    for (const torch::Tensor& b : sequential_->buffers()) out.push_back(b);
    return out;
  }

  absl::StatusOr<int64_t> WriteCheckpoint(const std::string& path,
                                          const LoopState& state) override {
    return engine::WriteCheckpoint(
        path, [this](torch::serialize::OutputArchive& a) { sequential_->save(a); }, *optimizer_,
        state);
  }

  absl::StatusOr<LoopState> ReadCheckpoint(const std::string& path,
                                           const std::string* bytes) override {
    absl::StatusOr<LoopState> state = engine::ReadCheckpoint(
        path, torch::kCPU, [this](torch::serialize::InputArchive& a) { sequential_->load(a); },
        *optimizer_, nullptr, bytes);
    // Loading replaced the parameters' contents in place and the optimizer's state objects.
    if (state.ok()) BindOptimizerState();
    return state;
  }

  absl::StatusOr<std::string> Finish(HostTransfers& host, TrainingOutcome& outcome) override {
    return FinishSequential(sequential_, model_spec_, feature_shape_, torch::kCPU, host, outcome);
  }

 private:
  // The loops below read raw memory: a batch that does not match the model (a spec that skipped
  // Submit's checks) is an error here, never an out-of-bounds read. Only inline accessors: no
  // operator is dispatched. O(batch) for class indices.
  static bool RowsInRange(const torch::Tensor& t, const BatchView& batch) {
    return t.is_contiguous() && t.device().is_cpu() && t.dim() >= 1 && batch.offset >= 0 &&
           batch.rows >= 1 && batch.offset + batch.rows <= t.size(0);
  }
  const float* Features(const BatchView& batch) const {
    const torch::Tensor& f = *batch.features;
    const int64_t in = layers_.front().in;
    TORCH_CHECK(
        f.scalar_type() == torch::kFloat32 && RowsInRange(f, batch) && f.numel() == f.size(0) * in,
        "the fused path needs ", in, " float32 features per row; got ", f.sizes());
    return f.data_ptr<float>() + batch.offset * in;
  }
  const int64_t* ClassTargets(const BatchView& batch) const {
    const torch::Tensor& t = *batch.targets;
    TORCH_CHECK(t.scalar_type() == torch::kInt64 && RowsInRange(t, batch) && t.numel() == t.size(0),
                "loss cross_entropy needs one int64 class index per row; got ", t.sizes());
    const int64_t* target = t.data_ptr<int64_t>() + batch.offset;
    for (int64_t r = 0; r < batch.rows; ++r) {
      TORCH_CHECK(target[r] >= 0 && target[r] < outputs_, "class index ", target[r],
                  " is outside the model's ", outputs_, " outputs");
    }
    return target;
  }
  const float* ValueTargets(const BatchView& batch) const {
    const torch::Tensor& t = *batch.targets;
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 && RowsInRange(t, batch) &&
                    t.numel() == t.size(0) * outputs_,
                "the model outputs ", outputs_, " values per row but the targets are shaped ",
                t.sizes());
    return t.data_ptr<float>() + batch.offset * outputs_;
  }

  // Activations for a batch of `rows`: allocated for the largest batch seen, then reused.
  void Reserve(int64_t rows) {
    if (rows <= capacity_) return;
    capacity_ = rows;
    activations_.assign(layers_.size(), RowMatrix());
    for (size_t i = 0; i < layers_.size(); ++i) activations_[i].resize(rows, layers_[i].out);
    grad_a_.resize(rows, max_width_);
    grad_b_.resize(rows, max_width_);
  }

  const float* Output() const { return activations_.back().data(); }

  void Forward(const float* x, int64_t n) {
    const float* input = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const FusedLayer& layer = layers_[i];
      float* output = activations_[i].data();
      ConstMatrixMap in(input, n, layer.in);
      MatrixMap out(output, n, layer.out);
      switch (layer.kind) {
        case LayerKind::kLinear: {
          ConstMatrixMap w(layer.weight.data_ptr<float>(), layer.out, layer.in);
          Eigen::Map<const Eigen::RowVectorXf> b(layer.bias.data_ptr<float>(), layer.out);
          if (UseBlas(n, layer.out, layer.in)) {
            RowMajorGemm(false, true, static_cast<int>(n), static_cast<int>(layer.out),
                         static_cast<int>(layer.in), input, static_cast<int>(layer.in),
                         layer.weight.data_ptr<float>(), static_cast<int>(layer.in), output,
                         static_cast<int>(layer.out));
          } else {
            out.noalias() = in * w.transpose();
          }
          out.rowwise() += b;
          break;
        }
        case LayerKind::kRelu:
          out = in.cwiseMax(0.0f);
          break;
        case LayerKind::kTanh:
          out = in.array().tanh().matrix();
          break;
        case LayerKind::kSigmoid:
          out = (1.0f / (1.0f + (-in.array()).exp())).matrix();
          break;
        case LayerKind::kGelu: {
          const int64_t size = n * layer.in;
          for (int64_t k = 0; k < size; ++k) {
            const float v = input[k];
            output[k] = 0.5f * v * (1.0f + std::erf(v * static_cast<float>(kInvSqrt2)));
          }
          break;
        }
        default:
          break;
      }
      input = output;
    }
  }

  // The batch's mean loss; with `gradient`, d(mean loss)/d(output) into grad_a_; `plain`: without
  // training-only terms (label smoothing), as validation computes it.
  // The value is rounded to float32, as LibTorch's float32 loss is, so that a loss beyond float32's
  // range is infinite on both paths. Element losses are float32 too; sums are double.
  double LossAndGradient(const BatchView& batch, int64_t n, bool gradient, bool plain = false) {
    const int64_t k = outputs_;
    const float* out = Output();
    float* grad = grad_a_.data();
    double total = 0.0;
    if (spec_.loss == LossKind::kCrossEntropy) {
      const int64_t* target = ClassTargets(batch);
      const double smoothing = plain ? 0.0 : spec_.label_smoothing;
      const double inv_n = 1.0 / static_cast<double>(n);
      for (int64_t r = 0; r < n; ++r) {
        const float* row = out + r * k;
        const float top = *std::max_element(row, row + k);
        double sum_exp = 0.0;
        for (int64_t c = 0; c < k; ++c) sum_exp += std::exp(static_cast<double>(row[c] - top));
        const double log_sum = static_cast<double>(top) + std::log(sum_exp);
        double row_loss = -(1.0 - smoothing) * (row[target[r]] - log_sum);
        if (smoothing > 0) {
          double sum_log_p = 0.0;
          for (int64_t c = 0; c < k; ++c) sum_log_p += row[c] - log_sum;
          row_loss -= smoothing / static_cast<double>(k) * sum_log_p;
        }
        total += row_loss;
        if (!gradient) continue;
        float* g = grad + r * k;
        for (int64_t c = 0; c < k; ++c) {
          double p = std::exp(static_cast<double>(row[c]) - log_sum);
          p -= smoothing / static_cast<double>(k);
          if (c == target[r]) p -= 1.0 - smoothing;
          g[c] = static_cast<float>(p * inv_n);
        }
      }
      return static_cast<float>(total / static_cast<double>(n));
    }
    // Element-wise losses: the mean over every output value.
    const int64_t size = n * k;
    const float* target = ValueTargets(batch);
    const double inv = 1.0 / static_cast<double>(size);
    const float delta = static_cast<float>(spec_.huber_delta);
    for (int64_t i = 0; i < size; ++i) {
      const float o = out[i];
      const float t = target[i];
      const float d = o - t;
      float loss = 0.0f;
      float g = 0.0f;
      switch (spec_.loss) {
        case LossKind::kMse:
          loss = d * d;
          g = 2.0f * d;
          break;
        case LossKind::kL1:
          loss = std::fabs(d);
          g = d > 0 ? 1.0f : (d < 0 ? -1.0f : 0.0f);
          break;
        case LossKind::kHuber:
          if (std::fabs(d) < delta) {
            loss = 0.5f * d * d;
            g = d;
          } else {
            loss = delta * (std::fabs(d) - 0.5f * delta);
            g = d > 0 ? delta : -delta;
          }
          break;
        case LossKind::kBceWithLogits: {
          // max(o, 0) - o t + log(1 + exp(-|o|)): stable for large |o|.
          loss = std::max(o, 0.0f) - o * t + std::log1p(std::exp(-std::fabs(o)));
          g = 1.0f / (1.0f + std::exp(-o)) - t;
          break;
        }
        default:
          break;
      }
      total += loss;
      if (gradient) grad[i] = static_cast<float>(g * inv);
    }
    return static_cast<float>(total * inv);
  }

  // From d(loss)/d(output) in grad_a_ back to every linear layer's weight and bias gradients.
  void Backward(const float* x, int64_t n) {
    float* grad_out = grad_a_.data();
    float* grad_in = grad_b_.data();
    for (size_t i = layers_.size(); i-- > 0;) {
      FusedLayer& layer = layers_[i];
      const float* input = i == 0 ? x : activations_[i - 1].data();
      const float* output = activations_[i].data();
      ConstMatrixMap g_out(grad_out, n, layer.out);
      MatrixMap g_in(grad_in, n, layer.in);
      const bool needs_input_grad = i > 0;
      switch (layer.kind) {
        case LayerKind::kLinear: {
          ConstMatrixMap in(input, n, layer.in);
          ConstMatrixMap w(layer.weight.data_ptr<float>(), layer.out, layer.in);
          const bool blas = UseBlas(layer.out, layer.in, n);
          if (blas) {
            RowMajorGemm(true, false, static_cast<int>(layer.out), static_cast<int>(layer.in),
                         static_cast<int>(n), grad_out, static_cast<int>(layer.out), input,
                         static_cast<int>(layer.in), layer.weight_grad.data(),
                         static_cast<int>(layer.in));
          } else {
            layer.weight_grad.noalias() = g_out.transpose() * in;
          }
          layer.bias_grad = g_out.colwise().sum().transpose();
          if (needs_input_grad && blas) {
            RowMajorGemm(false, false, static_cast<int>(n), static_cast<int>(layer.in),
                         static_cast<int>(layer.out), grad_out, static_cast<int>(layer.out),
                         layer.weight.data_ptr<float>(), static_cast<int>(layer.in), grad_in,
                         static_cast<int>(layer.in));
          } else if (needs_input_grad) {
            g_in.noalias() = g_out * w;
          }
          break;
        }
        case LayerKind::kRelu:
          if (needs_input_grad) {
            ConstMatrixMap out(output, n, layer.out);
            g_in = (out.array() > 0.0f).select(g_out.array(), 0.0f).matrix();
          }
          break;
        case LayerKind::kTanh:
          if (needs_input_grad) {
            ConstMatrixMap out(output, n, layer.out);
            g_in = (g_out.array() * (1.0f - out.array().square())).matrix();
          }
          break;
        case LayerKind::kSigmoid:
          if (needs_input_grad) {
            ConstMatrixMap out(output, n, layer.out);
            g_in = (g_out.array() * out.array() * (1.0f - out.array())).matrix();
          }
          break;
        case LayerKind::kGelu:
          if (needs_input_grad) {
            const int64_t size = n * layer.in;
            for (int64_t k = 0; k < size; ++k) {
              const double v = input[k];
              const double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
              const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
              grad_in[k] = static_cast<float>(grad_out[k] * (cdf + v * pdf));
            }
          }
          break;
        default:
          break;
      }
      std::swap(grad_out, grad_in);
    }
  }

  // Scales the gradients so that their global L2 norm is at most spec_.clip_grad_norm.
  void ClipGradients() {
    double squares = 0.0;
    for (const FusedParameter& p : parameters_) {
      squares += static_cast<double>(ConstArrayMap(p.grad, p.size).square().sum());
    }
    const double coefficient = spec_.clip_grad_norm / (std::sqrt(squares) + kClipEpsilon);
    if (coefficient >= 1.0) return;
    for (FusedParameter& p : parameters_) {
      ArrayMap(p.grad, p.size) *= static_cast<float>(coefficient);
    }
  }

  // The optimizer's state tensors for each parameter, created as LibTorch's optimizers create
  // them at their first step, so that a checkpoint holds the same objects whichever path wrote
  // it. Called at construction and after a checkpoint replaced them.
  void BindOptimizerState() {
    auto& states = optimizer_->state();
    state_a_.clear();
    state_b_.clear();
    steps_.clear();
    for (FusedParameter& p : parameters_) {
      p.value = p.tensor.data_ptr<float>();  // loading a checkpoint may have replaced storage
      void* key = p.tensor.unsafeGetTensorImpl();
      auto found = states.find(key);
      const auto zeros = [&] { return torch::zeros_like(p.tensor); };
      switch (spec_.optimizer) {
        case OptimizerKind::kSgd: {
          torch::Tensor buffer;
          if (spec_.momentum > 0) {
            if (found == states.end()) {
              auto state = std::make_unique<torch::optim::SGDParamState>();
              state->momentum_buffer(zeros());
              found = states.emplace(key, std::move(state)).first;
            }
            buffer = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
          }
          state_a_.push_back(buffer);
          break;
        }
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
          const bool adam = spec_.optimizer == OptimizerKind::kAdam;
          if (found == states.end()) {
            std::unique_ptr<torch::optim::OptimizerParamState> created;
            if (adam) {
              auto state = std::make_unique<torch::optim::AdamParamState>();
              state->exp_avg(zeros());
              state->exp_avg_sq(zeros());
              created = std::move(state);
            } else {
              auto state = std::make_unique<torch::optim::AdamWParamState>();
              state->exp_avg(zeros());
              state->exp_avg_sq(zeros());
              created = std::move(state);
            }
            found = states.emplace(key, std::move(created)).first;
          }
          if (adam) {
            auto& state = static_cast<torch::optim::AdamParamState&>(*found->second);
            state_a_.push_back(state.exp_avg());
            state_b_.push_back(state.exp_avg_sq());
          } else {
            auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
            state_a_.push_back(state.exp_avg());
            state_b_.push_back(state.exp_avg_sq());
          }
          steps_.push_back(found->second.get());
          break;
        }
        case OptimizerKind::kRmsprop: {
          if (found == states.end()) {
            auto state = std::make_unique<torch::optim::RMSpropParamState>();
            state->square_avg(zeros());
            if (spec_.momentum > 0) state->momentum_buffer(zeros());
            found = states.emplace(key, std::move(state)).first;
          }
          auto& state = static_cast<torch::optim::RMSpropParamState&>(*found->second);
          state_a_.push_back(state.square_avg());
          state_b_.push_back(state.momentum_buffer());
          steps_.push_back(found->second.get());
          break;
        }
        case OptimizerKind::kNAdam:
        case OptimizerKind::kRAdam:
        case OptimizerKind::kAdagrad:
          break;  // not on this path (FusedPathUnsupported)
      }
    }
  }

  // The step count of parameter `i`'s state, advanced by one; as LibTorch's optimizers do.
  int64_t NextStep(size_t i) {
    torch::optim::OptimizerParamState* state = steps_[i];
    switch (spec_.optimizer) {
      case OptimizerKind::kAdam: {
        auto* s = static_cast<torch::optim::AdamParamState*>(state);
        s->step(s->step() + 1);
        return s->step();
      }
      case OptimizerKind::kAdamW: {
        auto* s = static_cast<torch::optim::AdamWParamState*>(state);
        s->step(s->step() + 1);
        return s->step();
      }
      case OptimizerKind::kRmsprop: {
        auto* s = static_cast<torch::optim::RMSpropParamState*>(state);
        s->step(s->step() + 1);
        return s->step();
      }
      case OptimizerKind::kSgd:
        break;
      case OptimizerKind::kNAdam:
      case OptimizerKind::kRAdam:
      case OptimizerKind::kAdagrad:
        break;  // not on this path (FusedPathUnsupported)
    }
    return 0;
  }

  // One optimizer step over every parameter, with the arithmetic of LibTorch's C++ optimizers
  // (torch/csrc/api/src/optim), in float32 as they compute it.
  void Update() {
    const float lr = static_cast<float>(learning_rate_);
    const double weight_decay =
        spec_.weight_decay.value_or(spec_.optimizer == OptimizerKind::kAdamW ? 0.01 : 0.0);
    const float wd = static_cast<float>(weight_decay);
    for (size_t i = 0; i < parameters_.size(); ++i) {
      FusedParameter& p = parameters_[i];
      ArrayMap value(p.value, p.size);
      ArrayMap grad(p.grad, p.size);
      switch (spec_.optimizer) {
        case OptimizerKind::kSgd: {
          const float momentum = static_cast<float>(spec_.momentum);
          if (wd != 0) grad += wd * value;
          if (momentum != 0) {
            ArrayMap buffer(state_a_[i].data_ptr<float>(), p.size);
            buffer = momentum * buffer + grad;  // dampening 0; a new buffer is the gradient
            if (spec_.nesterov) {
              grad += momentum * buffer;
            } else {
              grad = buffer;
            }
          }
          value -= lr * grad;
          break;
        }
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
          const double beta1 = spec_.beta1.value_or(0.9);
          const double beta2 = spec_.beta2.value_or(0.999);
          const float eps = static_cast<float>(spec_.eps.value_or(1e-8));
          if (spec_.optimizer == OptimizerKind::kAdamW) {
            if (wd != 0) value *= static_cast<float>(1.0 - learning_rate_ * weight_decay);
          } else if (wd != 0) {
            grad += wd * value;
          }
          const int64_t step = NextStep(i);
          const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
          const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
          ArrayMap exp_avg(state_a_[i].data_ptr<float>(), p.size);
          ArrayMap exp_avg_sq(state_b_[i].data_ptr<float>(), p.size);
          exp_avg = static_cast<float>(beta1) * exp_avg + static_cast<float>(1.0 - beta1) * grad;
          exp_avg_sq = static_cast<float>(beta2) * exp_avg_sq +
                       static_cast<float>(1.0 - beta2) * grad.square();
          const float sqrt_bias2 = static_cast<float>(std::sqrt(bias2));
          const float step_size = static_cast<float>(learning_rate_ / bias1);
          value -= step_size * exp_avg / (exp_avg_sq.sqrt() / sqrt_bias2 + eps);
          break;
        }
        case OptimizerKind::kRmsprop: {
          const float alpha = static_cast<float>(spec_.alpha.value_or(0.99));
          const float eps = static_cast<float>(spec_.eps.value_or(1e-8));
          const float momentum = static_cast<float>(spec_.momentum);
          NextStep(i);
          if (wd != 0) grad += wd * value;
          ArrayMap square_avg(state_a_[i].data_ptr<float>(), p.size);
          square_avg = alpha * square_avg + (1.0f - alpha) * grad.square();
          if (momentum > 0) {
            ArrayMap buffer(state_b_[i].data_ptr<float>(), p.size);
            buffer = momentum * buffer + grad / (square_avg.sqrt() + eps);
            value -= lr * buffer;
          } else {
            value -= lr * grad / (square_avg.sqrt() + eps);
          }
          break;
        }
        case OptimizerKind::kNAdam:
        case OptimizerKind::kRAdam:
        case OptimizerKind::kAdagrad:
          break;  // not on this path (FusedPathUnsupported)
      }
    }
  }

  const JobSpec spec_;
  const ModelSpec model_spec_;
  const std::vector<int64_t> feature_shape_;
  torch::nn::Sequential sequential_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  double learning_rate_ = 0.0;
  bool classification_ = false;
  std::vector<FusedLayer> layers_;
  std::vector<FusedParameter> parameters_;
  std::vector<torch::Tensor> state_a_;  // momentum buffer, exp_avg or square_avg, per parameter
  std::vector<torch::Tensor> state_b_;  // exp_avg_sq or rmsprop's momentum buffer
  std::vector<torch::optim::OptimizerParamState*> steps_;  // adam, adamw, rmsprop: step counts
  int64_t outputs_ = 0;
  int64_t max_width_ = 0;
  int64_t capacity_ = 0;
  std::vector<RowMatrix> activations_;  // each layer's output, rows = capacity_
  RowMatrix grad_a_;                    // gradients flowing back, ping-pong
  RowMatrix grad_b_;
  double epoch_loss_ = 0.0;
  double val_loss_ = 0.0;
  int64_t val_correct_count_ = 0;
  mutable torch::Tensor loss_sum_;
  torch::Tensor val_loss_sum_;
  torch::Tensor val_correct_;
};

}  // namespace

std::string FusedPathUnsupported(const JobSpec& spec, const ModelSpec& model,
                                 const std::vector<int64_t>& feature_shape, bool torchscript,
                                 const torch::Device& device) {
  if (torchscript) return "a submitted module (TorchScript or exported program) runs on LibTorch";
  if (!device.is_cpu()) {
    return absl::StrCat("the fused path runs on the CPU only so far, not on ", device.str());
  }
  if (spec.precision != Precision::kFp32) return "mixed precision runs on LibTorch's autocast";
  if (std::string why = HandWrittenOptimizerUnsupported(spec); !why.empty()) return why;
  if (feature_shape.size() != 1) {
    return absl::StrCat("features shaped [", absl::StrJoin(feature_shape, ", "),
                        "] per row; the fused path takes flat feature vectors");
  }
  if (feature_shape[0] > kFusedMaxWidth) {
    return absl::StrCat(feature_shape[0], " features; the fused path takes up to ", kFusedMaxWidth);
  }
  bool has_linear = false;
  for (const LayerSpec& layer : model.layers) {
    if (layer.kind == LayerKind::kLinear) {
      has_linear = true;
      if (layer.args.empty() || layer.args[0] > kFusedMaxWidth) {
        return absl::StrCat("layer ", layer.ToString(), " is wider than the fused path's ",
                            kFusedMaxWidth);
      }
    } else if (!IsActivation(layer.kind)) {
      return absl::StrCat("layer ", layer.ToString(), " has no fused kernel");
    }
  }
  if (!has_linear) return "the model has no linear layer";
  if (spec.loss == LossKind::kNll) return "loss nll has no fused kernel";
  if (!spec.class_weights.empty()) return "class_weights have no fused kernel";
  if (spec.ignore_index.has_value()) return "ignore_index has no fused kernel";
  if (!spec.pos_weight.empty()) return "pos_weight has no fused kernel";
  if (spec.gradient_accumulation_steps > 1) {
    return "gradient accumulation runs on LibTorch's autograd (the fused step updates per batch)";
  }
  return "";
}

std::string FusedPathSlower(const ModelSpec& model, const std::vector<int64_t>& feature_shape,
                            int64_t batch) {
  const double flops = common::TrainingFlopsPerStep(model, feature_shape, batch);
  if (!(flops > kFusedMaxFlopsPerStep)) return "";
  return absl::StrFormat(
      "%.1f MFLOPs a step, above the fused path's limit of %.0f: LibTorch's vectorised "
      "operators are as fast there",
      flops / 1e6, kFusedMaxFlopsPerStep / 1e6);
}

std::unique_ptr<TrainingPath> MakeFusedCpuPath(const TrainingRun& run, at::Generator gen) {
  return std::make_unique<FusedCpuPath>(run, std::move(gen));
}

}  // namespace trainerd::engine
