#include "common/flops.h"

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_spec.h"

namespace trainerd::common {
namespace {

// The backward pass costs about twice the forward (gradients for inputs and for weights).
constexpr double kTrainingToForwardRatio = 3.0;

// FLOPs per element of the element-wise layers. They are rough, and deliberately so: next to a
// linear or conv2d layer they are a rounding error; they matter only for a model made of nothing
// else, where the step is launch-bound anyway.
constexpr double kReluFlopsPerElement = 1.0;     // a compare (max(x, 0))
constexpr double kGeluFlopsPerElement = 8.0;     // erf (a short polynomial), multiplies, an add
constexpr double kTanhFlopsPerElement = 4.0;     // exp-based, counted as a few operations
constexpr double kSigmoidFlopsPerElement = 4.0;  // exp, add, divide
// Softmax and log-softmax: max, subtract, exp, sum, divide (or log and subtract).
constexpr double kSoftmaxFlopsPerElement = 5.0;
// Batch and layer norm in training: mean and variance (2 adds, a multiply), subtract, divide,
// scale and shift.
constexpr double kNormFlopsPerElement = 6.0;
// Max and average pools: one compare or add per element of each window.
constexpr double kPoolFlopsPerWindowElement = 1.0;

double Elements(const std::vector<int64_t>& shape) {
  double n = 1.0;
  for (const int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

double LayerForwardFlops(const LayerSpec& layer, const std::vector<int64_t>& in,
                         const std::vector<int64_t>& out) {
  switch (layer.kind) {
    case LayerKind::kLinear: {
      // [..., F] -> [..., N]: one F x N product per leading position.
      if (in.empty() || out.empty()) return 0.0;
      const double features = static_cast<double>(in.back());
      const double outputs = Elements(out);  // leading positions x N
      return 2.0 * features * outputs;
    }
    case LayerKind::kConv2d: {
      // [C_in, H, W] -> [C, H_out, W_out]: each output value is a C_in x K x K dot product.
      if (in.empty() || layer.args.size() < 2) return 0.0;
      const double c_in = static_cast<double>(in.front());
      const double k = static_cast<double>(layer.args[1]);
      return 2.0 * c_in * k * k * Elements(out);
    }
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      if (layer.args.empty()) return 0.0;
      const double k = static_cast<double>(layer.args[0]);
      return kPoolFlopsPerWindowElement * k * k * Elements(out);
    }
    case LayerKind::kRelu:
      return kReluFlopsPerElement * Elements(out);
    case LayerKind::kGelu:
      return kGeluFlopsPerElement * Elements(out);
    case LayerKind::kTanh:
      return kTanhFlopsPerElement * Elements(out);
    case LayerKind::kSigmoid:
      return kSigmoidFlopsPerElement * Elements(out);
    case LayerKind::kSoftmax:
    case LayerKind::kLogSoftmax:
      return kSoftmaxFlopsPerElement * Elements(out);
    case LayerKind::kBatchNorm:
    case LayerKind::kLayerNorm:
      return kNormFlopsPerElement * Elements(out);
    case LayerKind::kFlatten:
    case LayerKind::kDropout:
      return 0.0;
  }
  return 0.0;
}

}  // namespace

double ForwardFlopsPerRow(const ModelSpec& spec, const std::vector<int64_t>& feature_shape) {
  const absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      InferLayerShapes(spec, feature_shape);
  if (!shapes.ok() || shapes->size() != spec.layers.size() + 1) return 0.0;
  double flops = 0.0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    flops += LayerForwardFlops(spec.layers[i], (*shapes)[i], (*shapes)[i + 1]);
  }
  return flops;
}

double TrainingFlopsPerStep(const ModelSpec& spec, const std::vector<int64_t>& feature_shape,
                            int64_t batch) {
  if (batch <= 0) return 0.0;
  return kTrainingToForwardRatio * ForwardFlopsPerRow(spec, feature_shape) *
         static_cast<double>(batch);
}

}  // namespace trainerd::common
